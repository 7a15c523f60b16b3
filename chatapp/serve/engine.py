"""One engine, one request at a time: a worker thread owns the session and serves a bounded
first-come first-served queue.

The model has one KV cache, so requests cannot run side by side; they wait their turn in
arrival order (fair: no client can jump it), and past `queue_size` waiting the server says so
at once (503) instead of holding connections open without limit. A request whose client went
away is dropped before it starts, or stopped at its next token when it is running.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from chatapp.chat.events import CacheState, Error, TextDelta, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.serve.kvlru import SnapshotLRU, Swap
from chatapp.serve.protocol import ApiError, ChatRequest, usage
from chatapp.serve.stops import StopScanner


@dataclass
class Job:
    req: ChatRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    pending: list[tuple] = field(default_factory=list)   # put by the worker, not yet on `out`
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, item: tuple) -> None:
        """From the worker thread: hand an item to the request's handler. The event loop is
        woken once per batch, not per token: while it is busy, tokens gather (in order)."""
        with self.lock:
            self.pending.append(item)
            if len(self.pending) > 1:
                return  # a wake-up is already on its way and will take this one too
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass

    def _drain(self) -> None:
        with self.lock:
            items, self.pending = self.pending, []
        for item in items:
            self.out.put_nowait(item)


class Engine:
    def __init__(self, session: Session, defaults: Settings, queue_size: int = 128, lru: SnapshotLRU | None = None):
        self.session, self.defaults, self.queue_size = session, defaults, queue_size
        self.lru = lru if lru is not None else SnapshotLRU()
        self.waiting: deque[Job] = deque()
        self.current: Job | None = None
        self.cv = threading.Condition()
        self.closed = False
        self.served = 0
        self.recent: deque[TurnStats] = deque(maxlen=256)  # the last turns run, in order (tests, /health)
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.thread.start()

    @property
    def model(self) -> str:
        return self.session.lm.name

    def submit(self, req: ChatRequest) -> Job:
        """Queue a request; ApiError(503) when the queue is full."""
        job = Job(req, asyncio.get_running_loop())
        with self.cv:
            if len(self.waiting) >= self.queue_size:
                raise ApiError(503, f"the server is busy: {len(self.waiting)} requests are already waiting "
                               "(the queue's limit); retry later", kind="server_error", code="queue_full")
            self.waiting.append(job)
            self.cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it waits, stop its decode if it runs."""
        job.cancelled.set()
        with self.cv:
            if job in self.waiting:
                self.waiting.remove(job)
            elif self.current is job:
                self.session.cancel()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join(timeout=10)

    def queued(self) -> int:
        with self.cv:
            return len(self.waiting)

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.closed:
                    self.cv.wait()
                if self.closed:
                    return
                job = self.current = self.waiting.popleft()
            try:
                if not job.cancelled.is_set():
                    self._serve(job)
            except Exception as e:  # never let one request take the engine down
                job.put(("error", ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")))
                self.lru.forget_live()
            finally:
                with self.cv:
                    self.current = None
                self.served += 1

    def _serve(self, job: Job) -> None:
        s, req = self.session, job.req
        s.settings = replace(self.defaults, **req.settings(), system=s.settings.system)
        swap = self.lru.prepare(s, req.messages, req.isolation)
        t0 = time.perf_counter()
        scanner, text, stats, failed = StopScanner(req.stop), [], None, False
        for ev in s.respond_to(req.messages):
            if job.cancelled.is_set():
                s.cancel()
            match ev:
                case TextDelta(text=t, kind="thinking"):
                    job.put(("delta", {"reasoning_content": t}))
                case TextDelta(text=t):  # the answer, and a tool span as the model wrote it
                    if out := scanner.push(t):
                        text.append(out)
                        job.put(("delta", {"content": out}))
                    if scanner.hit:
                        s.cancel()
                case CacheState(event="undone"):
                    failed = True
                case Error(message=m):
                    job.put(("error", self._refusal(m, failed)))
                    return
                case TurnStats():
                    stats = ev
                    self.recent.append(ev)
        if tail := scanner.flush():
            text.append(tail)
            job.put(("delta", {"content": tail}))
        reply = "".join(text)
        self.lru.remember(req.messages, reply)
        job.put(("done", finish_reason(stats, scanner.hit), *figures(stats, swap, t0), reply))

    def _refusal(self, message: str, failed: bool) -> ApiError:
        """A model that failed mid-turn (the session put the chat back) is the server's fault;
        anything else respond_to refuses is the request's."""
        if failed:
            self.lru.forget_live()
            return ApiError(500, message, kind="server_error")
        code = "context_length_exceeded" if "context holds" in message else None
        return ApiError(400, message, code=code, param="messages")


def finish_reason(st: TurnStats, stopped: bool) -> str:
    if stopped or st.stop == "end":
        return "stop"
    return "length" if st.stop in ("length", "context") else "cancelled"


def figures(st: TurnStats, swap: Swap, t0: float) -> tuple[dict, dict]:
    """The request's `usage` (OpenAI's fields) and `timings` (llama.cpp's names, plus the
    snapshot restore): what a client's cache panel shows."""
    prompt = st.cached_before + st.prefill_tokens
    decode_ms = st.decode_tokens / st.tokens_per_s * 1000 if st.tokens_per_s else 0.0
    timings = {"cache_n": st.cached_before, "prompt_n": st.prefill_tokens, "prompt_ms": round(st.ttft_ms, 3),
               "predicted_n": st.decode_tokens, "predicted_ms": round(decode_ms, 3),
               "predicted_per_second": round(st.tokens_per_s, 2), "restored_n": swap.tokens,
               "restore_ms": round(swap.ms, 3), "total_ms": round((time.perf_counter() - t0) * 1000, 3)}
    return usage(prompt, st.cached_before, st.decode_tokens), timings
