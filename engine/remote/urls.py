"""Base URLs of OpenAI-compatible endpoints: how a typed address becomes one, and where /health and /metrics live."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from engine.errors import RemoteError


def normalize_base_url(url: str) -> str:
    """'host:8000', 'http://host:8000/' and 'http://host:8000/v1' all mean http://host:8000/v1."""
    url = url.strip()
    if url and "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url!r} is not an http(s) URL; enter e.g. http://gpu-box:8000/v1")
    path = parts.path.rstrip("/") or "/v1"  # every server we know puts the OpenAI API under /v1
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_root(base_url: str) -> str:
    """Where /health and /metrics live: the base URL without its trailing /v1."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
