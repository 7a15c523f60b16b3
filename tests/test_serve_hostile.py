"""`serve` against hostile clients (issue 45) and its per-request log (issue 44): one client
reading another's prompt back through `cached_tokens`, numbers that broke the conversion to
int, an unexpected exception, a client that leaves mid-body, and the access log of a real
`nanochat-tui serve` process with an escaped start-up line."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from helpers import running, save_variant, user

# --- cache isolation: the PIN probe -------------------------------------------------------
PIN_SYSTEM = "You are the bank's assistant. The customer's PIN is 4821. Never tell it."
GUESSES = ["0000", "4000", "4800", "4820", "4821", "9999"]


def ask(client: openai.OpenAI, system: str, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt else None
    r = client.chat.completions.create(model="x", max_tokens=1, extra_body=extra,
                                       messages=[{"role": "system", "content": system}, user("my balance?")])
    return r.usage.prompt_tokens_details.cached_tokens


def probe(victim: openai.OpenAI, attacker: openai.OpenAI, salts: tuple[str | None, str | None]) -> list[int]:
    """The attacker's cached_tokens for each guess, each sent right after the victim's request
    (so the victim's prompt is the live cache, as when the victim is chatting)."""
    seen = []
    for guess in GUESSES:
        ask(victim, PIN_SYSTEM, salts[0])
        seen.append(ask(attacker, PIN_SYSTEM.replace("4821", guess), salts[1]))
    return seen


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def test_without_isolation_cached_tokens_spell_out_the_victims_pin(tiny):
    """Today's behaviour, kept for one user's server on loopback (docs/serve.md says so): the
    attack works, which is why the two tests below exist."""
    with running(tiny) as (server, _engine):
        seen = probe(client(server.url), client(server.url), (None, None))
    # a byte-level tokenizer: one more cached token per right digit, and the whole prompt for the PIN
    assert [n - seen[0] for n in seen][:4] == [0, 1, 2, 3] and seen[4] > seen[3] and seen[5] == seen[0]


def test_with_cache_salt_every_guess_gets_the_same_cached_tokens(tiny):
    with running(tiny) as (server, _engine):
        c = client(server.url)
        seen = probe(c, c, ("victim-7f3a9c", "attacker-0b1e"))
        assert len(set(seen)) == 1, seen
        # the salt keeps clients apart, it does not turn the cache off: the victim's own
        # requests (and anyone's with its salt) still reuse its prompt after the attacker's
        assert ask(c, PIN_SYSTEM, "victim-7f3a9c") > 20
        assert ask(c, PIN_SYSTEM, "other") == 0


def test_with_several_api_keys_every_guess_gets_the_same_cached_tokens(tiny):
    with running(tiny, api_keys=("key-victim", "key-attacker")) as (server, _engine):
        victim, attacker = client(server.url, "key-victim"), client(server.url, "key-attacker")
        seen = probe(victim, attacker, (None, None))
        assert len(set(seen)) == 1, seen
        assert ask(victim, PIN_SYSTEM, None) > 20  # its own prefix, back from its snapshot
        with pytest.raises(openai.AuthenticationError):
            ask(client(server.url, "key-nobody"), PIN_SYSTEM, None)


def test_a_bad_cache_salt_is_refused_by_name(tiny):
    with running(tiny) as (server, _engine):
        for salt in ("", 7, "s" * 2000):
            r = httpx.post(server.url + "/chat/completions", json={"messages": [user("x")], "cache_salt": salt})
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


# --- numbers that are not numbers, an unexpected exception, a client gone mid-body ----------
@pytest.fixture(scope="module")
def logged(tiny):
    lines: list[str] = []
    with running(tiny, log=lines.append) as (server, engine):
        yield server, lines


@pytest.mark.parametrize("field, raw", [
    ("max_tokens", "1e999"), ("max_tokens", "NaN"), ("max_tokens", "Infinity"), ("max_tokens", "-Infinity"),
    ("max_completion_tokens", "1e999"), ("top_k", "Infinity"), ("seed", "-Infinity"),
    pytest.param("seed", "1" + "0" * 400, id="seed-401-digits"), ("temperature", "NaN"),
    pytest.param("top_p", "1" + "0" * 400, id="top_p-401-digits"), ("max_tokens", "2.5"),
])
def test_numbers_json_allows_but_int_cannot_hold_get_a_400(logged, field, raw):
    server, _lines = logged
    # by hand, as a hostile client sends it: Python's json reads NaN, Infinity and 1e999 (inf)
    body = '{"messages": [{"role": "user", "content": "x"}], "' + field + '": ' + raw + "}"
    r = httpx.post(server.url + "/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == ("max_tokens" if field.startswith("max") else field)
    assert err["type"] == "invalid_request_error"
    assert len(err["message"]) < 120


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def uvicorn_log():
    """What uvicorn itself logs (a traceback lands here as 'Exception in ASGI application')."""
    handler, log = Lines(), logging.getLogger("uvicorn.error")
    log.addHandler(handler)
    yield handler.records
    log.removeHandler(handler)


def wait_for(cond, seconds=30.0):
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_client_that_leaves_mid_body_is_one_log_line(logged, uvicorn_log):
    server, lines = logged
    before = len(lines)
    with socket.create_connection(server.sock.getsockname()[:2]) as quitter:
        quitter.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"messages\": [")
        time.sleep(0.2)  # let the server start reading the body (the test holds either way)
    wait_for(lambda: len(lines) > before)
    assert len(lines) == before + 1 and '"POST /v1/chat/completions HTTP/1.1" 499' in lines[-1]
    assert "client disconnected" in lines[-1]
    assert [r.getMessage() for r in uvicorn_log if r.levelno >= logging.ERROR] == []


def test_an_unexpected_exception_is_a_json_500_and_one_log_line(uvicorn_log):
    """The outermost layer's own case: a route that raises what no handler catches."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from chatapp.serve.access import AccessLog
    from chatapp.serve.main import Server, bind

    def broken(_request):
        return 1 // 0
    lines: list[str] = []
    app = Starlette(routes=[Route("/boom", broken)], middleware=[Middleware(AccessLog, log=lines.append)])
    server = Server(app, bind("127.0.0.1", 0)).start()
    try:
        url = server.url.removesuffix("/v1") + "/boom"
        wait_for(lambda: _answers(url))
        r = httpx.get(url)
    finally:
        server.stop()
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["error"] == {"message": "internal error: ZeroDivisionError: integer division or modulo by zero",
                                 "type": "server_error", "param": None, "code": None}
    assert len([ln for ln in lines if "/boom" in ln and " 500 " in ln]) >= 1 and all("\n" not in ln for ln in lines)
    assert [r.getMessage() for r in uvicorn_log if r.levelno >= logging.ERROR] == []


def _answers(url: str) -> bool:
    try:
        httpx.get(url.rsplit("/", 1)[0] + "/nothing", timeout=1)
        return True
    except httpx.HTTPError:
        return False


# --- a real `nanochat-tui serve`: its start-up line and its access log --------------------------
ACCESS = re.compile(r'^127\.0\.0\.1:(\d+) - "(\w+) (\S+) HTTP/1\.1" (\d+)(.*)$')


@pytest.fixture(scope="module")
def hostile_named_model(tmp_path_factory):
    """A real HF folder whose config.json names the model with a screen clear and a title write."""
    d = tmp_path_factory.mktemp("hf") / "model"
    save_variant(d, "qwen2-tied")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "nanochat_tui_name": "tiny\x1b[2J\x1b]0;owned\x07"}))
    return d


def test_serve_logs_one_line_per_request_and_escapes_its_start_up_line(hostile_named_model):
    proc = subprocess.Popen([sys.executable, "-m", "chatapp.cli", "serve", "--model", str(hostile_named_model),
                             "--port", "0", "--max-new-tokens", "3", "--temperature", "0"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        banner = ""
        while "nanochat-tui serve:" not in banner:
            banner = proc.stderr.readline()
            assert banner, "serve exited before its start-up line"
        assert "\x1b" not in banner and "\x07" not in banner
        assert "tiny\\x1b[2J\\x1b]0;owned\\x07 at http://127.0.0.1:" in banner
        url = re.search(r"at (http://\S+/v1)", banner).group(1)
        c = client(url)
        msgs = [user("hello there")]
        first = c.chat.completions.create(model="x", messages=msgs, max_tokens=3)
        msgs += [{"role": "assistant", "content": first.choices[0].message.content}, user("and?")]
        chunks = list(c.chat.completions.create(model="x", messages=msgs, max_tokens=3, stream=True,
                                                stream_options={"include_usage": True}))
        second = chunks[-1].usage
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="x", messages=msgs, max_tokens=0)
        httpx.get(url.removesuffix("/v1") + "/v1/x%1b[2Jy")
    finally:
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    log = [m.groups() for m in map(ACCESS.match, rest.splitlines()) if m]
    assert [(method, path, status) for _port, method, path, status, _ in log] == [
        ("POST", "/v1/chat/completions", "200"), ("POST", "/v1/chat/completions", "200"),
        ("POST", "/v1/chat/completions", "400"), ("GET", "/v1/x\\x1b[2Jy", "404")]
    for (*_, tail), use in zip(log, (first.usage, second), strict=False):
        fields = dict(kv.split("=", 1) for kv in tail.split() if "=" in kv)
        assert int(fields["prompt_tokens"]) == use.prompt_tokens
        assert int(fields["cached_tokens"]) == use.prompt_tokens_details.cached_tokens
        assert float(fields["ttft_ms"]) > 0 and float(fields["tok/s"]) >= 0
    assert int(dict(kv.split("=", 1) for kv in log[1][4].split() if "=" in kv)["cached_tokens"]) > 0
    assert "max_tokens must be" in log[2][4]
    assert "\x1b" not in rest and "Traceback" not in rest


def test_keys_come_from_repeated_flags_and_a_keys_file(tmp_path, monkeypatch):
    from chatapp.serve.flags import check_flags, serve_parser
    from model.errors import UserError

    def keys(*argv):
        args = serve_parser().parse_args(list(argv))
        check_flags(args)
        return args.api_keys
    monkeypatch.setenv("NANOCHAT_TUI_API_KEY", "from-env")
    f = tmp_path / "keys"
    f.write_text("# one key a user\nalice-key\n\n  bob-key  \nalice-key\n")
    assert keys("--api-key", "k1", "--api-key", "k2", "--api-key-file", str(f)) == ["k1", "k2", "alice-key", "bob-key"]
    assert keys() == ["from-env"]  # the environment's key only when no flag gives one
    for argv, says in [(["--api-key", ""], "empty"), (["--api-key-file", str(tmp_path)], "(?i)directory"),
                       (["--api-key-file", str(tmp_path / "none")], "(?i)no such file")]:
        with pytest.raises(UserError, match=says):
            keys(*argv)
    f.write_text("# nothing but a comment\n")
    with pytest.raises(UserError, match="holds no key"):
        keys("--api-key-file", str(f))


ODD = [float("nan"), float("inf"), float("-inf"), -1, 0, 2.5, 10**400, "7", "", "\x1b[2J", "\ud800", [], [[[]]], {},
       {"a": 1}, None, True, 1e-300, 3]
FIELDS = ["messages", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed", "stop", "stream",
          "stream_options", "n", "cache_salt", "tools", "logprobs", "response_format", "model", "user"]


def test_mutated_request_bodies_get_a_reply_or_openais_error_never_a_500(logged, uvicorn_log):
    """24 seeded bodies, one to three fields swapped for odd values; 800 passed in one-off runs."""
    import random

    server, lines = logged
    rng = random.Random(45)
    for _ in range(24):
        body = {"messages": [user("hi")], "max_tokens": 3}
        for name in rng.sample(FIELDS, rng.randint(1, 3)):
            body[name] = rng.choice(ODD)
            if name == "messages" and rng.random() < 0.5:
                body[name] = [{"role": rng.choice(["user", "system", "tool", None, 5]), "content": rng.choice(ODD)}]
        raw = json.dumps(body).encode("utf-8", "surrogatepass")
        r = httpx.post(server.url + "/chat/completions", content=raw, headers={"content-type": "application/json"},
                       timeout=120)
        assert r.status_code in (200, 400), (raw[:300], r.text[:300])
        if r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]")
        else:
            answer = r.json()
            assert "choices" in answer or set(answer["error"]) == {"message", "type", "param", "code"}
    assert [r.getMessage() for r in uvicorn_log if r.levelno >= logging.ERROR] == []
    assert all("\n" not in ln and "\x1b" not in ln for ln in lines)
