"""Decode cost in CPU time a token, ours against llama.cpp, one thread each, alternating.

`python -m chatapp.bench.cputime FILE.gguf [--depth 0,1500] [--tokens 32] [--rounds 3]`

On a machine other programs keep busy, wall-clock tok/s measures the scheduler more than the
engines (llama.cpp's spinning threads collapse under load, which flatters any ratio taken
against it). CPU time a token on one thread does not move with the load much: the time a
thread is not running is not counted, so this compares what each engine's decode costs.

- ours: the CPU step (the app's Generator: a feed and a greedy sample a token) on one thread,
  `time.process_time` around `--tokens` tokens after a prompt of `depth` tokens (at least 8);
- llama.cpp: llama-bench `-t 1 -p 0 -n N -d depth -r 1`, run for N = tokens and N = 3 x tokens;
  the difference of the child's user + system CPU time over the extra tokens is a token's cost,
  with loading, warm-up and the depth's prefill cancelled out.

It prints one row per depth and round, then the medians and the ratio llama.cpp / ours (above
1: ours costs less CPU a token).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import time

import torch

from chatapp.bench.llamacpp import find_binary, peer_env
from model.decode.generate import Generator
from model.decode.sampling import SamplingConfig
from model.loading import LoadOptions
from model.loading.dispatch import LoadedModel, load_model


def ours_ms(gen: Generator, depth: int, tokens: int) -> float:
    """CPU ms a decode token of ours costs after `depth` tokens of context."""
    gen.cache.reset()
    gen.forget()
    gen.prefill([100 + i % 1000 for i in range(max(depth, 8))])
    gen.configure(SamplingConfig(temperature=0.0))
    token = gen.sample()
    t = time.process_time()
    for _ in range(tokens):
        gen.feed(token)
        token = gen.sample()
    return (time.process_time() - t) / tokens * 1e3


def _child_cpu(cmd: list[str]) -> float:
    """User + system CPU seconds of one run of `cmd` (getrusage: microseconds, where os.times
    counts clock ticks of 10 ms)."""
    def used() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    before = used()
    subprocess.run(cmd, check=True, capture_output=True, env=peer_env())
    return used() - before


def llama_ms(binary: str, gguf: str, depth: int, tokens: int) -> float:
    """CPU ms a decode token of llama.cpp costs on one thread after `depth` tokens."""
    def run(n: int) -> float:
        return _child_cpu([binary, "-m", gguf, "-t", "1", "-p", "0", "-n", str(n), "-d", str(depth), "-r", "1",
                           "-o", "json"])
    return (run(3 * tokens) - run(tokens)) / (2 * tokens) * 1e3


def parser(doc: str) -> argparse.ArgumentParser:
    """The CPU-time benches' shared flags: the GGUF, the rounds and the llama-bench binary."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-bench", default=None, help="the binary (else $NANOCHAT_LLAMA_BENCH)")
    return ap


def one_thread_model(gguf: str) -> LoadedModel:
    """The GGUF on the quantized CPU path, torch on one thread (both engines get one)."""
    torch.set_num_threads(1)
    return load_model(gguf, LoadOptions(quantized=True))


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--depth", default="0,1500", help="comma-separated context depths")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    binary, why = find_binary(args.llama_bench)
    lm = one_thread_model(args.gguf)
    depths = [int(d) for d in args.depth.split(",")]
    gen = Generator(lm.model, lm.model.new_cache(max(depths) + 3 * args.tokens + 16), lm.tokenizer.vocab_size)
    if gen.cpu_step is None:
        raise SystemExit(f"{args.gguf}: not on the CPU step")
    results: dict[int, tuple[list[float], list[float]]] = {d: ([], []) for d in depths}
    for r in range(args.rounds):
        for d in depths:
            o = ours_ms(gen, d, args.tokens)
            p = llama_ms(binary, args.gguf, d, args.tokens) if binary else float("nan")
            results[d][0].append(o)
            results[d][1].append(p)
            print(f"round {r + 1} depth {d}: ours {o:.2f} ms, llama.cpp {p:.2f} ms CPU a token", flush=True)
    if not binary:
        print(f"llama.cpp skipped: {why}")
    for d, (o, p) in results.items():
        mo, mp = statistics.median(o), statistics.median(p)
        print(f"depth {d}: ours {mo:.2f} ms ({1e3 / mo:.1f} tok/s of one core), llama.cpp {mp:.2f} ms "
              f"({1e3 / mp:.1f}), llama.cpp / ours {mp / mo:.2f}x")


if __name__ == "__main__":
    main()
