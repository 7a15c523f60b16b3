"""`nanochat-tui bench --cpu-peer`: ours against llama.cpp on the CPU, same GGUF, threads, contexts.

One run measures, on `--threads N` for both engines:
- decode tok/s from a short prompt (llama.cpp: tgTG from an empty context) and after DEPTH
  tokens (llama.cpp: tgTG at `-d DEPTH`); prefill tok/s of PP tokens into an empty cache (ppPP);
  each as the mean and spread over `--peer-reps` repetitions, with ours / llama.cpp;
- this machine's memory read rate, and the decode ceiling it implies: rate / bytes a token
  reads (our weights as stored, through `weight_bytes_per_token`, plus K/V at that depth);
- a headless chat's resident memory after one turn at the model's default context and its
  load-to-ready time (chatapp/bench/footprint.py), and the size of what we write on disk
  (a GGUF's cached config and tokenizer; a pulled model's directory) against the GGUF's.

The targets are issue 24's (docs/benchmarks.md): the default model (SmolLM2-135M) decodes >= 1.5x
llama.cpp from empty and >= 2x at depth, every other model >= 1.3x at both; prefill >= 3x;
decode from empty reaches >= 80% of the read-rate ceiling; the default model's RSS after a turn
stays <= 392 MB (what it was when issue 24 was filed; other models' RSS is printed, not judged);
what we write on disk is <= 1.05x the GGUF.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from chatapp.bench.decode import decode_at, kv_bytes_read, read_bandwidth, weight_bytes_per_token
from chatapp.bench.footprint import dir_bytes, headless_turn
from chatapp.bench.llamacpp import find_binary, pick, print_peer_note, run_peer
from chatapp.bench.models import default_model_path
from model.decode.generate import Generator
from model.loading import LoadedModel
from model.loading.gguf_open import metadata_dir

SHORT_PROMPT = 8  # tokens in the cache before the short-context decode starts
DEFAULT_MODEL = "smollm2-135m"   # how the default model's name starts (a GGUF's file name, the pulled folder)


def is_default_model(name: str) -> bool:
    return Path(name).name.lower().startswith(DEFAULT_MODEL)


def target_table(default_model: bool) -> dict[str, tuple[str, float] | None]:
    """Issue 24's targets: ratios ours / llama.cpp and the share of the ceiling at least these, RSS
    (MB) and disk (x GGUF) at most; None: printed, not judged."""
    short, deep = (1.5, 2.0) if default_model else (1.3, 1.3)
    return {"decode_short": (">=", short), "decode_deep": (">=", deep), "prefill": (">=", 3.0),
            "ceiling": (">=", 0.8), "rss_mb": ("<=", 392.0) if default_model else None,
            "disk_ratio": ("<=", 1.05)}


def target_text(key: str, target: tuple[str, float] | None) -> str:
    """How the table prints a target: ">= 1.5x", ">= 80%", "<= 392 MB"; "-" when not judged."""
    if target is None:
        return "-"
    op, bound = target
    return f"{op} {100 * bound:.0f}%" if key == "ceiling" else f"{op} {bound:.0f} MB" if key == "rss_mb" \
        else f"{op} {bound:g}x"


def sources(spec: str, gguf: str | None) -> tuple[str, Path | None, Path | None]:
    """(model spec for a headless chat, the GGUF llama.cpp reads, what we keep on disk for it: a
    pulled model's directory, or a GGUF's cached config and tokenizer; its weights are read in place)."""
    if spec.endswith(".gguf"):
        gguf = spec
    elif spec != "default":
        path = Path(spec)
        return spec, None, path if path.is_dir() else None
    if gguf:
        return gguf, Path(gguf), metadata_dir(Path(gguf))
    pulled = default_model_path()
    return (str(pulled), None, pulled) if pulled else ("random:smollm2-135m", None, None)


def _spread(rates: list[float]) -> dict:
    return {"tok_s": statistics.mean(rates), "stddev_tok_s": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "samples_tok_s": rates}


def prefill_rate(gen: Generator, tokens: int, seed: int = 1) -> float:
    gen.cache.reset()
    gen.forget()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, min(gen.vocab_size, 30000), (tokens,), generator=g).tolist()
    t = time.perf_counter()
    gen.prefill(ids)
    return tokens / (time.perf_counter() - t)


def ours(lm: LoadedModel, pp: int, tg: int, depth: int, reps: int) -> dict:
    """Our three tests on one cache, after a short warm-up."""
    cache = lm.model.new_cache(min(lm.context_length, max(depth, pp, SHORT_PROMPT) + tg + 2))
    gen = Generator(lm.model, cache, lm.tokenizer.vocab_size)
    decode_at(gen, SHORT_PROMPT, 4)
    prefill_rate(gen, min(pp, 64))
    short = [decode_at(gen, SHORT_PROMPT, tg, seed=i)["tok_s"] for i in range(reps)]
    deep = [decode_at(gen, depth, tg, seed=i)["tok_s"] for i in range(reps)]
    prefill = [prefill_rate(gen, pp, seed=i) for i in range(reps)]
    weights = weight_bytes_per_token(lm.model)
    return {"decode_short": {"depth": 0, "prompt": SHORT_PROMPT, **_spread(short),
                             "bytes_per_token": weights + kv_bytes_read(cache, SHORT_PROMPT + tg // 2)},
            "decode_deep": {"depth": depth, **_spread(deep),
                            "bytes_per_token": weights + kv_bytes_read(cache, depth + tg // 2)},
            "prefill": {"tokens": pp, **_spread(prefill)}, "weight_bytes_per_token": weights,
            "kv_bytes_per_token": kv_bytes_read(cache, 1),
            "engine": gen.graphs.name if gen.graphs else "c-step" if gen.cpu_step else "eager",
            "backend": "qdecode.c" if gen.cpu_step else lm.model.attn.name}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cpu_peer(lm: LoadedModel, spec: str, gguf: str | None, llama_bench: str | None, threads: int,
             pp: int, tg: int, depth: int, reps: int, headless: bool = True) -> dict:
    torch.set_num_threads(threads)
    depth, pp = min(depth, lm.context_length - tg - 2), min(pp, lm.context_length - 2)
    chat_spec, gguf_path, on_disk = sources(spec, gguf)
    res: dict = {"threads": threads, "pp": pp, "tg": tg, "depth": depth, "reps": reps, "gguf": str(gguf_path or ""),
                 "default_model": is_default_model(lm.name)}
    bw = read_bandwidth()
    res["read_bandwidth_gbs"] = bw / 1e9
    res["ours"] = o = ours(lm, pp, tg, depth, reps)
    for key in ("decode_short", "decode_deep"):
        o[key]["ceiling_tok_s"] = bw / o[key]["bytes_per_token"]
    binary, why = find_binary(llama_bench)
    if binary and gguf_path is None:
        binary, why = None, f"{spec} is not from a GGUF (give --gguf FILE or a .gguf model)"
    peer = run_peer(binary, str(gguf_path), threads, pp, tg, depth, reps) if binary else {"skipped": why}
    res["llama_cpp"] = peer
    tests = peer.get("tests", [])
    rows = {"decode_short": pick(tests, "tg", tg, 0), "decode_deep": pick(tests, "tg", tg, depth),
            "prefill": pick(tests, "pp", pp, 0)}
    res["ratios"] = {k: ratio(o[k]["tok_s"], r["tok_s"] if r else None) for k, r in rows.items()}
    for k, r in rows.items():
        o[k]["llama_cpp_tok_s"] = r["tok_s"] if r else None
    if headless:
        res["headless"] = headless_turn(chat_spec, threads)
    res["disk"] = {"ours_bytes": dir_bytes(on_disk) if on_disk and on_disk.exists() else None,
                   "ours_path": str(on_disk or ""), "gguf_bytes": gguf_path.stat().st_size if gguf_path else None}
    res["disk"]["ratio"] = ratio(res["disk"]["ours_bytes"], res["disk"]["gguf_bytes"])
    res["targets"] = targets(res)
    return res


def targets(res: dict) -> dict:
    """Each target with the value it is judged on and whether it is met (None: not measured)."""
    rss, short = res.get("headless", {}).get("rss_after_turn_bytes"), res["ours"]["decode_short"]
    values = {**res["ratios"], "rss_mb": rss / 1e6 if rss else None, "disk_ratio": res["disk"]["ratio"],
              "ceiling": short["tok_s"] / short["ceiling_tok_s"] if short.get("ceiling_tok_s") else None}
    out = {}
    for key, target in target_table(res["default_model"]).items():
        v = values[key]
        if target is None:
            out[key] = {"target": None, "value": v, "met": None}
            continue
        op, bound = target
        out[key] = {"target": f"{op} {bound}", "value": v,
                    "met": None if v is None else (v >= bound if op == ">=" else v <= bound)}
    return out


def _f(v, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _x(v) -> str:
    return _f(v, "{:.2f}x")


def _mb(v) -> str:
    return _f(None if v is None else v / 1e6, "{:,.0f} MB")


def print_cpu_peer(model: str, note: str, res: dict) -> None:
    o, peer, tg, pp = res["ours"], res["llama_cpp"], res["tg"], res["pp"]
    print(f"\n== CPU peer: {model}, {res['threads']} threads, {res['reps']} reps, our engine {o['engine']} "
          f"({o['backend']}) ==")
    print_peer_note(note, peer, "peer skipped")

    def rate(r: dict) -> str:
        return f"{r['tok_s']:,.1f} ± {r['stddev_tok_s']:,.1f}"

    def peer_rate(kind: str, n: int, depth: int) -> str:
        r = pick(peer.get("tests", []), kind, n, depth)
        return rate(r) if r else "-"

    table = target_table(res["default_model"])

    def goal(key: str) -> str:
        met = res["targets"][key]["met"]
        return target_text(key, table[key]) + ("" if met is None else ": met" if met else ": missed")

    hl, disk = res.get("headless", {}), res["disk"]
    rss, peer_rss = hl.get("rss_after_turn_bytes"), peer.get("peak_rss_bytes")
    lines = [
        ("metric", "ours", "llama.cpp", "ours/llama.cpp", "target"),
        (f"decode tok/s, tg{tg} from {SHORT_PROMPT} (llama.cpp: 0)", rate(o["decode_short"]),
         peer_rate("tg", tg, 0), _x(res["ratios"]["decode_short"]), goal("decode_short")),
        (f"decode tok/s, tg{tg} at depth {res['depth']}", rate(o["decode_deep"]),
         peer_rate("tg", tg, res["depth"]), _x(res["ratios"]["decode_deep"]), goal("decode_deep")),
        (f"prefill tok/s, pp{pp}", rate(o["prefill"]), peer_rate("pp", pp, 0),
         _x(res["ratios"]["prefill"]), goal("prefill")),
        (f"RSS after one turn (ours: headless, context {hl.get('context', '-')}; llama.cpp: llama-bench peak)",
         f"{_mb(rss)} (peak {_mb(hl.get('peak_rss_bytes'))})", _mb(peer_rss), _x(ratio(rss, peer_rss)),
         goal("rss_mb")),
        ("size on disk (ours: what we write; llama.cpp: the GGUF)", _mb(disk["ours_bytes"]), _mb(disk["gguf_bytes"]),
         _x(disk["ratio"]), goal("disk_ratio")),
        ("load to ready, warm (ours: headless spawn to the ready line)", _f(hl.get("ready_s"), "{:.2f} s"), "-", "-",
         ""),
    ]
    widths = [max(len(r[i]) for r in lines) for i in range(5)]
    for i, r in enumerate(lines):
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            print("-|-".join("-" * w for w in widths))
    if "skipped" in hl:
        print(f"headless run skipped: {hl['skipped']}")
    print(f"memory read rate {res['read_bandwidth_gbs']:.1f} GB/s (torch.sum of 1 GiB, {res['threads']} threads): "
          f"our decode ceiling {o['decode_short']['ceiling_tok_s']:,.0f} tok/s short, "
          f"{o['decode_deep']['ceiling_tok_s']:,.0f} at depth {res['depth']} "
          f"({o['weight_bytes_per_token'] / 1e6:,.0f} MB of weights + {o['kv_bytes_per_token']:,} bytes of K/V "
          f"a token of context); ours reaches {_pct(o['decode_short'])} and {_pct(o['decode_deep'])} of it "
          f"(target {goal('ceiling')} short)")


def _pct(r: dict) -> str:
    return f"{100 * r['tok_s'] / r['ceiling_tok_s']:.0f}%" if r.get("ceiling_tok_s") else "-"
