"""The side panel "KV cache": what the model's memory is doing, live.

Values come from `Session.stats()` (refreshed on a timer while the model writes, and after
every command), the last `TurnStats` event, and the process's memory. With `stable=True`
(snapshot tests) the figures that change from run to run (memory, timings) are hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Label, ProgressBar, Sparkline, Static

from chatapp.chat.events import Event, Prefilling, TurnStats
from chatapp.chat.figures import human_bytes, human_ms, human_rate
from chatapp.tui.visible import visible

LABEL_WIDTH = 14
HIDDEN = "(hidden)"
HISTORY = 32  # turns in the sparkline


@dataclass
class Memory:
    rss: int
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None


def read_memory(device: str) -> Memory:
    mem = Memory(psutil.Process().memory_info().rss)
    if device.startswith("cuda"):
        import torch  # lazy: on CUDA only, and torch must not delay the first frame

        mem.cuda_allocated = torch.cuda.memory_allocated(device)
        mem.cuda_reserved = torch.cuda.memory_reserved(device)
    return mem


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
        self.turn_stats: list[TurnStats] = []  # the chat's turns since it was opened here, retries included
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

    def show_stats(self, stats: dict, memory: Memory | None) -> None:
        """Everything but the last turn: from `Session.stats()`."""
        pos, cap = stats["cache_seqlens"], stats["capacity"]
        self.row("model").set(stats["model"])
        self.row("mode").display = "mode" in stats
        self.row("mode").set(stats.get("mode", ""))
        self.row("device").set(stats["device"])
        self.row("backend").set(stats["backend"].upper())
        self.row("cache_seqlens").set(f"{pos} / {cap}")
        self.query_one("#fill", ProgressBar).update(total=cap, progress=pos)
        self.row("shape").set("×".join(map(str, stats["shape"])))
        self.row("dtype").set(stats["dtype"])
        self.row("weights").set(stats.get("weights", "—"))
        self.row("kv_used").set(human_bytes(stats["kv_bytes_used"]))
        self.row("kv_allocated").set(human_bytes(stats["kv_bytes_allocated"]))
        cuda = memory is not None and memory.cuda_allocated is not None
        for id in ("cuda_allocated", "cuda_reserved"):
            self.row(id).display = cuda
        if memory is None:
            return
        self.row("rss").set(HIDDEN if self.stable else human_bytes(memory.rss))
        if cuda:
            self.row("cuda_allocated").set(HIDDEN if self.stable else human_bytes(memory.cuda_allocated))
            self.row("cuda_reserved").set(HIDDEN if self.stable else human_bytes(memory.cuda_reserved))

    def show_restore(self, restore_line: str) -> None:
        """After opening a stored chat: how its cache came back (snapshot or re-prefill)."""
        restore = self.query_one("#restore", Static)
        restore.update(Content(visible(restore_line)))
        restore.display = bool(restore_line)

    def show_progress(self, ev: Event) -> None:
        """A trim's re-prefill in progress (the user waits for it before the reply starts): its
        last `Prefilling`, or any other event (the turn went on, or failed), hides the row."""
        row = self.row("reprefill")
        row.display = isinstance(ev, Prefilling) and ev.done < ev.total
        if isinstance(ev, Prefilling):
            row.set(f"{ev.done} / {ev.total} tokens ({ev.reason})")

    def show_inflight(self, done: int, total: int, waited_s: float) -> None:
        """The turn in flight, while it prefills: its figures, not the last turn's."""
        if done >= total:
            return  # decoding: the last turn's figures stay until this one's arrive
        self.query_one("#turn-section", Label).update("this turn")
        self.row("prefill").set(f"{done:,} / {total:,}")
        self.row("cached").set("—")
        self.row("ttft").set(HIDDEN if self.stable else f"waiting {human_ms(waited_s * 1000)}")
        self.row("speed").set("—")

    def show_last_turn(self) -> None:
        self._show_turns()

    def show_turn(self, st: TurnStats) -> None:
        self.turn_stats.append(st)
        self._show_turns()

    def undo_turns(self, turns: int) -> None:
        """After /undo, the chat has `turns` turns: the undone one (and its retries) leaves the
        figures, which fall back to the last turn still in the chat, or blanks."""
        self.turn_stats = [st for st in self.turn_stats if st.turn <= turns]
        self._show_turns()

    def clear_turns(self) -> None:
        """A new chat: the last-turn figures and the history belong to the old one."""
        self.turn_stats.clear()
        self._show_turns()

    def _show_turns(self) -> None:
        """The last turn's figures (blanks when there is none) and the prefill history."""
        self.query_one("#turn-section", Label).update("last turn")
        last = {}
        if self.turn_stats:
            st = self.turn_stats[-1]
            trim = f"{st.prefill_tokens} ({st.reprefilled_tokens} by trim)"  # the trim's re-prefill counts in
            prefill = trim if st.reprefilled_tokens else f"{st.prefill_tokens} new"
            last = {"prefill": prefill, "cached": f"{st.cached_before} reused",
                    "ttft": HIDDEN if self.stable else human_ms(st.ttft_ms),
                    "speed": HIDDEN if self.stable else human_rate(st.tokens_per_s)}
        for id in ("prefill", "cached", "ttft", "speed"):
            self.row(id).set(last.get(id, "—"))
        p = [st.prefill_tokens for st in self.turn_stats]
        self.row("turns").set(f"{len(p)}, max {max(p)}" if p else "—")  # the last: the prefill row
        self.query_one("#history", Sparkline).data = p[-HISTORY:]
