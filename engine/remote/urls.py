"""Base URLs of OpenAI-compatible endpoints: how a typed address becomes one, and where /health and /metrics live."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from engine.errors import RemoteError

# names that resolve only on a local network (mDNS, RFC 8375's home.arpa, ICANN's .internal, the common .lan)
LOCAL_SUFFIXES = (".localhost", ".local", ".lan", ".internal", ".home.arpa")
# carrier-grade NAT space: not routed on the internet, where Tailscale and similar overlays give out addresses
SHARED_SPACE = ipaddress.ip_network("100.64.0.0/10")


def is_private_host(host: str) -> bool:
    """Whether a host is this machine or a private network: loopback, private and link-local addresses, and names
    that only resolve locally (no dot, or a local-only suffix). Nothing is resolved: the answer is from the text."""
    host = host.lower().strip("[]").rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host or host.endswith(LOCAL_SUFFIXES)
    if address.is_loopback or address.is_private or address.is_link_local:
        return True
    return address.version == 4 and address in SHARED_SPACE


def cleartext_warning(base_url: str) -> str | None:
    """A warning when an API key sent to this URL would cross the internet unencrypted (http:// to a public host)."""
    parts = urlsplit(base_url if "://" in base_url else f"//{base_url}")
    if parts.scheme != "http" or not parts.hostname or is_private_host(parts.hostname):
        return None
    return (
        f"{parts.hostname} is reached over plain http://: an API key sent to it travels in clear text; "
        "use https:// if the server offers it"
    )


def normalize_base_url(url: str) -> str:
    """'host:8000', 'http://host:8000/' and 'http://host:8000/v1' all mean http://host:8000/v1. Without a scheme,
    http:// is assumed for this machine and private networks (a local Ollama on localhost:11434), https:// for
    everything else, so a key never goes to a public host in clear text unless the user wrote http://."""
    url = url.strip()
    if url and "://" not in url:
        host = urlsplit(f"//{url}").hostname or ""
        url = ("http://" if is_private_host(host) else "https://") + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url!r} is not an http(s) URL; enter e.g. http://gpu-box:8000/v1")
    path = parts.path.rstrip("/") or "/v1"  # every server we know puts the OpenAI API under /v1
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_root(base_url: str) -> str:
    """Where /health and /metrics live: the base URL without its trailing /v1."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
