"""One resolver for every way of naming a model (chatapp/pull/resolve.py), and a chat that
reopens on the model it was made with (chatapp/keeper/chat_model.py)."""

from pathlib import Path

import pytest
from gemma_tiny import save_tiny
from test_snapshot import talk

from chatapp.chat.events import Error, ModelSwitched
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.models import choices
from chatapp.launch import open_keeper, open_session
from chatapp.options import chat_parser
from chatapp.pull import fetch
from chatapp.pull.resolve import resolve
from chatapp.store.database import ChatStore
from model.errors import UserError


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A model cache where a tiny Gemma is installed as the pulled `gemma3-270m`."""
    home = tmp_path_factory.mktemp("home")
    save_tiny(home / "models" / "gemma3-270m")
    return home


@pytest.fixture
def pulled(home, monkeypatch) -> Path:
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(home))
    monkeypatch.setattr(fetch, "pull", lambda *a, **k: pytest.fail("pulled although installed"))
    return home / "models" / "gemma3-270m"


def test_a_pulled_name_resolves_the_same_from_every_side(pulled, tmp_path):
    r = resolve("gemma3-270m")
    assert (r.spec, r.path) == ("gemma3-270m", str(pulled))
    assert resolve(str(pulled)).spec == "gemma3-270m"  # its folder is recorded by name: portable
    assert resolve("  Gemma3-270M ").spec == "gemma3-270m"
    listed = {c.spec: c.note for c in choices(tmp_path)}
    assert listed["gemma3-270m"] == "pulled; a base model: completion mode (it continues your text; not tuned to chat)"
    assert resolve("random:tiny").spec == "random:tiny"


def test_unknown_and_unpulled_names_say_what_is_expected(pulled, monkeypatch):
    with pytest.raises(UserError, match=r"model not found: no-such \(.*gemma3-270m.*random:tiny"):
        resolve("no-such")
    with pytest.raises(UserError, match="empty"):
        resolve("  ")
    monkeypatch.setattr(fetch, "is_installed", lambda p: False)
    with pytest.raises(UserError, match=r"smollm2-135m-instruct is not pulled \(nanochat-tui pull"):
        resolve("default", pull=False)


def test_slash_model_takes_a_pulled_name_and_the_chat_records_it(pulled, tiny, tmp_path):
    k = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4, model="random:tiny")),
                   ChatStore(tmp_path / "chats"))
    talk(k, "hello")
    events = list(k.run_command("/model gemma3-270m"))
    assert not [e for e in events if isinstance(e, Error)], events
    assert any(isinstance(e, ModelSwitched) for e in events)
    assert k.session.settings.model == "gemma3-270m"
    assert k.store.get(k.chat_id).settings["model"] == "gemma3-270m"


def args(*argv: str):
    return chat_parser().parse_args(["--max-new-tokens", "4", "--temperature", "0", *argv])


def test_resume_reopens_the_chat_on_its_own_model(pulled, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_CHATS", str(tmp_path / "chats"))
    made = open_keeper(open_session(args("--model", "gemma3-270m")), args("--model", "gemma3-270m"))
    talk(made, "hi there")
    gemma_name = made.session.lm.name
    # The next run names another model (or none): --resume brings the Gemma back.
    again = args("--model", "random:tiny", "--resume", "--top-k", "7")
    k = open_keeper(open_session(again), again)
    assert k.session.lm.name == gemma_name and k.session.settings.model == "gemma3-270m"
    assert k.session.settings.top_k == 7  # the flags typed go to the session the chat opened on
    assert k.restored.detail == "" and k.restored.restored_tokens == k.session.cache.seqlen > 0  # its own snapshot
    assert k.session.settings.system is None  # the default system prompt stays the model's
    talk(k, "and again")


def test_a_missing_model_is_named_and_the_chat_opens_on_the_current_one(pulled, tiny, tmp_path):
    store = ChatStore(tmp_path / "chats")
    k = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4, model="/gone/model.gguf")), store)
    talk(k, "hello")
    other = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4, model="random:tiny")), store)
    restored, errors = other.open(k.chat_id)
    assert not errors and other.session.lm is tiny
    assert "made with /gone/model.gguf, which is not available here; it opens on random:tiny" in restored.line
