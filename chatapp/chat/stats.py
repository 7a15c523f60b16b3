"""`/stats`, headless mode's ready line and the TUI's panel: the session's figures as one dict
(the JSON field names; chat/figures.py writes them for a person)."""

from __future__ import annotations

from chatapp.chat.figures import weights_format
from chatapp.chat.session_like import SessionLike
from model.chat_formats.completion import MODE as COMPLETION_MODE


def session_stats(s: SessionLike) -> dict:
    c = s.cache
    d = {"model": s.lm.name, "cache_seqlens": c.seqlen, "capacity": c.capacity, "tokens": len(s.tokens),
         "shape": list(c.shape), "dtype": str(c.dtype).removeprefix("torch."),
         "weights": weights_format(s.lm.model), "device": str(c.device),
         "kv_bytes_used": c.bytes_used, "kv_bytes_allocated": c.bytes_allocated,
         "backend": s.lm.model.attn.name, "turns": s.turns, **s.settings.sampling_values()}
    if s.snapshot_budget is not None:  # chats are stored: KV snapshots kept on disk up to this, all chats
        d["snapshot_budget_bytes"] = s.snapshot_budget
    if getattr(s.template, "completion", False):  # only then: a chat model's figures stay as they were
        d["mode"] = COMPLETION_MODE
    if s.turn_stats:
        last = s.turn_stats[-1]
        d |= {"last_prefill_tokens": last.prefill_tokens, "last_ttft_ms": round(last.ttft_ms, 2),
              "last_tokens_per_s": round(last.tokens_per_s, 2)}
    return d
