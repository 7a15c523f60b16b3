"""`nanochat-tui bench --cpu-peer --busy`: ours and llama.cpp while one core is kept busy.

A laptop always runs something else. This run starts its own hog (`yes > /dev/null`, pinned to
one CPU where the OS allows) and measures, in one process:
- ours on a quiet machine (no hog) with 1 thread, before and after the busy runs (the samples of
  both together): the reference the targets divide by;
- ours under the hog with the default threads (`--threads`) and with 1 thread;
- llama.cpp's llama-bench under the same hog with `-t THREADS` (and `-t 1`), in the environment
  its users have (llamacpp.peer_env: without the OMP_WAIT_POLICY=PASSIVE we set for ourselves).
Each is decode tok/s of `--tg` tokens after a short prompt and prefill tok/s of `--pp` tokens.
Targets (issue 24): ours busy with the default threads >= 0.7x our quiet 1-thread figure, for
decode and for prefill; ours busy >= 10x llama.cpp `-t THREADS` busy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import torch

from chatapp.bench.cpu import _spread
from chatapp.bench.footprint import run_measured
from chatapp.bench.llamacpp import parse_tests, peer_env, pick

SHORT_PROMPT = 8
TARGETS = {"decode_vs_quiet_1t": 0.7, "prefill_vs_quiet_1t": 0.7, "decode_vs_llama_cpp": 10.0,
           "prefill_vs_llama_cpp": 10.0}


@contextmanager
def hog():
    """One busy core for the duration: a `yes` child writing to /dev/null (a Python loop where
    there is no `yes`), pinned to the last CPU this process may use."""
    cmd = ["yes"] if shutil.which("yes") else [sys.executable, "-c", "while True: pass"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(p.pid, {max(os.sched_getaffinity(0))})
            except OSError:
                pass
        time.sleep(0.3)   # let the scheduler place it
        yield p.pid
    finally:
        p.kill()
        p.wait()


def ours_with(lm, threads: int, pp: int, tg: int, reps: int) -> dict:
    """Our decode and prefill rates on `threads` threads (a fresh Generator: the C step takes
    its thread count when it is built)."""
    from chatapp.bench.cpu import prefill_rate
    from chatapp.bench.decode import decode_at
    from model.decode.generate import Generator

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cache = lm.model.new_cache(min(lm.context_length, max(pp, SHORT_PROMPT) + tg + 2))
        gen = Generator(lm.model, cache, lm.tokenizer.vocab_size)
        decode_at(gen, SHORT_PROMPT, 4)
        decode = [decode_at(gen, SHORT_PROMPT, tg, seed=i)["tok_s"] for i in range(reps)]
        prefill = [prefill_rate(gen, pp, seed=i) for i in range(reps)]
        return {"threads": threads, "decode": _spread(decode), "prefill": _spread(prefill)}
    finally:
        torch.set_num_threads(before)


def llama_with(binary: str, gguf: str, threads: int, pp: int, tg: int, reps: int) -> dict:
    cmd = [binary, "-m", gguf, "-t", str(threads), "-r", str(reps), "-o", "json", "-p", str(pp), "-n", str(tg)]
    r = run_measured(cmd, 1800, env=peer_env())
    if r["rc"] != 0:
        return {"threads": threads, "skipped": "llama-bench failed: " + (r["stderr"].strip().splitlines() or ["?"])[-1],
                "command": " ".join(cmd)}
    rows = parse_tests(r["stdout"])
    dec, pre = pick(rows, "tg", tg, 0), pick(rows, "pp", pp, 0)
    return {"threads": threads, "command": " ".join(cmd),
            "decode": {"tok_s": dec["tok_s"], "stddev_tok_s": dec["stddev_tok_s"]} if dec else None,
            "prefill": {"tok_s": pre["tok_s"], "stddev_tok_s": pre["stddev_tok_s"]} if pre else None}


def _rate(r: dict | None, key: str) -> float | None:
    v = (r or {}).get(key)
    return v["tok_s"] if v else None


def busy_run(lm, gguf: str | None, binary: str | None, threads: int, pp: int, tg: int, reps: int) -> dict:
    res: dict = {"threads": threads, "pp": pp, "tg": tg, "reps": reps, "hog": "yes > /dev/null, one CPU"}
    before = ours_with(lm, 1, pp, tg, reps)
    with hog():
        res["busy_default"] = ours_with(lm, threads, pp, tg, reps)
        res["busy_1t"] = ours_with(lm, 1, pp, tg, reps)
        if binary and gguf:
            res["llama_cpp_busy"] = llama_with(binary, gguf, threads, pp, tg, reps)
            res["llama_cpp_busy_1t"] = llama_with(binary, gguf, 1, pp, tg, reps) if threads != 1 else None
        else:
            res["llama_cpp_busy"] = {"skipped": "no llama-bench" if not binary else "the model is not from a GGUF"}
    # quiet again after the busy runs: the machine's other load drifts, and the reference is
    # every quiet sample, before and after
    after = ours_with(lm, 1, pp, tg, reps)
    res["quiet_1t"] = {"threads": 1, **{k: _spread(before[k]["samples_tok_s"] + after[k]["samples_tok_s"])
                                        for k in ("decode", "prefill")}}
    ours, quiet, peer = res["busy_default"], res["quiet_1t"], res["llama_cpp_busy"]
    values = {"decode_vs_quiet_1t": _ratio(_rate(ours, "decode"), _rate(quiet, "decode")),
              "prefill_vs_quiet_1t": _ratio(_rate(ours, "prefill"), _rate(quiet, "prefill")),
              "decode_vs_llama_cpp": _ratio(_rate(ours, "decode"), _rate(peer, "decode")),
              "prefill_vs_llama_cpp": _ratio(_rate(ours, "prefill"), _rate(peer, "prefill"))}
    res["targets"] = {k: {"target": f">= {TARGETS[k]}", "value": v, "met": None if v is None else v >= TARGETS[k]}
                      for k, v in values.items()}
    return res


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def print_busy(model: str, res: dict) -> None:
    print(f"\n== CPU under load: {model}, one core kept busy ({res['hog']}), {res['reps']} reps ==")

    def cell(r: dict | None, key: str) -> str:
        v = (r or {}).get(key)
        return "-" if not v else f"{v['tok_s']:,.1f} ± {v['stddev_tok_s']:,.1f}"

    rows = [("run", f"decode tok/s (tg{res['tg']})", f"prefill tok/s (pp{res['pp']})")]
    rows.append(("ours, quiet, 1 thread", cell(res["quiet_1t"], "decode"), cell(res["quiet_1t"], "prefill")))
    rows.append((f"ours, busy, {res['threads']} threads (default)", cell(res["busy_default"], "decode"),
                 cell(res["busy_default"], "prefill")))
    rows.append(("ours, busy, 1 thread", cell(res["busy_1t"], "decode"), cell(res["busy_1t"], "prefill")))
    for key, label in (("llama_cpp_busy", f"llama.cpp, busy, -t {res['threads']}"),
                       ("llama_cpp_busy_1t", "llama.cpp, busy, -t 1")):
        r = res.get(key)
        if r is not None:
            rows.append((label + (f" (skipped: {r['skipped']})" if "skipped" in r else ""), cell(r, "decode"),
                         cell(r, "prefill")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for i, r in enumerate(rows):
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            print("-|-".join("-" * w for w in widths))
    for k, t in res["targets"].items():
        v = "-" if t["value"] is None else f"{t['value']:.2f}x"
        met = "" if t["met"] is None else ": met" if t["met"] else ": missed"
        print(f"{k}: {v} (target {t['target']}x){met}")
