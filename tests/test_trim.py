"""The trim policy (chatapp/chat/trim.py): a full context is cut to its low-water mark, so the
exact re-prefill comes at most once per half a context of new chat, and its cost is in the
turn's figures."""

import pytest
from helpers import assert_invariant, assert_transcript, run, turn_of

from chatapp.chat.events import Error, Prefilling, Trimmed
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.chat.trim import REPLY_BUDGET, count_to_drop
from chatapp.keeper.keeper import ChatKeeper
from chatapp.launch import settings_from
from chatapp.options import chat_parser
from model.errors import UserError

CONTEXT = 256


def message(i: int) -> str:
    return f"note {i}"


def chat(lm, low_water: float, turns: int, check=None) -> list[tuple[list, int]]:
    """Play `turns` greedy turns at CONTEXT; returns each turn's events and the chat's length
    in tokens before it."""
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=8, low_water=low_water), context=CONTEXT)
    s.gen.prefill_chunk = 48  # several progress events per re-prefill
    out = []
    for i in range(turns):
        before = len(s.tokens)
        events = run(s.send(message(i)))
        out.append((events, before))
        if check and any(isinstance(e, Trimmed) for e in events):
            check(s, events)
    return out


def trimmed(events: list) -> Trimmed | None:
    return next((e for e in events if isinstance(e, Trimmed)), None)


def test_count_to_drop_cuts_to_the_low_water_mark():
    starts = [10, 60, 110, 160, 210]  # five exchanges of 50 tokens after a 10-token system prompt
    assert count_to_drop(250, starts, 20, 8, 300, 0.5) == 0  # it fits: nothing goes
    assert count_to_drop(290, starts, 20, 8, 300, 1.0) == 1  # the old policy: just enough
    assert count_to_drop(290, starts, 20, 8, 300, 0.5) == 3  # down to 140 <= 150 tokens
    assert count_to_drop(290, starts, 20, 8, 300, 0.01) == 5  # only the system prompt stays
    assert count_to_drop(290, starts, 20, 500, 300, 1.0) == 2  # the reply's room is capped
    assert REPLY_BUDGET == 64


def test_trims_are_rare_exact_and_counted_in_the_turn(tiny):
    reported = []

    def check(s: Session, events: list) -> None:
        assert_invariant(s)  # after every trim: the cache equals a fresh prefill of the kept tokens
        assert_transcript(s)
        (trim,) = [e for e in events if isinstance(e, Trimmed)]
        st = turn_of(events)
        own = len(s.template.user_turn(s.exchanges[-1].user))  # the last reply's closing is kept, so re-prefilled
        # what the user waited for: the re-prefill and the turn's own tokens, on one clock
        assert st.prefill_tokens == trim.reprefilled_tokens + own and st.reprefilled_tokens == trim.reprefilled_tokens
        assert st.cached_before == 0 and st.ttft_ms >= trim.reprefill_ms > 0
        assert trim.reprefilled_tokens <= CONTEXT // 2 + 8  # kept: the low-water mark (+ a folded head)
        progress = [e for e in events if isinstance(e, Prefilling)]
        assert [p.done for p in progress] == sorted({0, *range(48, trim.reprefilled_tokens, 48),
                                                     trim.reprefilled_tokens})
        assert {p.total for p in progress} == {trim.reprefilled_tokens} and {p.reason for p in progress} == {"trim"}
        assert events.index(progress[-1]) < events.index(trim)
        reported.append(trim)

    new = chat(tiny, 0.5, 12, check)
    trims = [i for i, (events, _) in enumerate(new) if trimmed(events)]
    assert len(trims) >= 2, "the context should fill more than once"
    for a, b in zip(trims, trims[1:], strict=False):  # half a context of new chat between re-prefills,
        grown = new[b][1] - trimmed(new[a][0]).reprefilled_tokens  # less the turn and its reply's room
        assert grown >= CONTEXT // 2 - 64, (a, b, grown)
    old = chat(tiny, 1.0, 12)  # the old policy: a re-prefill every turn once full
    assert sum(trimmed(events) is not None for events, _ in old) >= 2 * len(trims) + 2


def test_low_water_is_validated_for_set_and_the_flag(tiny):
    s = Session(tiny, Settings(temperature=0.0, max_new_tokens=4), context=CONTEXT)
    for bad in ("/set low_water=2", "/set low_water=0", "/set low_water=half"):
        (err,) = run(ChatKeeper(s, None).run_command(bad))
        assert isinstance(err, Error) and "low_water must be a number in (0, 1]" in err.message
        assert "\n" not in err.message
    run(ChatKeeper(s, None).run_command("/set low_water=0.25"))
    assert s.settings.low_water == 0.25 and s.stats()["low_water"] == 0.25
    assert settings_from(chat_parser().parse_args(["--low-water", "0.7"])).low_water == 0.7
    with pytest.raises(UserError, match="low_water"):
        settings_from(chat_parser().parse_args(["--low-water", "1.5"]))


@pytest.mark.anyio
async def test_the_panel_shows_the_reprefills_progress_and_the_turns_share():
    from tui_pilot import make_app, ready, row

    from chatapp.chat.events import CacheState

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        panel, progress = app.panel, app.panel.row("reprefill")
        assert not progress.display  # hidden until a trim refills the cache
        panel.apply(Prefilling(512, 1950))
        assert progress.display and row(app, "reprefill") == "512 / 1950 tokens (trim)"
        panel.apply(Prefilling(1950, 1950))
        assert not progress.display
        panel.apply(Prefilling(0, 1950))
        panel.apply(CacheState("undone", 0, 2048, 0))  # the turn failed mid-refill: the row goes
        assert not progress.display
        st = turn_of(run(app.session.send("hi")))
        st.prefill_tokens, st.reprefilled_tokens = 1975, 1950
        panel.apply(st)
        assert row(app, "prefill") == "1975 (1950 by trim)"


def test_long_chat_bench_prints_both_policies_then_json(capsys):
    import json

    from chatapp.bench.main import main

    assert main(["--long-chat", "--models", "random:tiny", "--context", "512", "--turns", "6",
                 "--reply-tokens", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("low_water=0.5 | 6 |") for line in lines[:-1])
    (res,) = json.loads(lines[-1])["models"]
    new, old = res["long_chat"]["policies"].values()
    assert new["low_water"] == 0.5 and old["low_water"] == 1.0 and len(new["rows"]) == len(old["rows"]) == 6
    assert 0 < new["reprefill_turns"] <= old["reprefill_turns"] and new["worst_ttft_ms"] > 0
    assert new["fill_turn"] == old["fill_turn"]  # the same chat until the first trim
