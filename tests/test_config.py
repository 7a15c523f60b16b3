"""The config file (chatapp/config.py), /preset (chatapp/chat/presets.py), /theme, and the
error screen's title and keys."""

import json
import os
import re
import subprocess
import sys

import pytest
from tui_pilot import make_app, notices, ready, until

from chatapp.chat.events import CacheState, Error, Info
from chatapp.config import load_config
from chatapp.launch import open_chat
from chatapp.options import FlagError, chat_parser

GOOD = """model = "random:tiny"
theme = "nord"
[sampling]
temperature = 0.0
min_p = 0.05
repetition_penalty = 1.2
max_new_tokens = 6
[presets]
brief = "Answer in one short sentence."
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "nanochat-tui" / "config.toml"
    path.parent.mkdir()
    monkeypatch.setenv("NANOCHAT_TUI_CONFIG", str(path))
    return path


@pytest.mark.parametrize("text, why", [
    ("temperature = 0.5\n", "unknown key 'temperature' (keys: model, theme"),
    ("[sampling]\ntemperature = 9\n", "[sampling] temperature must be a number from 0 to 5, got '9'"),
    ("[sampling]\ntop_k = \"x\"\n", "[sampling] top_k must be a number, got 'x'"),
    ("[sampling]\nwarmth = 1\n", "unknown setting [sampling] 'warmth'"),
    ("model = 3\n", "model must be a string, got 3"),
    ("[presets]\nempty = \"\"\n", "[presets] empty must be a non-empty string"),
    ("model = \n", "Invalid value (at line 1, column 9)"),
    ("snapshot_budget_mib = -1\n", "snapshot_budget_mib must be a whole number of MiB from 0 to 1,073,741,824, got -1"),
    ("snapshot_budget_mib = \"4 GiB\"\n", "snapshot_budget_mib must be a whole number of MiB from 0 to "
     "1,073,741,824, got '4 GiB'"),
    ("snapshot_budget_mib = 1.5\n", "snapshot_budget_mib must be a whole number of MiB"),
    ("snapshot_budget_mib = true\n", "snapshot_budget_mib must be a whole number of MiB"),
])
def test_a_bad_config_is_one_line_naming_the_file(config, text, why):
    config.write_text(text)
    with pytest.raises(FlagError) as e:
        load_config()
    assert str(e.value).startswith(f"config file {config}: ") and why in str(e.value)
    assert "\n" not in str(e.value)


def test_no_file_is_an_empty_config(config):
    assert load_config().sampling == {} and load_config().presets == {}


def test_defaults_from_the_config_and_flags_over_them(config):
    config.write_text(GOOD)
    k = open_chat(chat_parser().parse_args(["--no-store", "--max-new-tokens", "3"]))
    s = k.session.settings
    assert k.session.lm.name == "random:tiny"
    assert (s.temperature, s.min_p, s.repetition_penalty, s.max_new_tokens) == (0.0, 0.05, 1.2, 3)


def test_the_snapshot_budget_is_set_in_the_config_and_shown_by_stats(config):
    """Issue 44: the KV snapshots' disk budget was a constant named only in docs/persistence.md."""
    stats = next(iter(open_chat(chat_parser().parse_args(["--model", "random:tiny"])).run_command("/stats")))
    assert stats.data["snapshot_budget_bytes"] == 4 << 30 and re.search(r"snapshot_budget +4.0 GiB", stats.text)
    assert "snapshot_budget" not in next(iter(open_chat(chat_parser().parse_args(
        ["--model", "random:tiny", "--no-store"])).run_command("/stats"))).data  # nothing stored: no budget
    config.write_text("snapshot_budget_mib = 0\n" + GOOD)
    k = open_chat(chat_parser().parse_args([]))
    assert k.store.snapshot_budget == 0 and next(iter(k.run_command("/stats"))).data["snapshot_budget_bytes"] == 0
    list(k.send("first chat"))
    first = k.store.snapshot_dir(k.chat_id)
    assert any(first.iterdir())
    list(k.run_command("/reset"))
    list(k.send("second chat"))  # its snapshot is written, and the budget of 0 keeps only the open chat's
    assert not first.exists() and any(k.store.snapshot_dir(k.chat_id).iterdir())


def test_presets_save_choose_and_delete(config, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    config.write_text(GOOD)
    k = open_chat(chat_parser().parse_args(["--no-store"]))
    listed = list(k.run_command("/preset"))
    assert isinstance(listed[0], Info) and "brief: Answer in one short sentence." in listed[0].text
    events = list(k.run_command("/preset brief"))
    assert any(isinstance(e, CacheState) and e.event == "system" for e in events)
    assert k.session.system == "Answer in one short sentence."
    list(k.run_command("/system You speak like a pirate."))
    assert not [e for e in k.run_command("/preset save pirate") if isinstance(e, Error)]
    assert json.loads((tmp_path / "home" / "presets.json").read_text()) == {"pirate": "You speak like a pirate."}
    list(k.run_command("/preset brief"))
    list(k.run_command("/preset pirate"))
    assert k.session.system == "You speak like a pirate."
    refusals = [next(iter(k.run_command(line))) for line in
                ("/preset nope", "/preset save brief", "/preset save bad name!", "/preset delete brief")]
    assert all(isinstance(e, Error) for e in refusals)
    assert "no preset 'nope' (presets: brief, pirate)" in refusals[0].message
    assert "defined in the config file" in refusals[1].message
    list(k.run_command("/preset delete pirate"))
    assert "pirate" not in k.presets.all()


def test_headless_reads_the_config_and_refuses_a_bad_one(config):
    config.write_text(GOOD)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless"]
    p = subprocess.run(cmd, input=b"/set\n/theme nord\n", capture_output=True, timeout=120, env=env)
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert events[1]["data"]["repetition_penalty"] == 1.2 and events[1]["data"]["max_new_tokens"] == 6
    assert events[2]["event"] == "error" and "themes belong to the TUI" in events[2]["message"]
    config.write_text("[sampling]\nmin_p = 2\n")
    p = subprocess.run(cmd, input=b"", capture_output=True, timeout=120, env=env)
    assert p.returncode != 0 and "[sampling] min_p must be a number from 0 to 1 (0 = off), got '2'" in p.stderr.decode()
    assert "Traceback" not in p.stderr.decode()


@pytest.mark.anyio
async def test_theme_from_the_config_then_slash_theme(config):
    config.write_text('theme = "nord"\n')
    app = make_app("--no-store")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.theme == "nord"
        for line in ("/theme gruvbox", "/theme nope"):  # the app serves it: no turn to wait for
            await pilot.press(*line, "enter")
            await pilot.pause()
            assert app.theme == "gruvbox"
        await pilot.press(*"/theme", "enter")  # the picker
        await until(pilot, lambda: type(app.screen).__name__ == "CommandPalette", what="the theme picker")


@pytest.mark.anyio
async def test_a_bad_flag_is_one_line_with_its_own_title_and_the_app_stays_up():
    app = make_app("--context", "0")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.loading.failed, what="the load to fail")
        await pilot.pause()
        errors = notices(app, "error")
        assert len(errors) == 1 and "\n" not in errors[0], errors
        assert errors[0].startswith("A setting is not valid: --context must be at least 16"), errors
        await pilot.press(*"hello", "enter")  # no model: the message stays in the box
        await pilot.pause()
        assert app.input.text == "hello" and app.session is None
        await pilot.press("ctrl+q")
    assert app.return_code == 0
