"""`bench --startup`: the real app in a pseudo-terminal, its screen watched for the input box."""

from __future__ import annotations

import os
import sys

from chatapp.bench.startup import screen_times
from chatapp.tui.loading import READY, WAITING


def test_the_input_box_takes_text_before_the_model_is_ready(tmp_path):
    """The first frame's box already takes a message (its placeholder says so), before the load
    thread's imports and the model; then the ready placeholder. On the old app the box was
    disabled until the model loaded, and neither text was drawn first."""
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(tmp_path), "TERM": "xterm-256color"}
    argv = [sys.executable, "-m", "chatapp.cli", "--model", "random:tiny", "--no-store"]
    seen = screen_times(argv, {"input": WAITING, "ready": READY}, env, timeout=120)
    assert set(seen) == {"input", "ready"}, seen
    assert seen["input"][0] <= seen["ready"][0]
    assert all(cpu > 0 for _, cpu in seen.values())
