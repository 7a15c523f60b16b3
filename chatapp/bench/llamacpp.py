"""The CPU speed peer: llama.cpp's `llama-bench` on the same GGUF, threads and contexts.

The binary is never built here: its path comes from `--llama-bench PATH` or the environment
variable NANOCHAT_LLAMA_BENCH (the workplace builds it with shared/peers/llama-bench.sh). With
none, or one that fails, the peer is reported as skipped and our own figures still stand.

Two invocations, so no time goes on a prefill test at depth that nothing compares against:
`-p PP -n TG -d 0` (prefill ppPP and decode tgTG from an empty context) and `-p 0 -n TG -d DEPTH`
(decode tgTG after DEPTH tokens are already in the context). Each prints a JSON array, one
object per test, with the mean and standard deviation of its tokens/s over the repetitions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from chatapp.bench.footprint import run_measured

ENV = "NANOCHAT_LLAMA_BENCH"


def peer_env() -> dict:
    """The environment llama-bench runs in: ours, less the OMP_WAIT_POLICY=PASSIVE that
    model/__init__.py sets for our own OpenMP threads (llama.cpp's OpenMP threads would inherit
    it and stop spinning, which is not how its users run it); a value the user set stays."""
    import model

    env = dict(os.environ)
    if model.OMP_WAIT_POLICY_DEFAULTED:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def find_binary(flag: str | None) -> tuple[str | None, str]:
    """(path, why not): the flag wins over the environment variable."""
    path = flag or os.environ.get(ENV)
    if not path:
        return None, f"no llama-bench given (--llama-bench PATH or ${ENV})"
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        return None, f"{path} is not an executable file"
    return path, ""


def parse_tests(text: str) -> list[dict]:
    """llama-bench's `-o json` output -> one row per test: kind ("pp" or "tg"), tokens, depth,
    tok_s and stddev_tok_s, threads, and what it ran on."""
    start = text.find("[")  # anything a build prints before the array is not ours to parse
    if start < 0:
        raise ValueError("no JSON array in llama-bench's output")
    rows = []
    for t in json.loads(text[start:]):
        n_prompt, n_gen = int(t.get("n_prompt", 0)), int(t.get("n_gen", 0))
        if n_prompt and n_gen:
            kind, tokens = "pg", n_prompt + n_gen
        else:
            kind, tokens = ("pp", n_prompt) if n_prompt else ("tg", n_gen)
        rows.append({"test": f"{kind}{tokens}", "kind": kind, "tokens": tokens, "depth": int(t.get("n_depth", 0)),
                     "tok_s": float(t["avg_ts"]), "stddev_tok_s": float(t.get("stddev_ts", 0.0)),
                     "threads": t.get("n_threads"), "reps": len(t.get("samples_ts") or []) or None,
                     "model_type": t.get("model_type"), "model_size": t.get("model_size"),
                     "backends": t.get("backends"), "build": t.get("build_commit")})
    return rows


def pick(rows: list[dict], kind: str, tokens: int, depth: int) -> dict | None:
    return next((r for r in rows if (r["kind"], r["tokens"], r["depth"]) == (kind, tokens, depth)), None)


def run_peer(binary: str, gguf: str, threads: int, pp: int | str, tg: int, depth: int, reps: int,
             timeout: float = 900, extra: tuple[str, ...] | list[str] = ()) -> dict:
    """Both invocations; {"tests": [...], "peak_rss_bytes", "commands"} or {"skipped": why}.
    `pp` may list several prompt sizes ("512,8192"); `extra`: more flags (on the GPU: -ngl 99 -fa 1)."""
    base = [binary, "-m", gguf, "-t", str(threads), "-r", str(reps), "-o", "json", *extra]
    runs = [[*base, "-p", str(pp), "-n", str(tg), "-d", "0"], [*base, "-p", "0", "-n", str(tg), "-d", str(depth)]]
    tests, peak, seconds = [], None, 0.0
    for cmd in runs:
        r = run_measured(cmd, timeout, env=peer_env())
        if r["rc"] != 0:
            tail = (r["stderr"].strip().splitlines() or [f"exit code {r['rc']}"])[-1]
            why = "timed out" if r["timed_out"] else tail
            return {"skipped": f"llama-bench failed: {why}"[:300], "commands": [" ".join(c) for c in runs]}
        try:
            tests += parse_tests(r["stdout"])
        except (ValueError, KeyError, TypeError) as e:
            return {"skipped": f"llama-bench's output did not parse: {e}"[:300]}
        peak = max((v for v in (peak, r["peak_rss_bytes"]) if v is not None), default=None)  # None: no /proc
        seconds += r["seconds"]
    return {"tests": tests, "peak_rss_bytes": peak, "seconds": seconds, "commands": [" ".join(c) for c in runs]}


def print_peer_note(note: str, peer: dict, skipped: str, commands: bool = False) -> None:
    """The lines under a peer table's title: the run's note, then llama.cpp's model, backends and
    build (and, with `commands`, the commands it ran), or why it was skipped."""
    if note:
        print(f"note: {note}")
    if "skipped" in peer:
        print(f"{skipped}: {peer['skipped']}")
        return
    first = peer["tests"][0] if peer["tests"] else {}
    line = f"llama.cpp: {first.get('model_type')} on {first.get('backends')}, build {first.get('build')}"
    print(line + ("; " + " && ".join(peer.get("commands", [])) if commands else ""))
