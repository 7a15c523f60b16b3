"""`nanochat-tui serve` on loopback, through the real `openai` client (and plain HTTP where a
client library would not send the bad request): endpoints, streaming, sampling fields, usage,
prefix reuse, errors, the API key. Queueing, disconnects and the snapshot LRU: test_serve_queue.py."""

import json
import subprocess
import sys

import httpx
import openai
import pytest
from helpers import assistant, running, user


@pytest.fixture(scope="module")
def served(tiny):
    with running(tiny) as (server, engine):
        yield server, engine


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0].url, api_key="unused", max_retries=0, timeout=60)


def base(served) -> str:
    return served[0].url.removesuffix("/v1")


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list()] == ["random:tiny"]
    r = httpx.get(base(served) + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_a_reply_with_usage_and_the_length_limit(client):
    r = client.chat.completions.create(model="random:tiny", messages=[user("hello")], max_tokens=4)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + 4
    assert r.usage.prompt_tokens_details.cached_tokens <= r.usage.prompt_tokens


def test_streaming_gives_the_same_reply_as_a_whole_one(client):
    msgs = [{"role": "system", "content": "be brief"}, user("stream me")]
    whole = client.chat.completions.create(model="x", messages=msgs, max_tokens=5)
    chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    use = chunks[-1].usage  # the last chunk carries the usage and no choices
    assert chunks[-1].choices == [] and use.completion_tokens == 5
    assert use.prompt_tokens == whole.usage.prompt_tokens


def test_a_growing_conversation_prefills_only_its_new_tokens(client):
    msgs, prev = [user("turn 0")], None
    for i in range(5):
        r = client.chat.completions.create(model="x", messages=msgs, max_tokens=3)
        if prev is not None:
            assert r.usage.prompt_tokens_details.cached_tokens == prev.prompt_tokens + prev.completion_tokens
        prev = r.usage
        msgs += [assistant(r.choices[0].message.content), user(f"turn {i + 1}")]


def test_text_parts_a_developer_message_and_two_user_messages_read_as_one_conversation(client):
    plain = client.chat.completions.create(model="x", max_tokens=4, messages=[
        {"role": "system", "content": "be kind"}, user("one\n\ntwo")])
    loose = client.chat.completions.create(model="x", max_tokens=4, messages=[
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "kind"}]},
        user("one"), {"role": "user", "content": [{"type": "text", "text": "two"}]}])
    assert loose.choices[0].message.content == plain.choices[0].message.content
    assert loose.usage.prompt_tokens == plain.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert "only text parts" in e.value.body["message"]


def test_seed_makes_sampling_repeatable(client):
    def reply(seed):
        r = client.chat.completions.create(model="x", messages=[user("dice")], temperature=1.5, top_p=1,
                                           seed=seed, max_tokens=5)
        return r.choices[0].message.content
    assert reply(7) == reply(7)
    assert len({reply(s) for s in (1, 2, 3)}) > 1


def test_top_k_one_is_greedy(client):
    greedy = client.chat.completions.create(model="x", messages=[user("k")], temperature=0, max_tokens=6)
    k1 = client.chat.completions.create(model="x", messages=[user("k")], temperature=1.0, max_tokens=6,
                                        extra_body={"top_k": 1}, seed=3)
    assert k1.choices[0].message.content == greedy.choices[0].message.content


def test_a_stop_string_ends_the_reply_before_it(client):
    msgs = [user("stop early")]
    full = client.chat.completions.create(model="x", messages=msgs, max_tokens=6).choices[0].message.content
    stop = full[2:4]
    assert stop
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=6, stop=[stop])
    assert r.choices[0].message.content == full[:full.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="x", messages=msgs, max_tokens=6, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == full[:full.find(stop)]


@pytest.mark.parametrize("body, param", [
    ({"messages": [user("x")], "temperature": 9}, "temperature"),
    ({"messages": [user("x")], "top_p": 0}, "top_p"),
    ({"messages": [user("x")], "max_tokens": 0}, "max_tokens"),
    ({"messages": [user("x")], "n": 2}, "n"),
    ({"messages": [user("x")], "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": [user("x")], "stop": [""]}, "stop"),
    ({"messages": []}, "messages"),
    ({"messages": [user("x"), assistant("y")]}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
])
def test_bad_fields_get_openai_error_bodies(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", **body)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_bad_json_and_unknown_routes_get_openai_error_bodies(served):
    url = base(served)
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(url + "/v1/chat/completions", content=json.dumps([1, 2]))
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_a_conversation_longer_than_the_context_is_refused(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[user("word " * 600)])
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # streaming too: the status comes before any chunk
        list(client.chat.completions.create(model="x", messages=[user("word " * 600)], stream=True))
    r = client.chat.completions.create(model="x", messages=[user("still here")], max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_the_api_key_is_required_when_set(tiny):
    with running(tiny, api_keys=("s3cret",)) as (server, _engine):
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        r = httpx.post(server.url + "/chat/completions", json={"messages": [user("x")]})
        assert r.status_code == 401
        good = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="x", messages=[user("hi")], max_tokens=2).usage.completion_tokens == 2
        assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200  # open: for health checks


def test_a_non_loopback_host_needs_the_flag_and_warns_without_a_key():
    from chatapp.serve.flags import check_flags, serve_parser

    def flags(*argv):
        return check_flags(serve_parser().parse_args(list(argv)))
    assert flags("--host", "127.0.0.1") is None and flags("--host", "::1") is None
    assert "no authentication" in flags("--host", "0.0.0.0", "--allow-non-loopback")
    assert flags("--host", "0.0.0.0", "--allow-non-loopback", "--api-key", "k") is None
    r = subprocess.run([sys.executable, "-m", "chatapp.cli", "serve", "--model", "random:tiny", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "nanochat-tui: error: --host 0.0.0.0 is not a loopback address: anyone who can reach it could use the "
        "server; add --allow-non-loopback (and --api-key) to mean it"]
