"""The side panel "KV cache": what the model's memory is doing, live.

It renders from events alone (`apply`), all of them made by the worker thread that owns the
session: `SessionFigures` after every input (the session's figures, memory, the chat's turn
figures), `Progress` while a turn runs (the cache filling, memory), and the events that
move the cache (`TurnStats`, `CacheState`, `Trimmed`, `Restored`, `Prefilling`, a model
switch). The UI thread never reads the session. With `stable=True` (snapshot tests) the
figures that change from run to run (memory, timings) are hidden.

F2 or `/panel` hides and shows it; below 100 columns it folds to `StatusLine`, one line under
the input box (the cache's fill, memory, speed), which it keeps up to date. A figure the
session does not have (a `--backend` server reports no shape or K/V bytes) hides its row.
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
COMPLETION_LABEL = "completion (base)"  # stats carry "mode" only then (chat/stats.py); it fits the row
# rows of figures a session may not have (a --backend server reports none of these): hidden then
OPTIONAL_ROWS = {"shape": "shape", "dtype": "dtype", "weights": "weights", "kv_used": "kv_bytes_used",
                 "kv_allocated": "kv_bytes_allocated"}
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


class StatusLine(Static):
    """The panel folded to one line (below 100 columns, or hidden with F2): what it shows, set by
    the panel as its rows change."""

    shown: tuple[str, str, str] | None = None

    def show(self, cache: str, memory: str, speed: str) -> None:
        if (cache, memory, speed) == self.shown:
            return  # one line of fixed size: a change repaints it without a relayout, and none skips it
        self.shown = (cache, memory, speed)
        self.update(Content.assemble(("KV ", "dim"), cache, (" · RSS ", "dim"), memory, (" · ", "dim"), speed,
                                     (" · F2 panel", "dim")), layout=False)


def backend_label(backend: str, device: str) -> str:
    """The panel's name for the engine. A quantized CPU model's is "C kernels" whatever else its
    prefill handed attention to (oneDNN's SDPA on AMX, for long chunks): `/stats`' backend field
    lists every one that ran, and the row stays put rather than growing "+SDPA" mid-chat. A
    --backend server's is the name it gives itself."""
    if device == "remote":
        return backend
    parts = backend.split("+")
    return "C kernels" if "c" in parts else "+".join(b.upper() for b in parts)


class CachePanel(VerticalScroll):
    """Shown at the right of the chat; every field has an id so tests can read it. It takes no
    focus (the mouse wheel still scrolls it), so one Tab from the input reaches the transcript."""

    can_focus = False

    def __init__(self, stable: bool = False, status: StatusLine | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stable = stable
        self.status = status or StatusLine()
        # The session's turn figures as the last SessionFigures carried them, and the TurnStats
        # since (the session keeps the one list: Session.turn_stats; this is what is on screen).
        self.turns: list[TurnStats] = []
        # Prefill tokens per exchange of the chat (SessionFigures.history: a reopened chat's too)
        self.history: list[int] = []
        self.restored_at: int | None = None  # cache_seqlens a stored chat's restore gave back
        self.border_title = "KV cache"

    def compose(self) -> ComposeResult:
        yield Row("model", "model", wrap=True)  # a long name wraps rather than losing its end
        mode = Row("mode", "mode")  # shown only for a base model's completion mode
        mode.display = False
        yield mode
        yield Static("", id="restore", classes="hint")
        yield Row("device", "device")
        yield Row("backend", "backend")
        yield Row("cache_seqlens", "cache_seqlens")
        yield ProgressBar(total=1, id="fill", show_eta=False)  # not indeterminate: it would animate before a model
        yield Row("re-prefill", "reprefill")  # shown only while a trim refills the cache
        yield Row("shape", "shape")
        yield Label("layers×B×T×H×D", classes="hint", id="shape-hint")
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
                self.turns, self.history = list(ev.turns), list(ev.history)
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
                self.history.append(ev.prefill_tokens)  # until the figures after the turn say it exactly
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
                self.turns, self.history = [], []  # they belonged to the old model

    def show_stats(self, stats: dict, memory: Memory) -> None:
        """Everything but the turns: the session's /stats figures and the process's memory."""
        self.row("model").set(stats["model"])
        self.row("mode").display = "mode" in stats
        self.row("mode").set(COMPLETION_LABEL if "mode" in stats else "")
        self.row("device").set(stats["device"])
        self.row("backend").set(backend_label(stats["backend"], stats["device"]))
        self.show_cache(stats["cache_seqlens"], stats["capacity"], stats.get("kv_bytes_used"))
        for id, key in OPTIONAL_ROWS.items():
            self.row(id).display = key in stats
        self.query_one("#shape-hint", Label).display = "shape" in stats
        self.row("shape").set("×".join(map(str, stats.get("shape", []))))
        self.row("dtype").set(stats.get("dtype", "—"))
        self.row("weights").set(stats.get("weights", "—"))
        if "kv_bytes_allocated" in stats:
            self.row("kv_allocated").set(human_bytes(stats["kv_bytes_allocated"]))
        self.show_memory(memory)

    def show_cache(self, pos: int, cap: int, kv_used: int | None = None) -> None:
        self.row("cache_seqlens").set(f"{pos} / {cap}")
        self.query_one("#fill", ProgressBar).update(total=cap, progress=pos)
        if kv_used is not None:
            self.row("kv_used").set(human_bytes(kv_used))
        self.show_status()

    def show_memory(self, memory: Memory) -> None:
        cuda = memory.cuda_allocated is not None
        for id in ("cuda_allocated", "cuda_reserved"):
            self.row(id).display = cuda
        self.row("rss").set(HIDDEN if self.stable else human_bytes(memory.rss))
        self.show_status()
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
        p = self.history
        self.row("turns").set(f"{len(p)}, max {max(p)}" if p else "—")  # the last: the prefill row
        self.query_one("#history", Sparkline).data = p[-HISTORY:]
        self.show_status()

    def show_status(self) -> None:
        """The folded panel's line, from the rows as they are now."""
        self.status.show(self.row("cache_seqlens").value, self.row("rss").value, self.row("speed").value)
