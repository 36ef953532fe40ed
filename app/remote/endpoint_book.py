"""EndpointBook: the remote endpoints the user added (name, base URL, the models seen there) in the settings file;
their API keys only in the OS keyring (engine.endpoints), never in settings or logs."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from PySide6.QtCore import QSettings

from engine.errors import RemoteError
from engine.remote.endpoints import Endpoint

log = logging.getLogger(__name__)

SETTINGS_KEY = "remote/endpoints"


@dataclass(frozen=True)
class SavedEndpoint:
    endpoint: Endpoint
    models: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.endpoint.name


class EndpointBook:
    def __init__(self, qsettings: QSettings) -> None:
        self.qsettings = qsettings

    def all(self) -> list[SavedEndpoint]:
        try:
            items = json.loads(str(self.qsettings.value(SETTINGS_KEY, "[]")))
        except ValueError:
            return []
        saved = []
        for item in items if isinstance(items, list) else []:
            try:
                endpoint = Endpoint(str(item["name"]), str(item["base_url"]))
                models = item.get("models", [])
                if not isinstance(models, list):
                    raise TypeError("its models are not a list")
            except (KeyError, TypeError, AttributeError, RemoteError):
                log.warning("ignoring a broken endpoint entry in the settings")
                continue
            saved.append(SavedEndpoint(endpoint, tuple(str(m) for m in models)))
        return saved

    def get(self, name: str) -> SavedEndpoint | None:
        return next((s for s in self.all() if s.name == name), None)

    def save(self, endpoint: Endpoint, models: list[str] | tuple[str, ...], api_key: str | None) -> SavedEndpoint:
        """Add or replace an endpoint; api_key None keeps the stored key, "" removes it."""
        if api_key is not None:
            endpoint.store_api_key(api_key)  # first: if the keyring refuses, the settings stay unchanged
        saved = SavedEndpoint(endpoint, tuple(models))
        entries = [s for s in self.all() if s.name != endpoint.name] + [saved]
        self._write(entries)
        return saved

    def remove(self, name: str) -> None:
        saved = self.get(name)
        if saved is None:
            return
        saved.endpoint.store_api_key("")
        self._write([s for s in self.all() if s.name != name])

    def _write(self, entries: list[SavedEndpoint]) -> None:
        data = [{"name": s.name, "base_url": s.endpoint.base_url, "models": list(s.models)} for s in entries]
        self.qsettings.setValue(SETTINGS_KEY, json.dumps(data))
        self.qsettings.sync()
