"""What the app costs outside its speed: resident memory after a turn, load-to-ready time, disk.

Memory and load time come from a real headless chat in a child process (`python -m chatapp.cli
--headless`), so they are what a user's process holds, not what the bench's own process (with
its benchmark caches) happens to hold. A child's peak RSS comes from the kernel's accounting of
that one child's memory map (/proc/PID/status VmHWM, read until it exits), so the same helper
measures the llama.cpp peer too. (`getrusage`'s ru_maxrss will not do: on Linux a child spawned
by vfork carries the spawning process's high-water mark through exec, here the bench's own.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MESSAGE = "Hello! In two sentences, what is the capital of France known for?"


def dir_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _status_bytes(pid: int, field: str) -> int | None:
    """A memory line of the child's /proc/PID/status (VmRSS, VmHWM) in bytes; None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class PeakWatch:
    """Reads a child's VmHWM (its peak resident set, which only grows) every `period` seconds
    until the child is reaped; `peak` is the last value read."""

    def __init__(self, pid: int, period: float = 0.05):
        self.pid, self.period, self.peak = pid, period, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(self.period)

    def read(self) -> None:
        hwm = _status_bytes(self.pid, "VmHWM")
        if hwm is not None:  # after the exit, a zombie's status has no memory lines
            self.peak = max(self.peak or 0, hwm)

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join()
        return self.peak


def _reap(p: subprocess.Popen, watch: PeakWatch) -> tuple[int, int | None]:
    """(exit code, peak RSS in bytes) of a child that is exiting."""
    watch.read()
    p.wait()
    return p.returncode, watch.stop()


def run_measured(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run `cmd` to its end: {"rc", "stdout", "stderr", "peak_rss_bytes", "seconds"}. Killed after
    `timeout` seconds (then "timed_out" is True)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
        watch, killed = PeakWatch(p.pid), threading.Event()
        timer = threading.Timer(timeout, lambda: (killed.set(), p.kill()))
        timer.start()
        try:
            out = p.stdout.read()
            rc, rss = _reap(p, watch)
        finally:
            timer.cancel()
            watch.stop()
            p.stdout.close()
        err.seek(0)
        return {"rc": rc, "stdout": out.decode("utf-8", "replace"), "stderr": err.read().decode("utf-8", "replace"),
                "peak_rss_bytes": rss, "seconds": time.perf_counter() - t0, "timed_out": killed.is_set()}


def headless_turn(model: str, threads: int, reply_tokens: int = 32, timeout: float = 300) -> dict:
    """One greedy turn of a real headless chat at the model's default context, no store:
    load-to-ready seconds (spawn to the `ready` line: interpreter, imports and model load),
    the turn's TTFT, RSS right after the turn, and the child's peak RSS."""
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--no-store", "--device", "cpu", "--model", model,
           "--temperature", "0", "--max-new-tokens", str(reply_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        watch = PeakWatch(p.pid)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        res: dict = {"command": " ".join(cmd[1:])}
        try:
            for raw in p.stdout:
                ev = json.loads(raw)
                if ev.get("event") == "ready":
                    res["ready_s"] = time.perf_counter() - t0
                    res["context"] = ev.get("capacity")
                    p.stdin.write((MESSAGE + "\n").encode())
                    p.stdin.flush()
                elif ev.get("event") in ("turn", "error"):
                    res["rss_after_turn_bytes"] = _status_bytes(p.pid, "VmRSS")
                    watch.read()
                    res["ttft_ms"] = ev.get("ttft_ms")
                    if ev["event"] == "error":
                        res["error"] = ev.get("message")
                    break
        except (BrokenPipeError, json.JSONDecodeError) as e:  # it died, or wrote something not JSON
            res["error"] = f"{type(e).__name__}: {e}"
        try:
            p.stdin.close()
            p.stdout.read()
            rc, peak = _reap(p, watch)
        except BrokenPipeError:
            rc, peak = _reap(p, watch)
        finally:
            timer.cancel()
            watch.stop()
            p.stdout.close()
        err.seek(0)
        res.update(rc=rc, peak_rss_bytes=peak)
        if rc != 0 or "ready_s" not in res or "error" in res:
            res["skipped"] = (res.get("error") or err.read().decode("utf-8", "replace").strip()[-300:]
                              or f"exit code {rc}")
        return res
