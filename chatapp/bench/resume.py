"""The resume benchmark: the first turn after reopening a long chat, three ways.

  never_closed: the same turn in the session that built the chat (the floor);
  snapshot:     a fresh session opens the stored chat from its KV snapshot;
  reprefill:    a fresh session opens it with no snapshot and recomputes the history.
Targets (issue 7): snapshot TTFT within 1.5x of never_closed, re-prefill at least 10x on a CPU.
`nanochat-tui bench` calls `bench_resume`; `python -m chatapp.bench.resume` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from chatapp.chat.events import TurnStats
from chatapp.chat.session import Exchange, Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore
from model.loading import LoadedModel, LoadOptions, load_model

WORDS = ("the cache keeps every token of the chat so a new turn pays only for its own words while "
         "the snapshot on disk brings that cache back after a restart").split()
QUESTION = "Now, in one sentence, what was the main point of all that?"


def filler(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n_words))


def build_chat(session: Session, chat_tokens: int) -> None:
    """A chat of about `chat_tokens` tokens, as the session would hold it after many turns.
    Built with one prefill instead of many turns: the cache state is the same, it is faster."""
    t, tokenizer = session.template, session.tokenizer
    tokens, exchanges, i = t.start(session.system), [], 0
    while len(tokens) < chat_tokens:
        user, reply = f"Part {i}: " + filler(60, i), filler(20, i + 1)
        start = len(tokens)
        tokens += t.user_turn(user)
        reply_start = len(tokens)
        tokens += tokenizer.encode(reply) + t.end_reply()
        exchanges.append(Exchange(user, start, reply_start, len(tokens), reply))
        i += 1
    session.adopt(tokens, exchanges)
    session.gen.prefill(tokens[:len(tokens) - len(t.end_reply())])  # a reply's closing tokens stay pending


def first_turn(session: Session) -> TurnStats:
    (st,) = [e for e in session.send(QUESTION) if isinstance(e, TurnStats)]
    return st


def turn_ttft(session: Session, repeats: int) -> tuple[TurnStats, float]:
    """The first turn, and the median TTFT over `repeats` runs of it (undone in between): one
    sample is at the mercy of whatever else the machine is doing."""
    first = first_turn(session)
    times = [first.ttft_ms]
    for _ in range(repeats - 1):
        list(session.undo())
        times.append(first_turn(session).ttft_ms)
    return first, statistics.median(times)


def timed_open(lm: LoadedModel, store: ChatStore, chat_id: int, context: int, settings: Settings):
    session = Session(lm, settings, context=context)
    keeper = ChatKeeper(session, store)
    keeper.fingerprint.get()  # once per loaded model, not per open: measured separately
    t0 = time.perf_counter()
    restored, _ = keeper.open(chat_id)
    return session, restored, (time.perf_counter() - t0) * 1000


def bench_resume(lm: LoadedModel | None = None, spec: str = "random:smollm2-135m", chat_tokens: int = 4096,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, max_new_tokens: int = 8,
                 repeats: int = 3) -> dict:
    """Time to first token after resuming a `chat_tokens` chat, from snapshot vs never closed vs
    re-prefill. Uses a throwaway store. Returns a dict of figures (ms, tokens, bytes, ratios);
    `ttft_ms` is the median of `repeats` runs of the first turn, `open_ms` a single open."""
    lm = lm or load_model(spec, LoadOptions(device=device, dtype=dtype))
    settings = Settings(temperature=0.0, max_new_tokens=max_new_tokens)
    context = chat_tokens + 512
    root = Path(tempfile.mkdtemp(prefix="nanochat-bench-resume-"))
    try:
        store = ChatStore(root)
        a = Session(lm, settings, context=context)
        build_chat(a, chat_tokens)
        warm = Session(lm, settings, context=256)
        first_turn(warm)  # first-call overheads (allocator, kernels) are nobody's TTFT
        del warm
        keeper = ChatKeeper(a, store)
        t0 = time.perf_counter()
        keeper.fingerprint.get()
        fingerprint_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        saved = [e for e in keeper.run_command("/save bench") if getattr(e, "event", "") == "saved"][0]
        save_ms = (time.perf_counter() - t0) * 1000
        history = a.cache.seqlen

        b, r_snap, open_snap = timed_open(lm, store, saved.chat, context, settings)
        bit_identical = torch.equal(a.cache.k_cache[:, :, :history], b.cache.k_cache[:, :, :history]) and \
            torch.equal(a.cache.v_cache[:, :, :history], b.cache.v_cache[:, :, :history])
        turn_b, ttft_b = turn_ttft(b, repeats)
        del b
        turn_a, base = turn_ttft(a, repeats)  # the chat that never closed: same state, same turn
        del a
        shutil.rmtree(store.snapshot_dir(saved.chat))
        c, r_pre, open_pre = timed_open(lm, store, saved.chat, context, settings)
        turn_c, ttft_c = turn_ttft(c, repeats)
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "model": lm.name, "device": str(next(lm.model.parameters()).device), "chat_tokens": history,
        "snapshot_bytes": saved.snapshot_bytes, "save_ms": round(save_ms, 1),
        "fingerprint_ms": round(fingerprint_ms, 1),
        "never_closed": {"ttft_ms": round(base, 1), "prefill_tokens": turn_a.prefill_tokens},
        "snapshot": {"open_ms": round(open_snap, 1), "ttft_ms": round(ttft_b, 1),
                     "prefill_tokens": turn_b.prefill_tokens, "restored_tokens": r_snap.restored_tokens,
                     "bit_identical": bit_identical, "same_reply": turn_b.reply == turn_a.reply},
        "reprefill": {"open_ms": round(open_pre, 1), "ttft_ms": round(ttft_c, 1),
                      "prefill_tokens": turn_c.prefill_tokens, "reprefilled_tokens": r_pre.reprefilled_tokens,
                      "same_reply": turn_c.reply == turn_a.reply},
        "repeats": repeats,
        "ratios": {"snapshot_ttft": round(ttft_b / base, 2),
                   "snapshot_open_to_first_token": round((open_snap + ttft_b) / base, 2),
                   "reprefill_open_to_first_token": round((open_pre + ttft_c) / base, 2)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chatapp.bench.resume", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:smollm2-135m")
    p.add_argument("--tokens", type=int, default=4096, help="length of the chat to resume")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps(bench_resume(spec=args.model, chat_tokens=args.tokens, device=args.device,
                                  dtype=getattr(torch, args.dtype), repeats=args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
