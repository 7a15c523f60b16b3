"""The side panel "KV cache": what the model's memory is doing, live.

It renders from events alone (`apply`), all of them made by the worker thread that owns the
session: `SessionFigures` after every input (the session's figures, memory, the chat's turn
figures), `Progress` while a turn runs (the cache filling, memory), and the events that
move the cache (`TurnStats`, `CacheState`, `Trimmed`, `Restored`, `Prefilling`, a model
switch). The UI thread never reads the session. With `stable=True` (snapshot tests) the
figures that change from run to run (memory, timings) are hidden.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Label, ProgressBar, Sparkline, Static

from chatapp.chat.events import (
    CacheState,
    Event,
    Memory,
    ModelSwitched,
    Prefilling,
    Progress,
    Restored,
    SessionFigures,
    Trimmed,
    TurnStats,
)
from chatapp.chat.figures import counted, human_bytes, human_ms, human_rate
from chatapp.tui.visible import visible

LABEL_WIDTH = 14
HIDDEN = "(hidden)"
HISTORY = 32  # turns in the sparkline


class Row(Static):
    """`label     value`, one line; the value is plain text, never markup.

    A row never changes size (one line, cut with an ellipsis), so an update repaints it
    without a relayout of the screen: the panel refreshes 4 times a second while decoding."""

    def __init__(self, label: str, id: str, wrap: bool = False) -> None:
        super().__init__(id=id, classes="wrap" if wrap else "")
        self.label = label
        self.value = ""
        self.set("—")

    def set(self, value: str) -> None:
        if value == self.value:
            return  # most rows never change: skip the relayout
        self.value = value
        self.update(Content.assemble((f"{self.label:<{LABEL_WIDTH}}", "dim"), visible(value)),
                    layout=self.has_class("wrap"))


class CachePanel(VerticalScroll):
    """Shown at the right of the chat; every field has an id so tests can read it. It takes no
    focus (the mouse wheel still scrolls it), so one Tab from the input reaches the transcript."""

    can_focus = False

    def __init__(self, stable: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stable = stable
        # The session's turn figures as the last SessionFigures carried them, and the TurnStats
        # since (the session keeps the one list: Session.turn_stats; this is what is on screen).
        self.turns: list[TurnStats] = []
        self.restored_at: int | None = None  # cache_seqlens a stored chat's restore gave back
        self.border_title = "KV cache"

    def compose(self) -> ComposeResult:
        yield Row("model", "model", wrap=True)  # a long name wraps rather than losing its end
        mode = Row("mode", "mode", wrap=True)  # shown only for a base model's completion mode
        mode.display = False
        yield mode
        yield Static("", id="restore", classes="hint")
        yield Row("device", "device")
        yield Row("backend", "backend")
        yield Row("cache_seqlens", "cache_seqlens")
        yield ProgressBar(id="fill", show_eta=False)
        yield Row("re-prefill", "reprefill")  # shown only while a trim refills the cache
        yield Row("shape", "shape")
        yield Label("layers×B×T×H×D", classes="hint")
        yield Row("KV dtype", "dtype")
        yield Row("weights", "weights")
        yield Row("KV in use", "kv_used")
        yield Row("KV allocated", "kv_allocated")
        yield Row("process RSS", "rss")
        yield Row("cuda alloc", "cuda_allocated")
        yield Row("cuda reserved", "cuda_reserved")
        yield Label("last turn", classes="section", id="turn-section")
        yield Row("prefill", "prefill")
        yield Row("cached", "cached")
        yield Row("TTFT", "ttft")
        yield Row("speed", "speed")
        yield Label("prefill tokens per turn", classes="section")
        yield Row("turns", "turns")
        yield Sparkline([], id="history")

    def row(self, id: str) -> Row:
        return self.query_one(f"#{id}", Row)

    def apply(self, ev: Event) -> None:
        """Show what `ev` says of the cache; other events leave the panel as it is."""
        self.show_reprefill(ev)
        match ev:
            case SessionFigures():
                self.show_stats(ev.stats, ev.memory)
                self.turns = list(ev.turns)
                self.show_turns()
            case Progress():
                self.show_cache(ev.cache_seqlens, ev.capacity, ev.kv_bytes_used)
                self.show_memory(ev.memory)
                if ev.phase == "prefill" and ev.done < ev.total:
                    self.show_inflight(ev.done, ev.total, ev.elapsed_s)
                else:
                    self.show_turns()  # decoding: the last turn's figures stay until this one's arrive
            case TurnStats():
                self.show_cache(ev.cache_seqlens, ev.capacity, ev.kv_bytes_used)
                self.turns.append(ev)
                self.show_turns()
            case Trimmed():
                self.show_cache(ev.cache_seqlens, ev.capacity)
                self.show_restore("")  # the trim recomputed all of the cache
            case CacheState():
                self.show_cache(ev.cache_seqlens, ev.capacity)
                gone = self.restored_at is not None and ev.cache_seqlens < self.restored_at
                if ev.event in ("reset", "system") or gone:  # the restore line would describe K/V that is gone
                    self.show_restore("")
            case Restored():
                self.show_cache(ev.cache_seqlens, ev.capacity)
                self.show_restore(ev.line, ev.cache_seqlens)
            case Prefilling(reason="model"):
                self.show_restore(f"re-prefilling {ev.done} / {ev.total} tokens")
            case ModelSwitched():
                dropped = f", {counted(ev.dropped_exchanges, 'exchange')} out" if ev.dropped_exchanges else ""
                self.show_restore(f"switched: re-prefilled {ev.reprefilled_tokens} tokens{dropped}")
                self.turns = []  # they belonged to the old model

    def show_stats(self, stats: dict, memory: Memory) -> None:
        """Everything but the turns: the session's /stats figures and the process's memory."""
        self.row("model").set(stats["model"])
        self.row("mode").display = "mode" in stats
        self.row("mode").set(stats.get("mode", ""))
        self.row("device").set(stats["device"])
        self.row("backend").set("+".join("C kernels" if b == "c" else b.upper() for b in stats["backend"].split("+")))
        self.show_cache(stats["cache_seqlens"], stats["capacity"], stats["kv_bytes_used"])
        self.row("shape").set("×".join(map(str, stats["shape"])))
        self.row("dtype").set(stats["dtype"])
        self.row("weights").set(stats.get("weights", "—"))
        self.row("kv_allocated").set(human_bytes(stats["kv_bytes_allocated"]))
        self.show_memory(memory)

    def show_cache(self, pos: int, cap: int, kv_used: int | None = None) -> None:
        self.row("cache_seqlens").set(f"{pos} / {cap}")
        self.query_one("#fill", ProgressBar).update(total=cap, progress=pos)
        if kv_used is not None:
            self.row("kv_used").set(human_bytes(kv_used))

    def show_memory(self, memory: Memory) -> None:
        cuda = memory.cuda_allocated is not None
        for id in ("cuda_allocated", "cuda_reserved"):
            self.row(id).display = cuda
        self.row("rss").set(HIDDEN if self.stable else human_bytes(memory.rss))
        if cuda:
            self.row("cuda_allocated").set(HIDDEN if self.stable else human_bytes(memory.cuda_allocated))
            self.row("cuda_reserved").set(HIDDEN if self.stable else human_bytes(memory.cuda_reserved))

    def show_restore(self, restore_line: str, restored_at: int | None = None) -> None:
        """After opening a stored chat: how its cache came back (snapshot or re-prefill)."""
        restore = self.query_one("#restore", Static)
        restore.update(Content(visible(restore_line)))
        restore.display = bool(restore_line)
        self.restored_at = restored_at

    def show_reprefill(self, ev: Event) -> None:
        """A trim's re-prefill in progress (the user waits for it before the reply starts): its
        last `Prefilling`, or any other event (the turn went on, or failed), hides the row."""
        row = self.row("reprefill")
        row.display = isinstance(ev, Prefilling) and ev.done < ev.total
        if isinstance(ev, Prefilling):
            row.set(f"{ev.done} / {ev.total} tokens ({ev.reason})")

    def show_inflight(self, done: int, total: int, waited_s: float) -> None:
        """The turn in flight, while it prefills: its figures, not the last turn's."""
        self.query_one("#turn-section", Label).update("this turn")
        self.row("prefill").set(f"{done:,} / {total:,}")
        self.row("cached").set("—")
        self.row("ttft").set(HIDDEN if self.stable else f"waiting {human_ms(waited_s * 1000)}")
        self.row("speed").set("—")

    def show_turns(self) -> None:
        """The last turn's figures (blanks when there is none) and the prefill history."""
        self.query_one("#turn-section", Label).update("last turn")
        last = {}
        if self.turns:
            st = self.turns[-1]
            trim = f"{st.prefill_tokens} ({st.reprefilled_tokens} by trim)"  # the trim's re-prefill counts in
            prefill = trim if st.reprefilled_tokens else f"{st.prefill_tokens} new"
            last = {"prefill": prefill, "cached": f"{st.cached_before} reused",
                    "ttft": HIDDEN if self.stable else human_ms(st.ttft_ms),
                    "speed": HIDDEN if self.stable else human_rate(st.tokens_per_s)}
        for id in ("prefill", "cached", "ttft", "speed"):
            self.row(id).set(last.get(id, "—"))
        p = [st.prefill_tokens for st in self.turns]
        self.row("turns").set(f"{len(p)}, max {max(p)}" if p else "—")  # the last: the prefill row
        self.query_one("#history", Sparkline).data = p[-HISTORY:]
