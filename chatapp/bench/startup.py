"""`nanochat-tui bench --startup`: how long the TUI takes to open, as its user sees it.

The real app (`python -m chatapp.cli`) runs in a pseudo-terminal; its screen output, escape
sequences stripped, is watched for the input box's two placeholders (chatapp/tui/loading.py):
the one it shows while the model loads (the box takes text: "usable") and the one it shows once
the model is ready. Then Ctrl+Q. Each figure is the median of `--reps` launches, with the
process's CPU seconds at that moment (from /proc: the machine's load inflates the wall time,
much less the CPU time), beside `python -c pass` and the load average measured in the same run,
for scale. Warm: the first launch (not counted) has just read the same files.

`--resume` launches open the latest chat of a store seeded by a headless chat of two short
turns (its own folder: the user's chats are not touched).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from chatapp.tui.loading import READY, WAITING
from model.errors import UserError

# CSI sequences, OSC and DCS strings, charset and one-byte escapes: what a terminal draws nothing for
ESCAPES = re.compile(rb"\x1b(\[[0-9;?<>=$]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|P[^\x1b]*\x1b\\"
                     rb"|[()][A-Z0-9]|[=>78DEHMNOc])")
SIZE = (120, 36)
CTRL_Q = b"\x11"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def screen_times(argv: list[str], marks: dict[str, str], env: dict[str, str], size: tuple[int, int] = SIZE,
                 timeout: float = 300) -> dict[str, tuple[float, float]]:
    """(seconds since the spawn, the process's CPU seconds) at which each mark's text was first on
    the screen; a mark never drawn within `timeout` is missing."""
    t0 = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app, on the pty
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    seen: dict[str, tuple[float, float]] = {}
    screen = b""
    try:
        while len(seen) < len(marks) and time.monotonic() - t0 < timeout:
            if not select.select([fd], [], [], 0.2)[0]:
                continue
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # the app exited
                break
            now = time.monotonic() - t0
            screen += data
            text = ESCAPES.sub(b"", screen).decode("utf-8", "replace")
            for name, mark in marks.items():
                if name not in seen and mark in text:
                    seen[name] = (now, cpu_seconds(pid))
        os.write(fd, CTRL_Q)
        drain(fd, 30)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return seen


def drain(fd: int, timeout: float) -> None:
    """Read the pty until the app has exited (it closes its end) or `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                if not os.read(fd, 1 << 16):
                    return
            except OSError:
                return


def python_pass_s(reps: int) -> float:
    """The median wall time of `python -c pass`: the machine's own speed right now."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def seed_chat(model_args: list[str], env: dict[str, str]) -> None:
    """A stored chat of two short turns, for --resume to open."""
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", *model_args, "--temperature", "0",
           "--max-new-tokens", "8"]
    done = subprocess.run(cmd, input=b"Hello!\nWhat is 2+2?\n", env=env, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise UserError(f"bench --startup: seeding a chat failed: {done.stderr.decode(errors='replace')[-300:]}")


def launches(extra: list[str], env: dict[str, str], reps: int) -> dict:
    """The median of `reps` warm launches (one more, first, not counted)."""
    argv = [sys.executable, "-m", "chatapp.cli", *extra]
    runs = [screen_times(argv, {"input": WAITING, "ready": READY}, env) for _ in range(reps + 1)][1:]
    res: dict = {"command": " ".join(["nanochat-tui", *extra]), "runs": len(runs)}
    for mark in ("input", "ready"):
        got = [r[mark] for r in runs if mark in r]
        if len(got) < len(runs):
            res["skipped"] = f"{mark!r} was not drawn in {len(runs) - len(got)} of {len(runs)} launches"
            return res
        res[f"{mark}_s"] = statistics.median(w for w, _ in got)
        res[f"{mark}_cpu_s"] = statistics.median(c for _, c in got)
    return res


def startup(model: str | None, reps: int) -> dict:
    model_args = ["--model", model] if model else []
    with tempfile.TemporaryDirectory(prefix="nanochat-startup-") as chats:
        env = {**os.environ, "NANOCHAT_TUI_CHATS": chats, "TERM": os.environ.get("TERM", "xterm-256color")}
        load = os.getloadavg()
        res = {"model": model or "default", "python_pass_s": python_pass_s(5),
               "warm": launches(model_args, env, reps)}
        seed_chat(model_args, env)
        res["resume"] = launches([*model_args, "--resume"], env, reps)
        res["python_pass_s_after"] = python_pass_s(5)
        res["load_average"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    return res


def print_startup(res: dict) -> None:
    print(f"TUI start-up, {res['model']} (median of {res['warm']['runs']} warm launches; "
          f"python -c pass {res['python_pass_s'] * 1000:.0f} ms before, {res['python_pass_s_after'] * 1000:.0f} ms "
          f"after; load average {res['load_average'][:3]} before, {res['load_average'][3:]} after)")
    for name, label in (("warm", "start"), ("resume", "start --resume")):
        r = res[name]
        if "skipped" in r:
            print(f"  {label}: skipped: {r['skipped']}")
            continue
        print(f"  {label:<15} input box usable {r['input_s']:.2f} s (CPU {r['input_cpu_s']:.2f} s), "
              f"model ready {r['ready_s']:.2f} s (CPU {r['ready_cpu_s']:.2f} s)")
    if "skipped" not in res["warm"] and "skipped" not in res["resume"]:
        print(f"  --resume adds {res['resume']['ready_s'] - res['warm']['ready_s']:+.2f} s to the model ready")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nanochat-tui bench --startup", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="the model spec (default: the default model)")
    p.add_argument("--reps", type=int, default=3, help="launches per figure, after one not counted (default 3)")
    args = p.parse_args(argv)
    res = startup(args.model, max(1, args.reps))
    print_startup(res)
    print(json.dumps({"startup": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
