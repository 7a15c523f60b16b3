"""The HTTP face: Starlette routes over the engine (chatapp/serve/engine.py).

POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health. Every error, our 404s
included, has OpenAI's error body. With an API key, /v1/ needs `Authorization: Bearer KEY`;
/health stays open so a load balancer or a script can wait for the server without the key.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from chatapp.serve import protocol
from chatapp.serve.engine import Engine, Job
from chatapp.serve.protocol import ApiError

MAX_BODY = 16 << 20  # a request body past this is refused before it is parsed
GONE = ("gone",)     # the client disconnected


def make_app(engine: Engine, api_key: str | None = None) -> Starlette:
    started = int(time.time())

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY", code="invalid_api_key")

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": engine.model, "queued": engine.queued()})

    async def models(request: Request) -> Response:
        check_key(request)
        return JSONResponse({"object": "list", "data": [
            {"id": engine.model, "object": "model", "created": started, "owned_by": "nanochat-tui",
             "max_model_len": engine.session.cache.capacity}]})  # vLLM's name for the context

    async def completions(request: Request) -> Response:
        check_key(request)
        raw = await read_body(request)
        req = protocol.parse_request(raw)
        job = engine.submit(req)
        watcher = asyncio.create_task(watch_disconnect(request, engine, job))
        if not req.stream:
            try:
                return await whole(engine, job)
            finally:
                watcher.cancel()
        first = await job.out.get()  # the headers wait for it: a refusal keeps its HTTP status
        if first[0] in ("error", "gone"):
            watcher.cancel()
            if first[0] == "error":
                raise first[1]
            return Response(status_code=499)
        return StreamingResponse(stream(engine, job, watcher, first), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def api_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(protocol.error_body(str(exc.detail), kind), status_code=exc.status_code)

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error})


async def read_body(request: Request) -> bytes:
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > MAX_BODY:
        raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB", code="request_too_large")
    chunks, n = [], 0
    async for part in request.stream():
        n += len(part)
        if n > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB", code="request_too_large")
        chunks.append(part)
    return b"".join(chunks)


async def watch_disconnect(request: Request, engine: Engine, job: Job) -> None:
    """Wait for the client to go away (queued or mid-reply), then stop its job."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            engine.cancel(job)
            job.out.put_nowait(GONE)
            return


async def whole(engine: Engine, job: Job) -> Response:
    parts: list[str] = []
    while True:
        item = await job.out.get()
        match item:
            case ("delta", delta):
                parts.append(delta.get("content", ""))
            case ("done", finish, use, timings, text):
                return JSONResponse(protocol.completion(job.req, engine.model, text, finish, use, timings))
            case ("error", err):
                raise err
            case _:  # GONE: nobody to answer
                return Response(status_code=499)


async def stream(engine: Engine, job: Job, watcher: asyncio.Task, first: tuple) -> AsyncIterator[bytes]:
    req, model = job.req, engine.model
    try:
        yield protocol.sse(protocol.chunk(req, model, {"role": "assistant", "content": ""}))
        item = first
        while True:
            match item:
                case ("delta", delta):
                    yield protocol.sse(protocol.chunk(req, model, delta))
                case ("done", finish, use, timings, _text):
                    yield protocol.sse(protocol.chunk(req, model, {}, finish, timings=timings))
                    if req.include_usage:
                        yield protocol.sse({**protocol.chunk(req, model, {}), "choices": [], "usage": use})
                    yield protocol.sse("[DONE]")
                    return
                case ("error", err):
                    yield protocol.sse(err.body())  # headers are sent already: the error goes in the stream
                    return
                case _:
                    return
            item = await job.out.get()
    finally:
        watcher.cancel()
        engine.cancel(job)  # a no-op once it finished; stops it if the stream ended early

