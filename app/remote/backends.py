"""RemoteBackends: one RemoteClient per (endpoint, model) that chat tabs can pick, registered as chat backends."""

from __future__ import annotations

import json
import logging

from app.hosting.backends import BackendRegistry
from app.remote.endpoint_book import EndpointBook, SavedEndpoint
from engine.remote.client import RemoteClient
from engine.remote.endpoints import Endpoint

log = logging.getLogger(__name__)

PREFIX = "remote:"


def remote_backend_id(endpoint_name: str, model: str) -> str:
    """Stored with each chat: JSON, because endpoint names and model ids may contain any separator."""
    return PREFIX + json.dumps([endpoint_name, model])


def parse_backend_id(backend_id: str) -> tuple[str, str] | None:
    """(endpoint name, model) of a remote backend id, None for the local engine or a broken id."""
    if not backend_id.startswith(PREFIX):
        return None
    try:
        name, model = json.loads(backend_id[len(PREFIX) :])
    except (ValueError, TypeError):
        return None
    return str(name), str(model)


def backend_label(endpoint_name: str, model: str) -> str:
    return f"{model} @ {endpoint_name}"


class RemoteBackends:
    """Clients are made for every saved endpoint and model at once (cheap: a client starts its thread on first use),
    so a chat restored onto a remote model finds its backend."""

    def __init__(
        self,
        book: EndpointBook,
        registry: BackendRegistry,
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        self.book = book
        self.registry = registry
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s  # a stalled server ends the reply with a message after this long
        self.clients: dict[str, RemoteClient] = {}
        for saved in book.all():
            self._register(saved)

    def choices(self) -> list[tuple[str, str]]:
        """(backend id, label) of every remote model a tab can use."""
        return [(backend_id, self.registry.label(backend_id)) for backend_id in self.clients]

    def client(self, backend_id: str) -> RemoteClient | None:
        return self.clients.get(backend_id)

    def add(self, endpoint: Endpoint, models: list[str], api_key: str | None) -> SavedEndpoint:
        """Save the endpoint (key to the keyring) and register its models; replaces one of the same name."""
        self.remove(endpoint.name, forget=False)
        saved = self.book.save(endpoint, models, api_key)
        self._register(saved)
        return saved

    def remove(self, name: str, forget: bool = True) -> None:
        """Stop the endpoint's clients (cancelling their replies); forget=True also drops it and its key."""
        for backend_id in [b for b in self.clients if (parse_backend_id(b) or ("",))[0] == name]:
            client = self.clients.pop(backend_id)
            self.registry.set(backend_id, None)
            client.shutdown()
        if forget:
            self.book.remove(name)

    def _register(self, saved: SavedEndpoint) -> None:
        for model in saved.models:
            backend_id = remote_backend_id(saved.name, model)
            # the key is read once, here; the client keeps it in memory only
            client = saved.endpoint.client(
                model=model, connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s
            )
            self.clients[backend_id] = client
            self.registry.set(backend_id, client, label=backend_label(saved.name, model))

    def shutdown(self) -> None:
        for client in self.clients.values():
            client.shutdown()
