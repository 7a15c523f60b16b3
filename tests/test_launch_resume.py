"""--resume and --chat load the stored chat's own model first: one load, not the flags' model
and then the chat's (chatapp/launch.py's load_first)."""

from __future__ import annotations

from helpers import talk

from chatapp.launch import open_keeper, open_session, stored_chat_model
from chatapp.options import chat_parser


def args(*argv: str):
    return chat_parser().parse_args(["--max-new-tokens", "4", "--temperature", "0", *argv])


def test_resume_opens_the_session_on_the_chats_own_model_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_CHATS", str(tmp_path / "chats"))
    made = args("--model", "random:tiny-qwen3")
    k = open_keeper(open_session(made), made)
    talk(k, "hello there")
    k.store.close()

    again = args("--model", "random:tiny", "--resume")
    assert stored_chat_model(again) == "random:tiny-qwen3"
    session = open_session(again)  # before the keeper reopens the chat: already its model
    assert session.lm.name == "random:tiny-qwen3" and session.settings.model == "random:tiny-qwen3"
    k2 = open_keeper(session, again)
    assert k2.session is session  # the reopen kept this session: no second model was loaded
    assert k2.restored.restored_tokens == session.cache.seqlen > 0 and k2.restored.detail == ""
    talk(k2, "and again")

    assert stored_chat_model(args("--model", "random:tiny")) is None  # no --resume: the flags' model
    assert stored_chat_model(args("--resume", "--no-store")) is None
