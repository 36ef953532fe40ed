"""Remote endpoint definitions: a name and a base URL (kept in settings by the app), the API key in the keyring."""

from __future__ import annotations

from dataclasses import dataclass

from engine.credentials import delete_secret, get_secret, set_secret
from engine.errors import RemoteError
from engine.remote.client import RemoteClient
from engine.remote.urls import normalize_base_url


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

    def client(self, model: str | None = None, **options) -> RemoteClient:
        """A RemoteClient for this endpoint, with its key from the keyring."""
        return RemoteClient(self.base_url, api_key=self.api_key(), model=model, name=self.name, **options)
