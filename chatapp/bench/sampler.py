"""Decode at the app's own sampling settings against greedy decoding, the same model in one run.

`python -m chatapp.bench.sampler [FILE.gguf ...] [--tokens 128] [--rounds 3] [--threads 2]`

Every other bench decodes greedily, as llama-bench does, but a chat samples: at the default
settings (temperature 0.2, top_p 0.9: chatapp/chat/settings.py) each token also pays for the
sampler over the whole vocabulary. This times the app's Generator (a feed and a sample a token,
what a reply does: `bench/decode.py`'s decode_at) over `--tokens` tokens after a 32-token prompt,
greedy and at the defaults in alternating rounds, and reports the share of greedy speed the
defaults keep. Then `sample_token` alone on random logits of each family's vocabulary size. A
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from chatapp.bench.decode import decode_at
from chatapp.bench.models import default_model_path
from chatapp.chat.settings import Settings
from model.decode.generate import Generator
from model.decode.sampling import SamplingConfig, sample_token
from model.loading import LoadOptions, load_model

DEFAULTS = SamplingConfig(**Settings().sampler_values())
SEEDED = SamplingConfig(**{**DEFAULTS.__dict__, "seed": 0})
GREEDY = SamplingConfig(temperature=0.0)
VOCABS = {"SmolLM2": 49152, "Llama 3": 128256, "Qwen3": 151936, "Gemma 3": 262144}


def sampler_us(vocab: int, cfg: SamplingConfig, reps: int = 200) -> float:
    """µs a `sample_token` call takes on random logits with a clear favourite, as a chat's are."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 3
    logits[:3] += torch.tensor([18.0, 16.0, 15.0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        sample_token(logits, cfg, gen)
    batches = []
    for _ in range(5):   # the median batch: a shared machine's pauses land in one or two
        t = time.perf_counter()
        for _ in range(reps // 5):
            sample_token(logits, cfg, gen)
        batches.append((time.perf_counter() - t) / (reps // 5))
    return statistics.median(batches) * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="GGUF files (default: the default model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    models = a.models or [str(default_model_path())]
    out: dict = {"bench": "sampler", "threads": a.threads, "defaults": DEFAULTS.__dict__, "models": {}}
    print(f"decode, {a.tokens} tokens, {a.threads} threads: greedy against the app's defaults "
          f"(temperature {DEFAULTS.temperature}, top_p {DEFAULTS.top_p})")
    print(f"{'model':<40} | {'greedy tok/s':>12} | {'defaults tok/s':>14} | defaults / greedy")
    for spec in models:
        lm = load_model(spec, LoadOptions(quantized=True))
        gen = Generator(lm.model, lm.model.new_cache(64 + a.tokens), lm.tokenizer.vocab_size)
        greedy, sampled = [], []
        for _ in range(a.rounds):
            greedy.append(decode_at(gen, 32, a.tokens, sampling=GREEDY)["tok_s"])
            sampled.append(decode_at(gen, 32, a.tokens, sampling=SEEDED)["tok_s"])
        g, s = statistics.median(greedy), statistics.median(sampled)
        name = spec.rsplit("/", 1)[-1]
        print(f"{name:<40} | {g:12.1f} | {s:14.1f} | {s / g:.2f}")
        out["models"][name] = {"vocab": lm.tokenizer.vocab_size, "greedy_tok_s": greedy, "defaults_tok_s": sampled,
                               "ratio": s / g}
    print(f"\nsample_token alone, µs a call ({a.threads} threads)")
    print(f"{'vocabulary':<22} | {'greedy':>8} | {'defaults':>8}")
    out["sample_token_us"] = {}
    for family, vocab in VOCABS.items():
        g, s = sampler_us(vocab, GREEDY), sampler_us(vocab, DEFAULTS)
        print(f"{family + f', {vocab:,}':<22} | {g:8.0f} | {s:8.0f}")
        out["sample_token_us"][family] = {"vocab": vocab, "greedy": g, "defaults": s}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
