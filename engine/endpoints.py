"""Remote endpoint definitions: a name and a base URL (kept in settings by the app), the API key in the keyring."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from engine.credentials import delete_secret, get_secret, set_secret
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


@dataclass(frozen=True)
class Endpoint:
    """What the settings hold about a remote: never its key."""

    name: str
    base_url: str

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise RemoteError("an endpoint needs a name")
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))

    @property
    def key_name(self) -> str:
        """The keyring entry holding this endpoint's API key."""
        return f"endpoint:{self.name}"

    def api_key(self) -> str | None:
        return get_secret(self.key_name)

    def store_api_key(self, key: str | None) -> None:
        """Keep the key in the OS keyring; an empty key removes it."""
        if key:
            set_secret(self.key_name, key)
        else:
            delete_secret(self.key_name)

    def client(self, model: str | None = None, **options):
        """A RemoteClient for this endpoint, with its key from the keyring."""
        from engine.remote import RemoteClient

        return RemoteClient(self.base_url, api_key=self.api_key(), model=model, name=self.name, **options)
