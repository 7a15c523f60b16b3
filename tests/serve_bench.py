"""The issue's serve targets, measured against real processes on loopback (not part of the suite):

  python tests/serve_bench.py --model MODEL.gguf [--llama-server PATH/llama-server]

1. 20 turns through `nanochat-tui serve` with the openai client: cached_tokens per turn against
   the previous turns' length, and TTFT.
2. Three conversations alternating for 10 turns each: cached_tokens and the snapshot restore time.
3. 100 concurrent streams: none lost, none mixed up, the server's RSS before, at peak and after.
4. One stream through serve against headless mode's tok/s on the same model (alternated, medians).
5. With --llama-server: llama.cpp's server as the backend of our headless mode (`--backend`),
   its cached tokens, TTFT and tok/s per turn as our client reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil

CLI = [sys.executable, "-m", "chatapp.cli"]


def start_serve(model: str, *flags: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([*CLI, "serve", "--model", model, "--port", "0", "--temperature", "0", *flags],
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if m := re.search(r" at (http://\S+/v1) ", line):
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # keep the pipe drained
            return p, m.group(1)
    raise SystemExit(f"serve did not start (exit {p.wait()})")


def twenty_turns(url: str, turns: int) -> None:
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
    msgs, prev, rows = [], None, []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Turn {i}: tell me one more fact about the sea."})
        t0, ttft, parts, use = time.perf_counter(), None, [], None
        for ch in c.chat.completions.create(model="x", messages=msgs, max_tokens=32, stream=True,
                                            stream_options={"include_usage": True}):
            if ch.choices and ch.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - t0
                parts.append(ch.choices[0].delta.content)
            use = ch.usage or use
        cached = use.prompt_tokens_details.cached_tokens
        want = prev.prompt_tokens + prev.completion_tokens if prev else 0
        rows.append((i + 1, use.prompt_tokens, cached, want, use.prompt_tokens - cached, (ttft or 0) * 1000))
        prev = use
        msgs.append({"role": "assistant", "content": "".join(parts)})
    print("\n## 20 turns through serve (openai client, streaming)")
    print("| turn | prompt | cached | previous length | prefilled | TTFT ms |\n|---|---|---|---|---|---|")
    for r in rows:
        print("| {} | {} | {} | {} | {} | {:.1f} |".format(*r))
    ok = all(r[2] == r[3] for r in rows[1:])
    later = [r[5] for r in rows[1:]]
    print(f"cached = previous length from turn 2 on: {ok}; TTFT turns 2-{turns}: median "
          f"{statistics.median(later):.1f} ms, first 5 {statistics.median(later[:5]):.1f}, "
          f"last 5 {statistics.median(later[-5:]):.1f}")


def alternating(url: str, rounds: int) -> None:
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
    convs = {k: [] for k in "ABC"}
    prev, good, total, restores = {}, 0, 0, []
    for r in range(rounds):
        for k, msgs in convs.items():
            msgs.append({"role": "user", "content": f"Conversation {k}, turn {r}: go on."})
            resp = c.chat.completions.create(model="x", messages=msgs, max_tokens=16)
            use, t = resp.usage, resp.model_extra["timings"]
            if r:
                total += 1
                good += use.prompt_tokens_details.cached_tokens == prev[k].prompt_tokens + prev[k].completion_tokens
                restores.append((t["restored_n"], t["restore_ms"]))
            prev[k] = use
            msgs.append({"role": "assistant", "content": resp.choices[0].message.content})
    ms = [m for _, m in restores]
    print(f"\n## 3 conversations x {rounds} turns, round robin\nturns that prefilled only their new tokens: "
          f"{good} / {total}; snapshot restores: {len(ms)}, {min(n for n, _ in restores)}-"
          f"{max(n for n, _ in restores)} tokens, restore time median {statistics.median(ms):.3f} ms, "
          f"max {max(ms):.3f} ms")


def concurrent(url: str, pid: int, n: int) -> None:
    proc = psutil.Process(pid)
    rss0, peak, stop = proc.memory_info().rss, [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()

    async def run():
        c = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=1200)

        async def one(i):
            want = 2 + i % 5
            chunks = [ch async for ch in await c.chat.completions.create(
                model="x", messages=[{"role": "user", "content": f"Request number {i}."}], max_tokens=want,
                stream=True, stream_options={"include_usage": True})]
            return want, chunks
        try:
            return await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        finally:
            await c.close()
    t0 = time.perf_counter()
    results = asyncio.run(run())
    stop.set()
    ok = [r for r in results if not isinstance(r, BaseException)]
    unmixed = sum(len({ch.id for ch in chunks}) == 1 and chunks[-1].usage.completion_tokens <= want
                  for want, chunks in ok)
    print(f"\n## {n} concurrent streams\ncompleted {len(ok)} / {n}, each its own id and token count: {unmixed}; "
          f"errors: {[repr(r)[:80] for r in results if isinstance(r, BaseException)][:3]}; "
          f"{time.perf_counter() - t0:.1f} s; server RSS {rss0 >> 20} MiB before, peak {peak[0] >> 20} MiB, "
          f"after {proc.memory_info().rss >> 20} MiB")


def throughput(url: str, model: str, tokens: int, reps: int) -> None:
    """serve's decode speed against the engine's own, alternated: the headless CLI (its turn runs
    on the main thread) and the engine in a worker thread of this process, as the TUI runs it."""
    from chatapp.launch import open_session  # lazy: torch, only for this part
    from chatapp.options import chat_parser

    text = "Write a long story about a lighthouse keeper."
    session = open_session(chat_parser().parse_args(["--model", model, "--temperature", "0", "--max-new-tokens",
                                                     str(tokens), "--no-store"]))
    served, local, threaded = [], [], []

    def in_thread():
        session.reset()
        threaded.append([e for e in session.send(text)][-1].tokens_per_s)
    for _ in range(reps):
        r = httpx.post(url + "/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                        "max_tokens": tokens, "temperature": 0}, timeout=600).json()
        served.append(r["timings"]["predicted_per_second"])
        # two turns, the second timed: a fresh process's first decode steps also fault the weights in
        out = subprocess.run([*CLI, "--headless", "--model", model, "--no-store", "--temperature", "0",
                              "--max-new-tokens", str(tokens)], input=(text + "\n") * 2,
                             capture_output=True, text=True, timeout=600).stdout
        local.append([json.loads(x) for x in out.splitlines() if '"turn"' in x][-1]["tokens_per_s"])
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
    s, h, w = (statistics.median(x) for x in (served, local, threaded))
    print(f"\n## one stream, {tokens} tokens, {reps} alternated runs\nserve {s:.1f} tok/s; headless CLI {h:.1f} "
          f"tok/s ({100 * s / h:.0f}%); engine in a worker thread {w:.1f} tok/s ({100 * s / w:.0f}%). Runs: serve "
          f"{[round(x, 1) for x in served]}, headless {[round(x, 1) for x in local]}, "
          f"thread {[round(x, 1) for x in threaded]}")


def throughput_inproc(model: str, tokens: int, reps: int) -> None:
    """The same comparison inside one process, so both sides share the machine's noise alike: the
    loaded model behind our server (uvicorn in a thread, over loopback HTTP) against a second
    session on the same weights, run in a worker thread; alternated, medians."""
    from chatapp.chat.session import Session  # lazy: torch, only for this part
    from chatapp.chat.settings import Settings
    from chatapp.launch import load_options
    from chatapp.options import chat_parser
    from chatapp.serve.app import make_app
    from chatapp.serve.engine import Engine
    from chatapp.serve.main import Server, bind
    from model.loading import load_model

    args = chat_parser().parse_args(["--model", model])
    lm = load_model(model, load_options(args))
    d = Settings(temperature=0, max_new_tokens=tokens)
    engine = Engine(Session(lm, Settings(**vars(d)), context=2048), d)
    server = Server(make_app(engine), bind("127.0.0.1", 0)).start()
    time.sleep(1)
    direct, text, served, threaded = Session(lm, Settings(**vars(d)), context=2048), "Write a long story.", [], []

    def in_thread():
        direct.reset()
        threaded.append([e for e in direct.send(text)][-1].tokens_per_s)
    try:
        for _ in range(reps):
            r = httpx.post(server.url + "/chat/completions", timeout=600, json={
                "messages": [{"role": "user", "content": text}], "max_tokens": tokens}).json()
            served.append(r["timings"]["predicted_per_second"])
            t = threading.Thread(target=in_thread)
            t.start()
            t.join()
    finally:
        server.stop()
        engine.close()
    s, w = statistics.median(served), statistics.median(threaded)
    print(f"\n## one stream in one process, {tokens} tokens, {reps} alternated runs\nserve {s:.1f} tok/s, the "
          f"session in a worker thread {w:.1f} tok/s: {100 * s / w:.0f}%. Runs: serve {[round(x, 1) for x in served]}, "
          f"thread {[round(x, 1) for x in threaded]}")


def llama_backend(binary: str, model: str, turns: int) -> None:
    port = free_port()
    srv = subprocess.Popen([binary, "-m", model, "--port", str(port), "-c", "4096", "-t", "2", "-np", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        lines = "\n".join(f"Turn {i}: one more fact about the sea, please." for i in range(turns)) + "\n"
        out = subprocess.run([*CLI, "--headless", "--backend", url + "/v1", "--no-store", "--temperature", "0",
                              "--max-new-tokens", "32"], input=lines, capture_output=True, text=True, timeout=900)
        evs = [json.loads(x) for x in out.stdout.splitlines()]
        print(f"\n## llama.cpp's llama-server as the backend of headless mode ({os.path.basename(binary)})")
        print("| turn | cached (server) | prefilled | TTFT ms | tok/s |\n|---|---|---|---|---|")
        for e in evs:
            if e["event"] == "turn":
                print(f"| {e['turn']} | {e['cached_before']} | {e['prefill_tokens']} | {e['ttft_ms']:.1f} | "
                      f"{e['tokens_per_s']:.1f} |")
            elif e["event"] == "error":
                print("error:", e["message"])
        if out.returncode:
            print("headless exit", out.returncode, out.stderr[-500:])
    finally:
        srv.terminate()
        srv.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--llama-server")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default="turns,alternate,concurrent,throughput,llama",
                   help="comma-separated parts; also inproc (the throughput comparison inside one process)")
    a = p.parse_args()
    only = set(a.only.split(","))
    if "inproc" in only:
        throughput_inproc(a.model, a.tokens, a.reps)
        only.discard("inproc")
        if not only:
            return
    srv, url = start_serve(a.model, "--context", "4096")
    try:
        if "turns" in only:
            twenty_turns(url, a.turns)
        if "alternate" in only:
            alternating(url, a.rounds)
        if "concurrent" in only:
            concurrent(url, srv.pid, a.streams)
        if "throughput" in only:
            throughput(url, a.model, a.tokens, a.reps)
    finally:
        srv.terminate()
        srv.wait(30)
    if a.llama_server and "llama" in only:
        llama_backend(a.llama_server, a.model, 5)


if __name__ == "__main__":
    main()
