"""Same-run A/B of the CUDA prefill engines (issue 23): `python -m chatapp.bench.prefill_ab [SPEC ...]`.

Per model: prompt tok/s at 512 and 8,192 tokens for the eager forward in 512-token chunks (the
engine before), the eager forward in one 8,192-token chunk, captured graphs with the largest
bucket at 512, 2,048 and as memory allows, of the model's own modules ("graphs-modules") and of
the fused step (the default); the TTFT of a 100-token turn after 4,000 tokens (eager 512-chunks,
graphs of modules and the default); decode tok/s at 512 with the default engine; and one chunk's
measured activation bytes a token against the bound `activation_bytes_per_token` that sizes
chunks. Prints a table; the JSON line last.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from chatapp.bench.decode import decode_at
from chatapp.bench.gpu import prefill_seconds, random_ids, turn_ttft_ms
from model.decode.generate import Generator
from model.decode.graph_config import GraphConfig
from model.decode.prefill_graphs import activation_bytes_per_token, chunk_tokens
from model.loading import LoadOptions, load_model

SPECS = ["random:smollm2-135m", "random:gemma3-270m", "random:llama3.2-1b"]


def rate(gen: Generator, n: int, reps: int = 3) -> float:
    ids = random_ids(n, gen.vocab_size, n)
    prefill_seconds(gen, ids)
    return n / statistics.median(prefill_seconds(gen, ids) for _ in range(reps))


def measured_bytes_per_token(lm, cache, n: int = 4096) -> float:
    cache.reset()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        lm.model(torch.tensor([random_ids(n, lm.tokenizer.vocab_size, 9)], device="cuda"), cache, last=True)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / n


def one(spec: str) -> dict:
    lm = load_model(spec, LoadOptions(device="cuda", dtype=torch.bfloat16))
    cache = lm.model.new_cache(min(lm.context_length, 8192 + 300))
    v = lm.tokenizer.vocab_size
    row: dict = {"spec": spec, "chunk_tokens": chunk_tokens(lm.model, cache.device),
                 "bound_bytes_per_token": activation_bytes_per_token(lm.model),
                 "measured_bytes_per_token": measured_bytes_per_token(lm, cache)}
    engines = {"eager512": dict(prefill_chunk=512, graphs=GraphConfig(prefill=False)),
               "eager-8192": dict(prefill_chunk=8192, graphs=GraphConfig(prefill=False))}
    engines.update({f"graphs<={b}": dict(graphs=GraphConfig(prefill_bucket=b)) for b in (512, 2048)})
    engines["graphs-modules"] = dict(graphs=GraphConfig(prefill_fused=False))  # the default before the fused step
    engines["graphs"] = dict(graphs=GraphConfig())
    for name, kw in engines.items():
        cache.reset()  # a decode graph cannot be captured over a full cache
        gen = Generator(lm.model, cache, v, **kw)
        row[name] = {f"pp{n}": rate(gen, n) for n in (512, 8192)}
        if name in ("eager512", "graphs-modules", "graphs"):
            row[name]["turn_ttft_ms"] = turn_ttft_ms(gen, 7)["ttft_ms"]
        if name == "graphs":
            row[name]["decode512_tok_s"] = decode_at(gen, 512, 128)["tok_s"]
            row[name]["max_bucket"] = gen.prefill_graphs.max_bucket
        row[name]["backend"] = lm.model.attn.name
        del gen
        torch.cuda.empty_cache()
        print(spec, name, row[name], flush=True)
    return row


def main(specs: list[str]) -> None:
    rows = [one(s) for s in specs]
    for r in rows:
        print(f"\n{r['spec']}: chunk {r['chunk_tokens']} tokens; activations {r['measured_bytes_per_token']:,.0f} "
              f"B/token measured, bound {r['bound_bytes_per_token']:,}")
        for k, v in r.items():
            if isinstance(v, dict):
                print(f"  {k:14} pp512 {v['pp512']:>10,.0f}  pp8192 {v['pp8192']:>10,.0f}"
                      + (f"  turn TTFT {v['turn_ttft_ms']:.2f} ms" if "turn_ttft_ms" in v else "")
                      + (f"  decode@512 {v['decode512_tok_s']:,.0f} tok/s, buckets <= {v['max_bucket']}"
                         if "max_bucket" in v else ""))
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1:] or SPECS)
