"""`nanochat-tui bench --long-chat`: a chat far longer than the context, through the real Session.

The same scripted chat plays once per trim policy (`low_water`, chat/trim.py): the default
0.5 (cut a full context to half) and 1.0 (drop just enough, the policy before issue 17). Each
turn's TTFT is the session's own TurnStats figure, which includes a trim's re-prefill, so the
table shows what the user waits for. Greedy replies, at most `reply_tokens` long.

The targets (docs/benchmarks.md): after the fill, the median TTFT stays within 1.3x of the
unfilled turns' median; re-prefills are rare (about one per half-context of new chat).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass

from chatapp.bench.turns import user_message
from chatapp.chat.events import Trimmed, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from model.loading import LoadedModel

# Background every message carries, so a 2,048-token context fills within ~30 turns.
PADDING = " For context: I am studying this for an exam next week, so the main idea matters most."


@dataclass
class LongTurn:
    turn: int
    history: int          # tokens in the cache before the turn
    prefill_tokens: int   # the trim's re-prefill included
    reprefilled: int      # of those, the trim's (0: no trim this turn)
    ttft_ms: float
    decode_tokens: int


def play(lm: LoadedModel, context: int, turns: int, reply_tokens: int, low_water: float) -> list[LongTurn]:
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=reply_tokens, low_water=low_water), context=context)
    rows = []
    for i in range(turns):
        history = s.cache.seqlen
        events = list(s.send(user_message(i) + PADDING))
        st = next(e for e in events if isinstance(e, TurnStats))
        trim = next((e for e in events if isinstance(e, Trimmed)), None)
        rows.append(LongTurn(i + 1, history, st.prefill_tokens, trim.reprefilled_tokens if trim else 0,
                             st.ttft_ms, st.decode_tokens))
        print(f"low_water={low_water} turn {i + 1}/{turns}: TTFT {st.ttft_ms:.0f} ms, prefill {st.prefill_tokens}",
              file=sys.stderr, flush=True)  # a long run shows it is moving; stdout stays the table
    return rows


def summarize(rows: list[LongTurn], kv_bytes_per_token: int) -> dict:
    """The unfilled turns (before the first trim) against the rest, in one policy's run."""
    fill = next((r.turn for r in rows if r.reprefilled), None)
    before = [r.ttft_ms for r in rows if fill is None or r.turn < fill]
    after = [r.ttft_ms for r in rows if fill is not None and r.turn >= fill]
    out = {"fill_turn": fill, "turns_before_fill": len(before), "turns_after_fill": len(after),
           "median_ttft_before_ms": statistics.median(before) if before else None,
           "median_ttft_after_ms": statistics.median(after) if after else None,
           "reprefill_turns": sum(r.reprefilled > 0 for r in rows),
           "reprefilled_tokens": sum(r.reprefilled for r in rows),
           "worst_ttft_ms": max(r.ttft_ms for r in rows),
           # each trim rewrites the whole KV snapshot of the stored chat (chatapp/keeper/keeper.py)
           "snapshot_rewrite_mb": sum(r.reprefilled for r in rows) * kv_bytes_per_token / 1e6}
    if before and after:
        out["ratio"] = out["median_ttft_after_ms"] / out["median_ttft_before_ms"]
    return out


def long_chat(lm: LoadedModel, context: int, turns: int, reply_tokens: int, old_turns: int) -> dict:
    """Both policies on the same model; a short warm-up first keeps first-call costs out."""
    play(lm, min(context, 256), 2, 2, 0.5)
    cache = lm.model.new_cache(min(context, lm.context_length))
    per_token = cache.bytes_allocated // cache.capacity
    res = {"context": cache.capacity, "reply_tokens": reply_tokens, "policies": {}}
    del cache
    for name, low_water, n in (("low_water=0.5", 0.5, turns), ("low_water=1 (old)", 1.0, old_turns)):
        rows = play(lm, context, n, reply_tokens, low_water)
        res["policies"][name] = {"low_water": low_water, "turns": n, **summarize(rows, per_token),
                                 "rows": [asdict(r) for r in rows]}
    return res


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def print_long_chat(model: str, note: str, res: dict) -> None:
    print(f"\n== long chat: {model} at --context {res['context']}, replies <= {res['reply_tokens']} tokens ==")
    if note:
        print(f"note: {note}")
    head = ["policy", "turns", "fill at", "median before", "median after", "ratio", "re-prefill turns",
            "worst TTFT", "snapshot MB"]
    print(" | ".join(head))
    for name, p in res["policies"].items():
        ratio = f"{p['ratio']:.2f}x" if "ratio" in p else "-"
        print(" | ".join([name, str(p["turns"]), str(p["fill_turn"] or "-"), _ms(p["median_ttft_before_ms"]) + " ms",
                          _ms(p["median_ttft_after_ms"]) + " ms", ratio, str(p["reprefill_turns"]),
                          _ms(p["worst_ttft_ms"]) + " ms", f"{p['snapshot_rewrite_mb']:,.0f}"]))
    print("(TTFT includes a trim's re-prefill; target: median after / before <= 1.3x)")
