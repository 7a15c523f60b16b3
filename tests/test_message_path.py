"""The message-path tracer (chatapp/bench/message_path.py) sees the files a turn really runs."""

import io
import json


def test_the_tracer_lists_the_files_a_headless_turn_runs(tmp_path, monkeypatch):
    from chatapp.bench.message_path import main

    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path))
    out = io.StringIO()
    assert main(["--model", "random:tiny"], out=out) == 0
    result = json.loads(out.getvalue().splitlines()[-1])
    files = set(result["calls"])
    # the invariant's home, the turn, the generator, the attention and the face are all on it
    assert {"chatapp/chat/session.py", "chatapp/chat/reply.py", "model/decode/generate.py",
            "kvcache/attention.py", "chatapp/headless.py"} <= files
    assert "chatapp/bench/message_path.py" not in files and not any(f.startswith("tests/") for f in files)
    assert result["files"] == len(files) == sum(result["by_folder"].values())
    # every file on it ran at least one line of a function, and no more lines than it holds
    from pathlib import Path

    root = Path(__file__).parents[1]
    assert set(result["lines"]) == files and result["called_lines"] == sum(result["lines"].values())
    assert all(0 < n <= len((root / f).read_text().splitlines()) for f, n in result["lines"].items())
    # the commit is the message's; the ready line, the exit's save and the schema (read at open) are not
    assert "chatapp/store/database.py" in files
    assert not files & {"chatapp/keeper/final_save.py", "chatapp/keeper/keeper.py", "chatapp/chat/stats.py",
                        "chatapp/store/schema.py"}


def test_the_tracer_follows_a_tui_turn_into_the_worker_thread(tmp_path, monkeypatch):
    """Enter pressed in the real app: the keys' handling, the turn worker's session and model,
    and the widgets that draw the reply are all counted (the worker runs on another thread)."""
    from chatapp.bench.message_path import main

    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path))
    out = io.StringIO()
    assert main(["--model", "random:tiny", "--tui"], out=out) == 0
    result = json.loads(out.getvalue().splitlines()[-1])
    files = set(result["calls"])
    assert result["face"] == "tui" and "chatapp/headless.py" not in files
    assert {"chatapp/tui/input.py", "chatapp/tui/bridge.py", "chatapp/tui/transcript.py",
            "chatapp/tui/cache_panel.py", "chatapp/chat/session.py", "model/decode/generate.py",
            "kvcache/cache.py"} <= files
