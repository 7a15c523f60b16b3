"""The one engine under load: the bounded fair queue and its 503, clients that go away (queued
or mid-stream), concurrent streams, and the KV snapshot LRU for alternating conversations."""

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import psutil
from helpers import assistant, running, user

N = 16


def wait_for(cond, seconds=30.0):
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def first_token(lines) -> None:
    """Read an SSE stream up to its first token: its request is running then."""
    for line in lines:
        if line.startswith("data:") and '"role"' not in line and '"content"' in line:
            return
    raise AssertionError("the stream ended before its first token")


def test_a_full_queue_answers_503_and_a_queued_client_that_leaves_is_dropped(tiny):
    with running(tiny, queue_size=2) as (server, engine):
        url = server.url + "/chat/completions"
        done: dict[str, int] = {}

        def post(k):
            done[k] = httpx.post(url, json={"messages": [user(k)], "max_tokens": 2}, timeout=120).status_code
        with httpx.Client(timeout=60) as c, c.stream("POST", url, json={
                "messages": [user("long")], "max_tokens": 1500, "stream": True}) as long:
            lines = long.iter_lines()  # kept: a dropped iterator would close the stream
            first_token(lines)  # the engine is busy with it now
            with socket.create_connection(server.sock.getsockname()[:2]) as quitter:  # headers come with its turn
                body = json.dumps({"messages": [user("quitter")], "stream": True}).encode()
                quitter.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                wait_for(lambda: engine.queued() == 1)
            wait_for(lambda: engine.queued() == 0)  # it left while waiting: dropped, never run
            waiters = [threading.Thread(target=post, args=(k,)) for k in ("b", "c")]
            for n, t in enumerate(waiters, 1):  # one after the other: their arrival order is known
                t.start()
                wait_for(lambda n=n: engine.queued() == n)
            full = httpx.post(url, json={"messages": [user("d")]}, timeout=10)
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            err = full.json()["error"]
            assert err["code"] == "queue_full" and err["type"] == "server_error" and "\n" not in err["message"]
        for t in waiters:  # the long stream's client left: its decode stopped, the queue moves on
            t.join(120)
        assert done == {"b": 200, "c": 200}
        ran = {st.user: st for st in engine.recent}
        assert "quitter" not in ran and "d" not in ran
        assert ran["long"].stop == "cancel" and ran["long"].decode_tokens < 1500
        assert list(ran) == ["long", "b", "c"]  # first come, first served


def test_a_client_gone_mid_stream_stops_the_decode(tiny):
    with running(tiny) as (server, engine):
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        stream = client.chat.completions.create(model="x", messages=[user("go")], max_tokens=1500, stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
        wait_for(lambda: engine.current is None)
        last = engine.recent[-1]
        assert last.stop == "cancel" and last.decode_tokens < 1500
        r = client.chat.completions.create(model="x", messages=[user("after")], max_tokens=2)  # the engine goes on
        assert r.usage.completion_tokens == 2


def test_16_concurrent_streams_are_all_served_unmixed(tiny):
    """16 keep it cheap on the shared CPU; the bench holds 100 (docs/benchmarks.md, serve)."""
    with running(tiny, context=256) as (server, engine):
        url = server.url + "/chat/completions"
        rss0 = psutil.Process().memory_info().rss

        async def one(http, i):
            n = 1 + i % 2
            body = {"messages": [user(f"request {i}")], "max_tokens": n, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with http.stream("POST", url, json=body) as r:
                chunks = [json.loads(line[6:]) async for line in r.aiter_lines()
                          if line.startswith("data: {")]
            return n, chunks

        async def all_of_them():
            limits = httpx.Limits(max_connections=N)
            async with httpx.AsyncClient(timeout=300, limits=limits) as http:
                return await asyncio.gather(*(one(http, i) for i in range(N)))
        results = asyncio.run(all_of_them())
        ids = set()
        for n, chunks in results:
            assert len({c["id"] for c in chunks}) == 1  # every chunk of a stream is that stream's
            ids.add(chunks[0]["id"])
            assert chunks[-1]["usage"]["completion_tokens"] == n  # its own max_tokens: not another's tokens
            assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert len(ids) == N
        wait_for(lambda: engine.served == N)  # it counts a job after handing on its last chunk
        assert psutil.Process().memory_info().rss - rss0 < 200 << 20


def alternate(client, rounds: int) -> list:
    """Three conversations taking turns; the usage and timings of every turn after the first."""
    convs = {k: [user(f"conversation {k}, turn 0")] for k in "abc"}
    seen, prev = [], {}
    for r in range(rounds):
        for k, msgs in convs.items():
            resp = client.chat.completions.create(model="x", messages=msgs, max_tokens=3)
            if r:
                seen.append((prev[k], resp.usage, resp.model_extra["timings"]))
            prev[k] = resp.usage
            msgs += [assistant(resp.choices[0].message.content), user(f"conversation {k}, turn {r + 1}")]
    return seen


def test_alternating_conversations_resume_from_kv_snapshots(tiny):
    with running(tiny, slots=3) as (server, engine):
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        for prev, use, timings in alternate(client, 3):
            assert use.prompt_tokens_details.cached_tokens == prev.prompt_tokens + prev.completion_tokens
            assert timings["restored_n"] == use.prompt_tokens_details.cached_tokens  # it came from a snapshot
            assert timings["restore_ms"] > 0
        assert len(engine.lru.snaps) == 2  # the other two conversations


def test_without_snapshot_slots_alternating_conversations_re_prefill(tiny):
    with running(tiny, slots=0) as (server, _engine):
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        for prev, use, _timings in alternate(client, 2):
            # only the shared system prompt and the conversation's common words are reused
            assert use.prompt_tokens_details.cached_tokens < prev.prompt_tokens
