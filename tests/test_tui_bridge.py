"""The worker-to-UI bridge: batching, order, back-pressure, and errors, on a controlled clock.
Also the tool-span splitter the transcript uses."""

from __future__ import annotations

from chatapp.chat.events import Error, Memory, Progress, TextDelta, ToolCall, TurnStats
from chatapp.tui.bridge import DRAW_SHARE, MAX_WAIT_S, Gate, SessionEvent, TextBatch, TurnFinished, pump


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def tokens(clock: Clock, n: int, step: float):
    for i in range(n):
        clock.t += step
        yield TextDelta(str(i % 10))


def test_deltas_are_batched_at_most_every_50ms_and_order_is_kept():
    clock, posted = Clock(), []
    gate = Gate(clock=clock)

    def post(msg):  # a UI that draws instantly
        posted.append(msg)
        if isinstance(msg, TextBatch):
            gate.drawn()

    def events():
        yield from tokens(clock, 200, 0.001)  # 200 tokens, 1 ms apart: 200 ms
        yield ToolCall("1+1", "2")
        yield TextDelta("tail")

    batches = pump(events(), post, gate)
    texts = [m.text for m in posted if isinstance(m, TextBatch)]
    assert "".join(texts) == "".join(str(i % 10) for i in range(200)) + "tail"
    assert batches == len(texts) <= 1 + 200 // 50 + 1  # the first token at once, then >= 50 ms apart
    kinds = [type(m) for m in posted]
    # The tool call comes after all the text before it, and the turn ends last.
    assert kinds[-3:] == [SessionEvent, TextBatch, TurnFinished] and posted[-2].text == "tail"


def test_a_ui_that_has_not_drawn_gets_no_new_batch():
    clock, posted = Clock(), []
    gate = Gate(clock=clock)
    pump(tokens(clock, 100, 0.01), posted.append, gate)  # nobody calls gate.drawn()
    texts = [m.text for m in posted if isinstance(m, TextBatch)]
    assert texts == ["0", "".join(str(i % 10) for i in range(1, 100))]  # first, then the final flush


def test_a_slow_ui_gets_batches_its_draw_share_apart():
    clock, posted, sent = Clock(), [], []
    gate = Gate(clock=clock)

    def post(msg):
        posted.append(msg)
        if isinstance(msg, TextBatch):
            sent.append(clock.t)
            clock.t += 0.1  # drawing takes 100 ms (the model is blocked meanwhile, like the GIL)
            gate.drawn()

    pump(tokens(clock, 3000, 0.001), post, gate)
    gaps = [b - a for a, b in zip(sent, sent[1:-1], strict=False)]
    assert gaps and min(gaps) >= DRAW_SHARE * 0.1 - 1e-9   # the UI busy at most 1 / (1 + DRAW_SHARE)


def test_a_very_slow_ui_still_gets_a_batch_every_second():
    clock, sent = Clock(), []
    gate = Gate(clock=clock)

    def post(msg):
        if isinstance(msg, TextBatch):
            sent.append(clock.t)
            clock.t += 0.5  # each draw takes 500 ms: DRAW_SHARE of it would be 3 s of silence
            gate.drawn()

    pump(tokens(clock, 5000, 0.001), post, gate)
    gaps = [b - a for a, b in zip(sent, sent[1:-1], strict=False)]
    assert gaps and MAX_WAIT_S - 1e-9 <= min(gaps) <= max(gaps) <= MAX_WAIT_S + 0.002


def test_an_exception_in_a_turn_becomes_an_error_event_and_the_turn_ends():
    posted = []

    def events():
        yield TextDelta("partial")
        raise RuntimeError("boom")

    pump(events(), posted.append)
    assert isinstance(posted[0], TextBatch) and posted[0].text == "partial"
    assert isinstance(posted[1].event, Error)   # one line, naming where it came from
    assert posted[1].event.message == "internal error in tests.test_tui_bridge:events: RuntimeError: boom"
    assert isinstance(posted[-1], TurnFinished)


def test_other_events_pass_through_untouched():
    st = TurnStats(1, "u", "r", 3, 0, 3, 10, 1, 1.0, 1.0, "end", 0, 0, "sdpa")
    posted = []
    pump(iter([st]), posted.append)
    assert [type(m) for m in posted] == [SessionEvent, TurnFinished] and posted[0].event is st


def test_a_batch_holds_one_kind_of_text():
    """Kinds change mid-stream (thinking, answer, a tool span): each batch is one kind, in order."""
    posted = []
    deltas = [TextDelta("Pl", "thinking"), TextDelta("an", "thinking"), TextDelta("Let me ", "answer"),
              TextDelta("<|python_start|>12*7<|python_end|>", "tool_call"),
              TextDelta("<|output_start|>84<|output_end|>", "tool_result"), TextDelta(" ok", "answer")]
    pump(iter(deltas), posted.append, Gate())  # never drawn: after the first, only a kind change flushes
    batches = [(m.kind, m.text) for m in posted if isinstance(m, TextBatch)]
    assert batches == [("thinking", "Pl"), ("thinking", "an"), ("answer", "Let me "),
                       ("tool_call", "<|python_start|>12*7<|python_end|>"),
                       ("tool_result", "<|output_start|>84<|output_end|>"), ("answer", " ok")]


def test_progress_waits_for_the_gate_and_only_the_latest_goes():
    """The decode's Progress comes four times a second; flushing the text for each one let the
    batches past the gate, and the UI drew as often as it pleased."""
    clock, posted = Clock(), []
    gate = Gate(clock=clock)

    def events():
        yield Progress("prefill", 0, 8, 0.0, 0, 64, 0, Memory(1))  # the gate is open: out at once
        for i in range(100):
            clock.t += 0.01
            yield TextDelta(str(i % 10))
            if i % 25 == 24:
                yield Progress("decode", i + 1, 100, clock.t, 8 + i, 64, 0, Memory(1))

    pump(events(), posted.append, gate)  # nobody calls gate.drawn(): one batch in flight, forever
    texts = [m.text for m in posted if isinstance(m, TextBatch)]
    assert texts == ["0", "".join(str(i % 10) for i in range(1, 100))]  # the first, then the final flush
    progress = [m.event for m in posted if isinstance(m, SessionEvent)]
    assert [(p.phase, p.done) for p in progress] == [("prefill", 0), ("decode", 100)]
    assert isinstance(posted[-1], TurnFinished) and posted[-2].event is progress[-1]
