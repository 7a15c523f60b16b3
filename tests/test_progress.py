"""The live figures of a turn in flight come as `Progress` events from the worker that runs it
(chatapp/chat/reply.py): one before the prefill and one after each of its chunks, then at most
every PROGRESS_S while decoding; faces need not read the session while it changes."""

from __future__ import annotations

import pytest

from chatapp.chat import reply
from chatapp.chat.events import Progress, TextDelta, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings


@pytest.fixture
def session(tiny) -> Session:
    s = Session(tiny, Settings(temperature=0.0, max_new_tokens=24), context=512)
    s.template.stop_ids.clear()  # a reply of exactly max_new_tokens
    return s


def test_the_prefill_reports_each_chunk_and_the_cache_it_filled(session):
    session.gen.prefill_chunk = 16
    events = list(session.send("w " * 30))
    pre = [e for e in events if isinstance(e, Progress) and e.phase == "prefill"]
    total = pre[0].total
    assert total > 32 and [e.done for e in pre] == [*range(0, total, 16), total]
    assert all(e.cache_seqlens == e.done and e.capacity == 512 and e.memory.rss > 0 for e in pre)
    assert events.index(pre[-1]) < next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    assert st.prefill_tokens == total  # the chunks are the whole prefill, as one call made it


def test_the_decode_reports_at_most_every_progress_s(session, monkeypatch):
    monkeypatch.setattr(reply, "PROGRESS_S", 0.0)  # every token: the figures follow the cache
    events = list(session.send("hi"))
    dec = [e for e in events if isinstance(e, Progress) and e.phase == "decode"]
    assert [e.done for e in dec] == list(range(1, 25)) and dec[-1].total == 24
    assert [e.cache_seqlens for e in dec] == list(range(dec[0].cache_seqlens, dec[0].cache_seqlens + 24))
    monkeypatch.setattr(reply, "PROGRESS_S", 3600.0)
    events = list(session.send("again"))
    assert not [e for e in events if isinstance(e, Progress) and e.phase == "decode"]  # rate-limited away


def test_the_turn_carries_the_rss_the_panel_shows(session):
    """Issue 44: a turn's JSON carries `rss_bytes`, the process RSS of the panel's row, read as the
    turn ends: between the last Progress's figure and the SessionFigures read right after."""
    events = list(session.send("hi"))
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    last = [e for e in events if isinstance(e, Progress)][-1].memory.rss
    after = session.figures().memory.rss
    assert min(last, after) - (8 << 20) <= st.rss_bytes <= max(last, after) + (8 << 20)
    assert st.rss_bytes > 50 << 20  # torch alone is more: a real RSS, not a default
