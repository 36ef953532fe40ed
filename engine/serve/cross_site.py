"""Requests from web pages: CORS for the origins the user allows (closed by default), and a guard against the
requests a page can send without asking (a "simple" cross-site POST, e.g. text/plain, that no preflight checks)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.errors import ServeError
from engine.serve.openai_protocol import ApiError

log = logging.getLogger(__name__)

ANY_ORIGIN = "*"
#: scheme://host[:port], as a browser writes the Origin header (no path); desktop shells use app:// and the like
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^\s/:?#\[\]@]+)(:\d{1,5})?")
#: methods that change nothing: a browser sends these cross-site freely, and they run no generation
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def check_origins(values: Sequence[str]) -> tuple[str, ...]:
    """The allowed origins, normalised ("https://App.example/" -> "https://app.example"); a malformed one raises
    ServeError naming it. "*" allows every page, with a warning in the log."""
    origins: list[str] = []
    for value in values:
        origin = value.strip().rstrip("/").lower()
        if origin != ANY_ORIGIN and not _ORIGIN.fullmatch(origin):
            raise ServeError(
                f"--allowed-origin {value!r} is not an origin: write scheme://host[:port], e.g. "
                "http://localhost:3000 (no path), or * for any page"
            )
        if origin not in origins:
            origins.append(origin)
    if ANY_ORIGIN in origins:
        log.warning("--allowed-origin *: any web page the user opens may call this server's API")
    return tuple(origins)


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class CrossSiteGuard:
    """403 for a request a web page sent without a preflight: a method that is not safe, a body that is not JSON
    (text/plain and forms need no preflight) and an Origin that is not allowed. A JSON body or an Authorization
    header makes the browser ask first (preflight), which CORS then answers; clients that are not browsers send no
    Origin and pass."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    def refuses(self, method: str, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None or method in _SAFE_METHODS or _is_json(headers.get("content-type")):
            return False
        return ANY_ORIGIN not in self.allowed and origin.lower() not in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            if self.refuses(scope["method"], headers):
                error = ApiError(
                    403,
                    f"a cross-site request from {headers.get('origin')!r} with Content-Type "
                    f"{headers.get('content-type')!r}: send JSON (Content-Type: application/json), from an origin "
                    "the server allows (--allowed-origin)",
                    type="permission_error",
                    code="origin_not_allowed",
                )
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def guard_cross_site(app: FastAPI, allowed_origins: Sequence[str]) -> None:
    """Add the guard and, when origins are allowed, Starlette's CORS middleware (preflights and the response headers a
    page needs to read a reply). Call before the Host check is added: that must run first."""
    app.add_middleware(CrossSiteGuard, allowed=allowed_origins)
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            # the openai SDK sends its x-stainless-* headers and more; a key travels as Authorization, never a cookie
            allow_headers=["*"],
            allow_credentials=False,
            expose_headers=["Retry-After"],
            max_age=600,
        )
