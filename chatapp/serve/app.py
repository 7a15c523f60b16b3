"""The HTTP face: Starlette routes over the engine (chatapp/serve/engine.py).

POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health. Every error, our 404s
and an unexpected 500 included, has OpenAI's error body. With an API key, /v1/ needs
`Authorization: Bearer KEY`; /health stays open so a load balancer or a script can wait for the
server without the key. Each request is logged in one line (`access_line`).
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from chatapp.serve import protocol
from chatapp.serve.access import AccessLog, Log
from chatapp.serve.engine import Engine, Job
from chatapp.serve.protocol import ApiError

MAX_BODY = 16 << 20  # a request body past this is refused before it is parsed
GONE = ("gone",)     # the client disconnected
GONE_NOTE = "the client disconnected before the reply was whole"


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def make_app(engine: Engine, api_keys: Sequence[str] = (), log: Log = to_stderr) -> Starlette:
    """`api_keys`: none (no authentication), or the keys that may use /v1/. With several, each
    key's requests share cached prefixes only with that key's (docs/serve.md, cache isolation)."""
    started = int(time.time())
    keys = [k.encode() for k in api_keys]

    def key_id(request: Request) -> int:
        """Which key sent the request (0 with none configured); 401 for none of them. Every key is
        compared, in constant time each, so the time taken says nothing of which one matched."""
        if not keys:
            return 0
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        matches = [hmac.compare_digest(given, k) for k in keys]
        if scheme.lower() != "bearer" or True not in matches:
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY", code="invalid_api_key")
        return matches.index(True)

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": engine.model, "queued": engine.queued()})

    async def models(request: Request) -> Response:
        key_id(request)
        return JSONResponse({"object": "list", "data": [
            {"id": engine.model, "object": "model", "created": started, "owned_by": "nanochat-tui",
             "max_model_len": engine.session.cache.capacity}]})  # vLLM's name for the context

    async def completions(request: Request) -> Response:
        key = key_id(request)
        req = replace(protocol.parse_request(await read_body(request)), key_id=key)
        job = engine.submit(req)
        watcher = asyncio.create_task(watch_disconnect(request, engine, job))
        if not req.stream:
            try:
                return await whole(engine, job, request)
            finally:
                watcher.cancel()
        first = await job.out.get()  # the headers wait for it: a refusal keeps its HTTP status
        if first[0] in ("error", "gone"):
            watcher.cancel()
            if first[0] == "error":
                raise first[1]
            request.state.error = GONE_NOTE
            return Response(status_code=499)
        return StreamingResponse(stream(engine, job, watcher, first, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        request.state.error = exc.message
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        request.state.error = str(exc.detail)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(protocol.error_body(str(exc.detail), kind), status_code=exc.status_code)

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", completions, methods=["POST"])]
    return Starlette(routes=routes, middleware=[Middleware(AccessLog, log=log)],
                     exception_handlers={ApiError: api_error, HTTPException: http_error})


async def read_body(request: Request) -> bytes:
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > MAX_BODY:
        raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB", code="request_too_large")
    chunks, n = [], 0
    try:
        async for part in request.stream():
            n += len(part)
            if n > MAX_BODY:
                raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB", code="request_too_large")
            chunks.append(part)
    except ClientDisconnect:  # nobody reads the answer; the log line says what happened
        raise ApiError(499, f"the client disconnected after {n} bytes of the body",
                       code="client_disconnected") from None
    return b"".join(chunks)


async def watch_disconnect(request: Request, engine: Engine, job: Job) -> None:
    """Wait for the client to go away (queued or mid-reply), then stop its job."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            engine.cancel(job)
            job.out.put_nowait(GONE)
            return


async def whole(engine: Engine, job: Job, request: Request) -> Response:
    parts: list[str] = []
    while True:
        item = await job.out.get()
        match item:
            case ("delta", delta):
                parts.append(delta.get("content", ""))
            case ("done", finish, use, timings, text):
                request.state.figures = use, timings
                return JSONResponse(protocol.completion(job.req, engine.model, text, finish, use, timings))
            case ("error", err):
                raise err
            case _:  # GONE: nobody to answer
                request.state.error = GONE_NOTE
                return Response(status_code=499)


async def stream(engine: Engine, job: Job, watcher: asyncio.Task, first: tuple,
                 request: Request) -> AsyncIterator[bytes]:
    req, model = job.req, engine.model
    try:
        yield protocol.sse(protocol.chunk(req, model, {"role": "assistant", "content": ""}))
        item = first
        while True:
            match item:
                case ("delta", delta):
                    yield protocol.sse(protocol.chunk(req, model, delta))
                case ("done", finish, use, timings, _text):
                    request.state.figures = use, timings
                    yield protocol.sse(protocol.chunk(req, model, {}, finish, timings=timings))
                    if req.include_usage:
                        yield protocol.sse({**protocol.chunk(req, model, {}), "choices": [], "usage": use})
                    yield protocol.sse("[DONE]")
                    return
                case ("error", err):
                    request.state.error = err.message
                    yield protocol.sse(err.body())  # headers are sent already: the error goes in the stream
                    return
                case _:
                    request.state.error = GONE_NOTE
                    return
            item = await job.out.get()
    finally:
        watcher.cancel()
        engine.cancel(job)  # a no-op once it finished; stops it if the stream ended early

