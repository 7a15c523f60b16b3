"""`--backend URL`: headless mode and the TUI chatting through `nanochat-tui serve` on loopback
(started here, on random:tiny), the commands that make sense and those that say why not, the
server's figures in the panel, and the failures: refused connection, timeout, a server gone
mid-reply (the partial reply stays)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading

import pytest
from helpers import running

from chatapp.chat.events import CacheState, Error, TextDelta, TurnStats
from chatapp.chat.settings import Settings
from chatapp.options import chat_parser
from chatapp.remote.client import OpenAIClient
from chatapp.remote.keeper import RemoteKeeper
from chatapp.remote.open import open_remote
from chatapp.remote.session import RemoteSession
from chatapp.remote.wire import Figures, read_figures
from model.errors import UserError


@pytest.fixture(scope="module")
def served(tiny):
    with running(tiny, max_new_tokens=4) as (server, engine):
        yield server, engine


def headless(url: str, lines: list[str], *flags: str) -> tuple[list[dict], str]:
    r = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--backend", url, "--temperature", "0",
                        "--max-new-tokens", "4", *flags], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()], r.stderr


def test_headless_chats_through_serve_with_the_commands_that_make_sense(served, tmp_path):
    out = tmp_path / "chat.md"
    evs, _ = headless(served[0].url, ["hello", "second", "/retry", "/undo", "/model other", "/set seed=3",
                                      "/copy", f"/export {out}", "/save kept", "/edit 1 again", "/system be terse",
                                      "/load"])
    kinds = [e["event"] for e in evs]
    assert kinds == ["ready", "turn", "turn", "retry", "turn", "undo", "error", "info", "copy", "info", "saved",
                     "edit", "turn", "system", "load"]
    ready, t1, t2 = evs[0], evs[1], evs[2]
    assert ready["model"] == f"random:tiny @ {served[0].url}" and ready["capacity"] == 512
    # the server's figures: turn 2 reuses all of turn 1 (prompt + reply) from its cache
    assert t1["cached_before"] == 0 and t1["decode_tokens"] == 4
    assert t2["cached_before"] == t1["cache_seqlens"] and t2["prefill_tokens"] > 0
    assert t2["ttft_ms"] > 0 and t2["backend"] == "remote"
    assert evs[6]["message"].startswith("/model: not with --backend:")
    assert evs[8]["text"] == t1["reply"] and t1["reply"] in out.read_text()
    assert evs[10]["title"] == "kept" and evs[10]["messages"] == 2
    assert evs[12]["user"] == "again"
    assert evs[14]["messages"] == 2 and evs[14]["chat"] == evs[10]["chat"]  # /load opens the saved chat


def test_a_server_that_cannot_be_reached_is_one_line():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}/v1"
    port.close()
    with pytest.raises(UserError) as e:
        open_remote(chat_parser().parse_args(["--backend", url, "--no-store"]), warn=print)
    assert str(e.value) == f"--backend: cannot reach the server at {url} (ConnectError); is it running?"


def test_resume_reopens_the_last_chat_through_the_server(served):
    url = served[0].url
    first = open_remote(chat_parser().parse_args(["--backend", url, "--temperature", "0", "--max-new-tokens", "3"]),
                        warn=print)
    turn = [e for e in first.send("remember me") if isinstance(e, TurnStats)][0]
    again = open_remote(chat_parser().parse_args(["--backend", url, "--resume", "--max-new-tokens", "3"]), warn=print)
    assert again.chat_id == first.chat_id and again.restored is not None
    assert [(ex.user, ex.reply) for ex in again.session.exchanges] == [("remember me", turn.reply)]
    nxt = [e for e in again.send("and now?") if isinstance(e, TurnStats)][0]
    assert nxt.turn == 2 and nxt.cached_before == turn.cache_seqlens  # the server still held the chat
    with pytest.raises(UserError, match="--model is for the in-process model"):
        open_remote(chat_parser().parse_args(["--backend", url, "--model", "random:tiny"]), warn=print)


def session_on(url: str, timeout: float = 30.0) -> RemoteSession:
    client = OpenAIClient(url, timeout=timeout)
    return RemoteSession(client, "x", Settings(temperature=0, max_new_tokens=1500), context=512)


def cut_after(upstream: tuple, nbytes: int) -> socket.socket:
    """A loopback relay to `upstream` that drops both connections once `nbytes` of the answer
    have passed: to the client, the server went away mid-reply."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def ask(client, up):
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                up.sendall(data)

    def relay():
        client, _ = lsock.accept()
        with client, socket.create_connection(upstream) as up:
            threading.Thread(target=ask, args=(client, up), daemon=True).start()
            sent = 0
            while sent < nbytes and (data := up.recv(512)):
                client.sendall(data)
                sent += len(data)
            client.shutdown(socket.SHUT_RDWR)
    threading.Thread(target=relay, daemon=True).start()
    return lsock


def test_a_server_gone_mid_reply_leaves_one_line_and_the_partial_reply(served):
    relay = cut_after(served[0].sock.getsockname()[:2], 1500)
    keeper = RemoteKeeper(session_on(f"http://127.0.0.1:{relay.getsockname()[1]}"), None)
    events = list(keeper.send("talk for a long time"))
    relay.close()
    stats = [e for e in events if isinstance(e, TurnStats)]
    errors = [e for e in events if isinstance(e, Error)]
    assert len(stats) == 1 and stats[0].stop == "error" and stats[0].reply
    assert len(errors) == 1 and "went away mid-reply" in errors[0].message and "\n" not in errors[0].message
    assert keeper.session.exchanges[0].reply == stats[0].reply  # the partial reply is the chat's
    # nobody listens there now: the next message is refused in one line and taken back
    events = list(keeper.send("anyone?"))
    assert isinstance(events[0], CacheState) and events[0].event == "undone"
    assert "cannot reach the server" in events[1].message and len(keeper.session.exchanges) == 1


def test_esc_closes_the_stream_and_the_server_stops_its_decode(served):
    server, engine = served
    s = session_on(server.url)
    events = []
    for ev in s.send("go on and on"):
        events.append(ev)
        if isinstance(ev, TextDelta):
            s.cancel()  # what Esc does in the TUI
    st = events[-1]
    assert isinstance(st, TurnStats) and st.stop == "cancel" and s.exchanges[0].reply == st.reply
    wait = threading.Event()
    for _ in range(300):  # the server notices the closed stream at its next token
        if engine.current is None and engine.recent[-1].user == "go on and on":
            break
        wait.wait(0.02)
    last = engine.recent[-1]
    assert last.user == "go on and on" and last.stop == "cancel" and last.decode_tokens < 1500


def test_a_server_that_does_not_answer_times_out_in_one_line():
    with socket.socket() as mute:  # accepts, reads, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)
        s = session_on(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout=0.5)
        events = list(s.send("hello?"))
    assert [type(e) for e in events] == [CacheState, Error]
    assert events[1].message.endswith("did not answer within 0.5 s") and s.exchanges == []


def test_cached_tokens_are_read_from_vllm_and_llama_cpp_usage_fields():
    vllm, llama, old = Figures(), Figures(), Figures()
    read_figures({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 9,
                                           "prompt_tokens_details": {"cached_tokens": 96}}}, vllm)
    read_figures({"choices": [{"finish_reason": "stop", "delta": {}}],
                  "timings": {"cache_n": 80, "prompt_n": 12, "predicted_n": 7, "predicted_per_second": 51.5}}, llama)
    read_figures({"choices": [], "tokens_cached": 33, "usage": {"prompt_tokens": 40}}, old)
    assert (vllm.prompt_tokens, vllm.cached_tokens, vllm.completion_tokens) == (120, 96, 9)
    assert (llama.prompt_tokens, llama.cached_tokens, llama.completion_tokens) == (92, 80, 7)
    assert llama.finish == "stop" and llama.server_tokens_per_s == 51.5
    assert (old.prompt_tokens, old.cached_tokens) == (40, 33)


@pytest.mark.anyio
async def test_the_tui_chats_through_serve_and_shows_the_servers_figures(served):
    from tui_pilot import ready, replies, row, submit

    from chatapp.tui.app import ChatApp

    args = chat_parser().parse_args(["--backend", served[0].url, "--no-store", "--temperature", "0",
                                     "--max-new-tokens", "4"])
    app = ChatApp(args)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await submit(pilot, "hi there")
        await submit(pilot, "and more")
        first, second = app.session.turn_stats
        assert replies(app) == [ex.reply for ex in app.session.exchanges]
        assert second.cached_before == first.cache_seqlens > 0
        assert row(app, "cached") == f"{second.cached_before} reused"
        assert row(app, "prefill") == f"{second.prefill_tokens} new"
        assert row(app, "model") == f"random:tiny @ {served[0].url}"
        # the server's own figures: its name, its cache's length and context; no blank shape or 0 B of K/V
        assert row(app, "backend") == "nanochat-tui" and row(app, "device") == "remote"
        assert row(app, "cache_seqlens") == f"{second.cache_seqlens} / {served[1].session.cache.capacity}"
        assert not any(app.panel.row(id).display for id in ("shape", "dtype", "weights", "kv_used", "kv_allocated"))
        await submit(pilot, "/model x")
        assert any("not with --backend" in n for n in app_notices(app))


def app_notices(app) -> list[str]:
    from tui_pilot import notices

    return notices(app)


def test_a_backend_chat_refuses_what_it_does_not_serve_in_one_line():
    """Commands go through the one dispatcher (chatapp/keeper/base.py): /preset has no handler in
    a --backend chat (it used to end in an AttributeError) and /model is refused by its own."""
    keeper = RemoteKeeper(session_on("http://127.0.0.1:9"), None)  # nothing is sent: no server needed
    assert list(keeper.run_command("/preset brief")) == [Error("/preset: not with --backend")]
    (err,) = keeper.run_command("/model other")
    assert err.message.startswith("/model: not with --backend:")
    (state,) = keeper.run_command("/reset")
    assert isinstance(state, CacheState) and state.event == "reset"


def test_headless_mode_over_a_backend_imports_no_torch():
    """`--backend` runs no model here: headless mode and the remote keeper load without torch
    (headless takes any keeper, chatapp/keeper/base.py, not the in-process one's module)."""
    code = "import sys, chatapp.headless, chatapp.remote.open; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
