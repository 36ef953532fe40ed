"""The FastAPI app: routes /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /health, /metrics and
/openapi.json over an ApiServer, and every error answered in OpenAI's shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.core.engine_thread import EngineThread
from engine.serve.api_server import ApiServer
from engine.serve.completions_wire import ResponseWriter
from engine.serve.cross_site import guard_cross_site
from engine.serve.event_bridge import AsyncEventBridge
from engine.serve.guards import BodyLimit, HostGuard
from engine.serve.limits import ServeLimits, json_depth_within, lone_surrogate_field
from engine.serve.openai_protocol import (
    ApiError,
    GenerationRequest,
    bad_request,
    parse_chat_request,
    parse_completion_request,
)
from engine.serve.openapi_bodies import CHAT_BODY, COMPLETION_BODY, RESPONSES_BODY, request_body
from engine.serve.responses_api import ResponsesApi

log = logging.getLogger(__name__)
WARM_AFTER_IDLE_S = 1.0  # the engine idle this long, the grammar engine warms (see _warm_grammars_when_idle)
IDLE_POLL_S = 0.25


async def _json_body(request: Request, limits: ServeLimits) -> object:
    raw = await request.body()  # BodyLimit stops it at the cap
    too_deep = bad_request(f"the request body is nested too deeply (more than {limits.max_json_depth} levels)")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise bad_request(f"the request body is not valid JSON ({exc.msg} at {where})") from None
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except RecursionError:  # the parser's own guard, far deeper than ours
        raise too_deep from None
    except ValueError:  # an integer past Python's int-string limit (4,300 digits): no field needs one
        raise bad_request(
            f"the request body holds a number with more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if not json_depth_within(body, limits.max_json_depth):
        raise too_deep
    found, field = lone_surrogate_field(body)
    if found:
        where = f"'{field}'" if field else "the request body"
        raise bad_request(f"{where} holds a lone surrogate (\\uD800-\\uDFFF alone is not text)", field)
    return body


def _answer_errors_in_openai_shape(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(ApiError(exc.status_code, message, type=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        error = ApiError(500, f"internal server error ({type(exc).__name__})", type="server_error")
        return JSONResponse(error.body(), status_code=500)


def create_app(
    worker: EngineThread,
    model_name: str,
    *,
    api_key: str | None = None,
    limits: ServeLimits | None = None,
    allowed_hosts: Sequence[str] | None = None,
    allowed_origins: Sequence[str] = (),
) -> FastAPI:
    """The FastAPI app for one engine thread. The thread must already be started; the app never stops it.
    allowed_hosts: the Host names answered (limits.allowed_hosts_for); None answers any. allowed_origins: the web
    pages that may call the API from a browser (cross_site.check_origins); none by default."""
    limits = limits or ServeLimits()
    server = ApiServer(worker, model_name, api_key, limits)
    # /openapi.json for client generators and API fuzzers; no /docs page (it loads its scripts from a CDN)
    app = FastAPI(title="Inference Studio", docs_url=None, redoc_url=None, lifespan=_lifespan(server, limits))
    app.state.api_server = server
    _answer_errors_in_openai_shape(app)
    _guard(app, limits, allowed_hosts, allowed_origins)
    authorized = [Depends(server.check_key)]
    _status_routes(app, server, authorized)
    _generation_routes(app, server, limits, authorized)
    return app


def _lifespan(server: ApiServer, limits: ServeLimits):
    """The event bridge lives as long as the app's event loop; the grammar engine warms once the engine is idle."""
    worker = server.worker

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.bridge = AsyncEventBridge(worker, asyncio.get_running_loop(), max_backlog=limits.stream_backlog)
        warming = asyncio.create_task(_warm_grammars_when_idle(worker))
        try:
            yield
        finally:
            warming.cancel()
            server.bridge.close()
            server.bridge = None

    return lifespan


async def _warm_grammars_when_idle(worker: EngineThread) -> None:
    """Build the grammar engine's view of the tokenizer once the engine has had no request for WARM_AFTER_IDLE_S.
    It takes ~0.3 s (a 49k vocabulary) holding the interpreter lock: in the start it was 0.3 s of every server's
    time to ready, and beside a reply's steps it stalls them. A structured request that comes first builds it
    itself (as before any warming); its compile waits behind a warm under way, on the grammar engine's one worker."""
    loop = asyncio.get_running_loop()
    quiet_since = None
    while quiet_since is None or loop.time() - quiet_since < WARM_AFTER_IDLE_S:
        await asyncio.sleep(IDLE_POLL_S)
        busy = worker.engine.has_unfinished or worker.num_waiting > 0
        quiet_since = None if busy else (quiet_since or loop.time())
    await asyncio.to_thread(worker.engine.grammars.warm)


def _guard(
    app: FastAPI, limits: ServeLimits, allowed_hosts: Sequence[str] | None, allowed_origins: Sequence[str]
) -> None:
    # the last added runs first: the Host check refuses before a byte of the body is read, then CORS answers
    # preflights, then the cross-site guard refuses what a page sent without one
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    guard_cross_site(app, allowed_origins)
    if allowed_hosts is not None:
        app.add_middleware(HostGuard, allowed=allowed_hosts)


def _status_routes(app: FastAPI, server: ApiServer, authorized: list) -> None:
    """/health, /metrics and the model list."""

    @app.get("/health")
    async def health() -> Response:
        problem = server.worker.health()  # stopped, or stuck: no progress for too long while requests wait
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "reason": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    def metrics() -> Response:  # sync: reading the live state waits (briefly) for the engine thread
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict:
        card = {
            "id": server.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "inference-studio",
            "max_model_len": server.context_length,
        }
        return {"object": "list", "data": [card]}


def _generation_routes(app: FastAPI, server: ApiServer, limits: ServeLimits, authorized: list) -> None:
    """Chat completions, completions and the Responses API."""
    responses = ResponsesApi(server)

    async def generate(request: Request, gen: GenerationRequest, id_prefix: str) -> Response:
        server.check_model(gen.model)
        server.check_alive()
        writer = ResponseWriter(gen.kind, f"{id_prefix}-{uuid.uuid4().hex}", server.model_name, gen.tokens_as_ids)
        if gen.stream:
            return await server.stream(gen, writer)
        return JSONResponse(await server.whole(request, gen, writer))

    @app.post("/v1/chat/completions", dependencies=authorized, openapi_extra=request_body(CHAT_BODY))
    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat_request(await _json_body(request, limits), limits), "chatcmpl")

    @app.post("/v1/completions", dependencies=authorized, openapi_extra=request_body(COMPLETION_BODY))
    async def completions(request: Request) -> Response:
        body = await _json_body(request, limits)
        return await generate(request, parse_completion_request(body, limits), "cmpl")

    @app.post("/v1/responses", dependencies=authorized, openapi_extra=request_body(RESPONSES_BODY))
    async def create_response(request: Request) -> Response:
        return await responses.create(request, await _json_body(request, limits))

    @app.get("/v1/responses/{response_id}", dependencies=authorized)
    async def retrieve_response(response_id: str) -> dict:
        return responses.retrieve(response_id)
