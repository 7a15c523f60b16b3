"""The scripted multi-turn chat: our persistent cache against re-prefilling the transcript.

Both runs use the same Generator (same kernels, same graphs); the only difference is what
gets prefilled at the start of a turn: the new tokens, or the whole chat from an empty
cache, as nanochat's chat_cli does. Replies are greedy and exactly `reply_tokens` long.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from model.decode.generate import Generator
from model.decode.sampling import SamplingConfig
from model.loading import LoadedModel

TOPICS = ["the water cycle", "binary search", "how vaccines work", "the French revolution", "photosynthesis",
          "TCP handshakes", "compound interest", "black holes", "sourdough bread", "the Pythagorean theorem",
          "garbage collection", "plate tectonics", "the immune system", "public key cryptography",
          "supply and demand", "neural networks", "the printing press", "ocean tides", "recursion",
          "climate feedback loops"]


def user_message(i: int) -> str:
    """Turn i's fixed message: a question that grows a little each turn."""
    topic = TOPICS[i % len(TOPICS)]
    return f"Turn {i + 1}: explain {topic}, step by step." + " Keep it short." * (i % 3)


def script_tokens(lm: LoadedModel, turns: int, reply_tokens: int) -> int:
    """Tokens the whole scripted chat occupies: the cache capacity it needs."""
    t = lm.template
    per_turn = sum(len(t.user_turn(user_message(i))) for i in range(turns))
    return len(t.start(t.default_system)) + per_turn + turns * (reply_tokens + len(t.end_reply()))


@dataclass
class TurnRow:
    turn: int
    history: int          # tokens in the chat before this turn's prefill
    prefill_tokens: int
    ttft_ms: float
    decode_tok_s: float


def run_turns(lm: LoadedModel, gen: Generator, turns: int, reply_tokens: int, persistent: bool,
              reps: int = 1) -> tuple[list[TurnRow], list[list[int]]]:
    """Play the script; returns per-turn rows and the replies (to check both runs agree).
    Each turn's TTFT is the median of `reps` replays of its prefill and first sample, each
    from the same starting cache (a single sample is at the mercy of one GC pause)."""
    tmpl, cache = lm.template, gen.cache
    gen.configure(SamplingConfig(temperature=0.0))
    cache.reset()
    gen.forget()
    tokens = tmpl.start(tmpl.default_system)
    rows, replies = [], []
    for i in range(turns):
        tokens += tmpl.user_turn(user_message(i))
        history = cache.seqlen
        ttfts = []
        for _ in range(reps):
            cache.rewind(history)
            gen.forget()
            sync(cache.device)
            t0 = time.perf_counter()
            if not persistent:
                cache.reset()
            pending = tokens[cache.seqlen:]
            gen.prefill(pending)
            token = gen.sample()
            ttfts.append(time.perf_counter() - t0)
        t_first = time.perf_counter()
        reply = [token]
        for _ in range(reply_tokens - 1):
            gen.feed(token)
            token = gen.sample()
            reply.append(token)
        t_end = time.perf_counter()
        tokens += reply + tmpl.end_reply()  # the last reply token stays pending, as in the session
        decode_s = t_end - t_first
        rate = (reply_tokens - 1) / decode_s if reply_tokens > 1 and decode_s > 0 else 0.0
        rows.append(TurnRow(i + 1, history, len(pending), statistics.median(ttfts) * 1000, rate))
        replies.append(reply)
    return rows, replies


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def multiturn(lm: LoadedModel, gen: Generator, turns: int, reply_tokens: int, reps: int = 1) -> dict:
    """Both runs, and the figures the targets are stated in."""
    run_turns(lm, gen, 2, 4, persistent=True)  # warm-up: first-call costs stay out of turn 1
    ours, ours_replies = run_turns(lm, gen, turns, reply_tokens, persistent=True, reps=reps)
    base, base_replies = run_turns(lm, gen, turns, reply_tokens, persistent=False, reps=reps)
    last = turns - 1
    return {
        "turns": turns, "reply_tokens": reply_tokens, "ttft_reps": reps, "history_at_last_turn": ours[last].history,
        "persistent": [asdict(r) for r in ours], "reprefill": [asdict(r) for r in base],
        "last_ttft_vs_first": ours[last].ttft_ms / ours[0].ttft_ms,
        "last_speedup_vs_reprefill": base[last].ttft_ms / ours[last].ttft_ms,
        "same_replies": sum(a == b for a, b in zip(ours_replies, base_replies, strict=True)),
    }
