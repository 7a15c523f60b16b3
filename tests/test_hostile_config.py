"""Issue 45 findings 7 and 9: config.toml goes through the one regular-file gate, and its TOML is
parsed within a size and a shape cap. Each hostile case is one line naming the file, at once."""

from __future__ import annotations

import os
import threading
import time

import pytest

from chatapp.config import load_config
from chatapp.options import FlagError


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setenv("NANOCHAT_TUI_CONFIG", str(path))
    return path


def refusal(config) -> str:
    """load_config's one-line refusal, in a thread: a blocked read fails the test instead of hanging it."""
    out: list = []

    def run():
        try:
            out.append(load_config())
        except FlagError as e:
            out.append(e)
    t0 = time.perf_counter()
    threading.Thread(target=run, daemon=True).start()
    while not out and time.perf_counter() - t0 < 60:  # generous: a shared machine is slow, a hang endless
        time.sleep(0.01)
    assert out, "load_config hung"
    assert isinstance(out[0], FlagError), out[0]
    msg = str(out[0])
    assert msg.startswith(f"config file {config}") and "\n" not in msg
    return msg


def test_a_fifo_config_is_refused_without_blocking(config):
    os.mkfifo(config)
    assert "a FIFO, not a regular file" in refusal(config)


def test_a_config_linked_to_dev_zero_is_never_read(config):
    config.symlink_to("/dev/zero")  # read 3.1 GB, then MemoryError
    assert "a character device, not a regular file" in refusal(config)


def test_a_config_over_the_size_cap_is_never_read(config):
    config.write_text("# " + "x" * (2 << 20) + "\n")
    assert "too large for a config file" in refusal(config)


@pytest.mark.parametrize("text", [
    "a = " + "{b = " * 100_000 + "1" + "}" * 100_000,      # 100,000 nested tables: RecursionError
    "a = " + "[" * 100_000 + "]" * 100_000,
    "a" + ".a" * 99_999 + " = 1\n",                        # 100,000 dotted-key parts: >30 s, 3.1 GB
    "[" + "a." * 99_999 + "a]\n",
], ids=["inline-tables", "arrays", "dotted-key", "dotted-header"])
def test_nested_and_dotted_keys_past_the_cap_are_refused_before_parsing(config, text):
    config.write_text(text)
    assert "too many nested or dotted keys" in refusal(config)


def test_a_5000_digit_integer_is_one_line(config):
    config.write_text("[sampling]\nmax_new_tokens = " + "9" * 5000 + "\n")  # ValueError: int digits limit
    assert "not a usable config (ValueError" in refusal(config)


def test_dots_quotes_and_brackets_inside_strings_are_not_structure(config):
    """The shape count skips strings and comments: a long prompt full of dots still loads (the
    comment and the strings hold several times the cap's 1,000 dots and brackets)."""
    prompt = "Be brief. " * 3000 + "[x] {y} 'q' \\\" # not a comment"
    config.write_text(
        f'system = "{prompt.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"\n'
        "# a comment with dots . . . [ { " + ". " * 5000 + "\n"
        "[presets]\n"
        f"long = '''{'...[{' * 2000}\n'''\n"
        f'multi = """{"a.b " * 2000}\\""""\n'
        f"\"dotted.name.{'x.' * 10}\" = 'literal \\ with a backslash...'\n"
        "[sampling]\ntemperature = 0.5\nmin_p = 0.05\n")
    cfg = load_config()
    assert cfg.system == prompt and cfg.sampling["temperature"] == 0.5
    assert cfg.presets["long"] == "...[{" * 2000 + "\n" and cfg.presets["multi"] == "a.b " * 2000 + '"'
    assert cfg.presets[f"dotted.name.{'x.' * 10}"] == "literal \\ with a backslash..."
