"""`nanochat-tui bench --gpu-peer`: prefill and decode on CUDA against llama.cpp's CUDA build.

One run measures, per model:
- prefill tok/s of 512 and 8,192 tokens into an empty cache (median of `--peer-reps`), with our
  default engine (graphs at bucketed lengths, model/decode/prefill_graphs.py) and, as a same-run
  baseline, the eager forward in 512-token chunks (the engine before issue 23);
- the TTFT of a 100-token turn after 4,000 tokens of chat (prefill + first sample, median);
- decode tok/s at depth 0 and 8,192 (`decode_at`);
- the peak GPU memory of the 8k prefill against the cache plus twice the weights, in a process of
  its own (chatapp/bench/gpu_memory.py);
- llama.cpp's `llama-bench -ngl 99 -fa 1` on `--peer-gguf` (the same shapes: a GGUF made with
  ../shared/peers/gguf_random.py): pp512 and pp8192 at depth 0, tgTG at depth 0 and 8,192, and
  ours / llama.cpp for each.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from chatapp.bench.decode import decode_at
from chatapp.bench.gpu_memory import in_child
from chatapp.bench.llamacpp import find_binary, pick, run_peer
from chatapp.bench.profile import prefill_bucket_profile, print_prefill_profile
from model.decode.generate import Generator
from model.decode.graph_config import GraphConfig
from model.loading import LoadedModel

PP, DEPTH, TURN, HISTORY = (512, 8192), 8192, 100, 4000
TARGETS = {"pp512": 3.0, "pp8192": 3.0}   # ours / llama.cpp, at least
TTFT_TARGET_MS = 5.0                      # the SmolLM2 shape's turn TTFT, at most


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(100, min(vocab, 30000), (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill_seconds(gen: Generator, ids: list[int]) -> float:
    gen.cache.reset()
    gen.forget()
    torch.cuda.synchronize()
    t = time.perf_counter()
    gen.prefill(ids)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def prefill_rates(gen: Generator, reps: int) -> dict:
    out = {}
    for n in PP:
        ids = random_ids(n, gen.vocab_size, n)
        prefill_seconds(gen, ids)  # warm-up: captures this length's buckets, compiles kernels
        times = [prefill_seconds(gen, ids) for _ in range(reps)]
        out[f"pp{n}"] = {"tok_s": n / statistics.median(times), "samples_tok_s": [n / t for t in times]}
    return out


def turn_ttft_ms(gen: Generator, reps: int) -> dict:
    """A turn of TURN new tokens over HISTORY tokens of chat: prefill plus the first greedy sample."""
    from model.decode.sampling import SamplingConfig

    gen.configure(SamplingConfig(temperature=0.0))
    gen.cache.reset()
    gen.forget()
    gen.prefill(random_ids(HISTORY, gen.vocab_size, 1))
    turn = random_ids(TURN, gen.vocab_size, 2)
    times = []
    for _ in range(reps + 2):
        gen.cache.rewind(HISTORY)
        gen.forget()
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.prefill(turn)
        gen.sample()
        times.append(time.perf_counter() - t)
    return {"history": HISTORY, "turn": TURN, "ttft_ms": 1000 * statistics.median(times[2:]),
            "samples_ms": [1000 * t for t in times[2:]]}


def ours(lm: LoadedModel, spec: str, tg: int, reps: int) -> dict:
    cache = lm.model.new_cache(min(lm.context_length, DEPTH + tg + 64))
    v = lm.tokenizer.vocab_size
    # The memory in a process of its own (chatapp/bench/gpu_memory.py): its whole peak, load to the
    # end of the first 8k prefill, with nothing this process holds counted or released first.
    res: dict = {"memory": in_child(spec, cache.capacity, DEPTH)}
    gen = Generator(lm.model, cache, v)
    eager = Generator(lm.model, cache, v, prefill_chunk=512, graphs=GraphConfig(prefill=False))
    res["eager512"] = prefill_rates(eager, reps)
    del eager
    cache.reset()  # a decode graph cannot be captured over a full cache
    if GraphConfig().prefill_fused:  # same-run baseline: graphs of the model's own modules (the step before)
        plain = Generator(lm.model, cache, v, graphs=GraphConfig(prefill_fused=False))
        res["modules"] = prefill_rates(plain, reps)
        res["modules"]["turn_ttft_ms"] = turn_ttft_ms(plain, max(reps, 5))["ttft_ms"]
        del plain
        cache.reset()
    res["prefill"] = prefill_rates(gen, reps)
    res["turn"] = turn_ttft_ms(gen, max(reps, 5))
    if gen.prefill_graphs is not None:
        res["profile512"] = prefill_bucket_profile(gen, 512)
    deep = min(DEPTH, cache.capacity - tg - 2)  # SmolLM2's rotary table ends at 8,192
    res["decode"] = {"0": decode_at(gen, 8, tg)["tok_s"], "deep": decode_at(gen, deep, tg)["tok_s"], "deep_at": deep}
    res["engine"] = gen.graphs.name if gen.graphs else "eager"
    pg = gen.prefill_graphs
    res["prefill_engine"] = (f"graphs of the {pg.kind} step, buckets {sorted(pg.graphs)}" if pg
                             else f"eager, {gen.prefill_chunk}-token chunks")
    res["backend"] = lm.model.attn.name
    return res


def gpu_peer(lm: LoadedModel, spec: str, gguf: str | None, llama_bench: str | None, tg: int, reps: int) -> dict:
    o = ours(lm, spec, tg, reps)
    binary, why = find_binary(llama_bench)
    if binary and not gguf:
        binary, why = None, "no --peer-gguf for this model"
    extra = ["-ngl", "99", "-fa", "1"]
    threads = os.cpu_count() or 1
    peer = run_peer(binary, gguf, threads, ",".join(map(str, PP)), tg, DEPTH, reps, extra=extra) if binary \
        else {"skipped": why}
    return compare(o, peer, tg, reps, gguf)


def compare(o: dict, peer: dict, tg: int, reps: int, gguf: str | None) -> dict:
    """Our figures beside llama.cpp's, and ours / llama.cpp for each test (None: not measured)."""
    tests = peer.get("tests", [])
    rows = {f"pp{n}": (o["prefill"][f"pp{n}"]["tok_s"], pick(tests, "pp", n, 0)) for n in PP}
    rows["tg_d0"] = (o["decode"]["0"], pick(tests, "tg", tg, 0))
    rows[f"tg_d{DEPTH}"] = (o["decode"]["deep"], pick(tests, "tg", tg, DEPTH))
    return {"tg": tg, "reps": reps, "gguf": gguf or "", "ours": o, "llama_cpp": peer,
            "llama_cpp_tok_s": {k: r["tok_s"] if r else None for k, (_, r) in rows.items()},
            "ratios": {k: (ours_v / r["tok_s"] if r else None) for k, (ours_v, r) in rows.items()}}


def _f(v, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_gpu_peer(model: str, note: str, res: dict) -> None:
    o, peer, tg = res["ours"], res["llama_cpp"], res["tg"]
    print(f"\n== GPU peer: {model}; decode {o['engine']}, prefill {o['prefill_engine']}, attention {o['backend']} ==")
    if note:
        print(f"note: {note}")
    if "skipped" in peer:
        print(f"llama.cpp skipped: {peer['skipped']}")
    else:
        first = peer["tests"][0] if peer["tests"] else {}
        print(f"llama.cpp: {first.get('model_type')} on {first.get('backends')}, build {first.get('build')}; "
              + " && ".join(peer.get("commands", [])))
    lc, ratio = res["llama_cpp_tok_s"], res["ratios"]
    mod = o.get("modules", {})
    lines = [("tok/s", "ours", "ours, graphs of modules", "ours, eager 512-chunks", "llama.cpp", "ours/llama.cpp",
              "target")]
    for n in PP:
        k = f"pp{n}"
        lines.append((f"prefill {k}", _f(o["prefill"][k]["tok_s"]), _f(mod.get(k, {}).get("tok_s")),
                      _f(o["eager512"][k]["tok_s"]), _f(lc[k]), _f(ratio[k], "{:.2f}x"), f">= {TARGETS[k]:.0f}x"))
    for k, key, d in (("tg_d0", "0", "0"), (f"tg_d{DEPTH}", "deep", f"{DEPTH} (ours {o['decode']['deep_at']})")):
        lines.append((f"decode tg{tg} at depth {d}", _f(o["decode"][key]), "-", "-", _f(lc[k]),
                      _f(ratio[k], "{:.2f}x"), ""))
    widths = [max(len(r[i]) for r in lines) for i in range(7)]
    for i, r in enumerate(lines):
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            print("-|-".join("-" * w for w in widths))
    t, m = o["turn"], o["memory"]
    before = f"; graphs of modules {mod['turn_ttft_ms']:.2f} ms" if "turn_ttft_ms" in mod else ""
    print(f"turn TTFT: {t['turn']} new tokens after {t['history']} of chat: {t['ttft_ms']:.2f} ms "
          f"(median; SmolLM2-shape target <= {TTFT_TARGET_MS:.0f} ms{before})")
    if "error" in m:
        print(f"8k prefill peak GPU memory: not measured ({m['error']})")
    else:
        print(f"8k prefill peak GPU memory (a fresh process: load, Generator, first 8k prefill) "
              f"{m['peak_bytes'] / 1e6:,.0f} MB reserved ({m['peak_allocated_bytes'] / 1e6:,.0f} allocated) "
              f"<= cache + 2x weights {m['bound_bytes'] / 1e6:,.0f} MB: "
              f"{'met' if m['peak_bytes'] <= m['bound_bytes'] else 'missed'}")
    if "profile512" in o:
        print_prefill_profile(o["profile512"])
