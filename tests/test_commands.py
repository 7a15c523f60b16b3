"""The one command table: every reader agrees with it, and a command is one entry plus a handler."""

import re
from pathlib import Path

import pytest

import chatapp.chat.commands as commands
from chatapp.chat.commands import TABLE, Command, CommandSpec, help_text, parse_command, parse_input
from chatapp.chat.events import Error, Info
from chatapp.chat.session import Session
from chatapp.chat.settings import DEFAULTS, Settings
from chatapp.keeper.base import Keeper
from chatapp.keeper.keeper import ChatKeeper
from chatapp.remote.keeper import RemoteKeeper
from chatapp.remote.session import RemoteSession
from model.errors import UserError

DOC = Path(__file__).resolve().parents[1] / "docs" / "tui.md"


def doc_rows() -> list[tuple[str, str, bool, str]]:
    text = DOC.read_text()
    block = text.split("<!-- generated from chatapp/chat/commands.py's TABLE")[1].split("<!-- end of commands -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| (.*?) \|$", block, re.M)
    return [(u, h, served.startswith("keeper"), screen.strip("`").removeprefix("action_")) for u, h, served, screen
            in rows]


def test_docs_list_exactly_the_table():
    assert doc_rows() == [(c.usage, c.help, c.store, c.screen) for c in TABLE]


def test_every_handler_exists_where_the_table_says():
    for c in TABLE:
        owner = ChatKeeper if c.store else Session
        assert callable(getattr(owner, c.handler, None)), f"{c.name}: no {owner.__name__}.{c.handler}"
        if c.screen:
            from chatapp.tui.app import ChatApp
            assert callable(getattr(ChatApp, f"action_{c.screen}", None)), c.name


def test_help_lists_every_command_with_its_argument():
    text = help_text()
    for c in TABLE:
        assert re.search(rf"^{re.escape(c.usage)}\s+{re.escape(c.help_for(False))}$", text, re.M), c.name


def test_arguments_are_checked_from_the_table():
    assert parse_command("/undo").name == "/undo"
    assert parse_command("/SAVE  My title ").arg == "My title"
    with pytest.raises(UserError, match="/undo takes no argument"):
        parse_command("/undo now")
    with pytest.raises(UserError, match=r"/system needs an argument: /system TEXT"):
        parse_command("/system")
    with pytest.raises(UserError, match="unknown command /nope"):
        parse_command("/nope")


class EchoSession(Session):
    def echo(self, arg: str):
        yield Info(arg.upper())


def test_a_new_command_is_one_table_entry_plus_its_handler(tiny, monkeypatch):
    spec = CommandSpec("/echo", "say it louder", "TEXT", handler="echo")
    monkeypatch.setattr(commands, "TABLE", [*TABLE, spec])
    monkeypatch.setitem(commands.COMMANDS, "/echo", spec)
    chat = ChatKeeper(EchoSession(tiny, Settings(temperature=0.0, max_new_tokens=4), context=256), None)
    (ev,) = list(chat.run_command("/echo hello"))
    assert ev == Info("HELLO")
    assert "/echo TEXT" in commands.help_text()
    (err,) = list(chat.run_command("/echo"))
    assert isinstance(err, Error) and "needs an argument" in err.message


def test_set_alone_shows_every_setting_and_stats_include_them(tiny):
    chat = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4), context=256), None)
    (info,) = list(chat.run_command("/set"))
    assert info.data == {**DEFAULTS, "temperature": 0.0, "max_new_tokens": 4}
    assert list(chat.run_command("/set top_k=7 seed=3"))[0].data == {"top_k": 7, "seed": 3}
    (info,) = list(chat.run_command("/set"))
    assert info.data["top_k"] == 7 and info.data["seed"] == 3 and set(info.data) == set(DEFAULTS)
    (stats,) = list(chat.run_command("/stats"))
    assert {k: stats.data[k] for k in DEFAULTS} == info.data
    assert "\n  top_k " in stats.text and stats.text.startswith("cache\n")


def test_set_takes_name_value_as_people_type_it(tiny):
    """`/set temperature 0.7` answered "temperature must be a number from 0 to 5, got ''" (issue 44)."""
    chat = ChatKeeper(Session(tiny, Settings(temperature=0.0), context=256), None)
    (info,) = list(chat.run_command("/set temperature 0.7"))
    assert isinstance(info, Info) and info.data == {"temperature": 0.7}
    assert chat.session.settings.temperature == 0.7
    (info,) = list(chat.run_command("/set top_k 50 min_p=0.05 seed = 4"))
    assert info.data == {"top_k": 50, "min_p": 0.05, "seed": 4}
    (info,) = list(chat.run_command("/set max_new_tokens 300"))
    assert chat.session.settings.max_new_tokens == 300
    (info,) = list(chat.run_command("/set max_new_tokens none"))
    assert chat.session.settings.max_new_tokens is None and "max_new_tokens=none" in info.text
    (err,) = list(chat.run_command("/set temperature"))
    assert err == Error("temperature needs a value (a number from 0 to 5): /set temperature VALUE")
    (err,) = list(chat.run_command("/set temperature hot"))
    assert err == Error("temperature must be a number from 0 to 5, got 'hot'")
    assert chat.session.settings.temperature == 0.7  # a refused /set changes nothing


def test_a_line_is_parsed_once_into_a_message_or_a_command():
    assert parse_input("hello /undo") == "hello /undo"
    assert parse_input("//usr/bin/env") == "/usr/bin/env"
    save = Command(commands.COMMANDS["/save"], "Notes")
    assert parse_input("  /SAVE  Notes ") == save == Command.of("/save", "Notes")
    with pytest.raises(UserError, match="unknown command /nope"):
        parse_input("/nope")


def test_one_dispatcher_serves_every_keeper():
    """The keepers share `Keeper.run`; no session parses or dispatches commands of its own."""
    assert ChatKeeper.run is RemoteKeeper.run is Keeper.run
    assert ChatKeeper.run_command is RemoteKeeper.run_command is Keeper.run_command
    assert not hasattr(Session, "run_command") and not hasattr(RemoteSession, "run_command")
