"""The ASGI guards that act before a route runs: the Host-header check (403) and the body cap (413)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.serve.limits import MIB
from engine.serve.openai_protocol import ApiError


def _host_name(header: str | None) -> str | None:
    if not header:
        return None
    try:
        return urlsplit(f"//{header}").hostname  # "[::1]:8000" -> "::1", "LocalHost:80" -> "localhost"
    except ValueError:
        return None


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _refuse(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)


class HostGuard:
    """403 for a Host header that is not one of the allowed names (loopback addresses always pass when the loopback
    names are allowed). Starlette's TrustedHostMiddleware answers 400 in plain text; clients here expect OpenAI's
    error shape, and Ollama's 403."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(h.lower().strip("[]") for h in allowed)
        self.loopback = "localhost" in self.allowed

    def allows(self, header: str | None) -> bool:
        host = _host_name(header)
        return host is not None and (host in self.allowed or (self.loopback and _is_loopback_ip(host)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = Headers(scope=scope).get("host")
            if not self.allows(header):
                message = (
                    f"the Host header {header!r} is not allowed here: this server answers to "
                    f"{', '.join(sorted(self.allowed))} (add a name with --allowed-host)"
                )
                await _refuse(ApiError(403, message, type="permission_error", code="host_not_allowed"), scope,
                              receive, send)  # fmt: skip
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over max_bytes: at once from its Content-Length, before a byte of it is read, or while it
    streams in (chunked). 408 (and the connection closed) for a body that has not all arrived within timeout_s of
    the request's head: a Content-Length larger than what is sent used to hold the connection for good. uvicorn and
    Starlette bound headers but not plain bodies, nor the time they take."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def too_large(self) -> ApiError:
        size = f"{self.max_bytes / MIB:g} MiB" if self.max_bytes >= MIB else f"{self.max_bytes} bytes"
        return ApiError(413, f"the request body is larger than {size}", code="request_too_large")

    def too_slow(self) -> ApiError:
        # Connection: close: the rest of the body may still come, and would be read as the next request
        return ApiError(408, f"the request body did not arrive within {self.timeout_s:g} s", code="request_timeout",
                        headers={"Connection": "close"})  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not length.isdigit():
                await _refuse(ApiError(400, f"bad Content-Length {length!r}"), scope, receive, send)
                return
            if int(length) > self.max_bytes:
                await _refuse(self.too_large(), scope, receive, send)
                return
        received = 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_done = False

        async def counted() -> Message:
            nonlocal received, body_done
            if body_done:  # the body is in: what follows is waiting for a disconnect, for as long as a reply runs
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                raise self.too_slow() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self.too_large()  # the route's error handler answers it in OpenAI's shape
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, counted, send)
