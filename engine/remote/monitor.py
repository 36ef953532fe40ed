"""What a remote endpoint says of itself: its /metrics scraped on demand or polled in the background."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from engine.errors import RemoteError
from engine.remote.loop import LoopThread
from engine.remote.metrics import RemoteMetricsSnapshot, parse_vllm_metrics, unavailable

Get = Callable[[str], Awaitable[httpx.Response]]


class MetricsMonitor:
    """Scrapes `root_url`/metrics on a client's loop. `latest` is the newest snapshot, readable from any thread."""

    def __init__(self, io: LoopThread, root_url: str, get: Get, model: str | None) -> None:
        self._io = io
        self._root_url = root_url
        self._get = get
        self._model = model
        self._last_available: RemoteMetricsSnapshot | None = None  # the previous good scrape, for rates
        self._poller: asyncio.Future | None = None
        self.latest: RemoteMetricsSnapshot | None = None

    async def scrape(self, model: str | None = None) -> RemoteMetricsSnapshot:
        try:
            response = await self._get(f"{self._root_url}/metrics")
        except RemoteError as exc:
            snapshot = unavailable(str(exc))
        else:
            if response.status_code != 200:
                snapshot = unavailable(f"GET /metrics answered {response.status_code}")
            else:
                snapshot = parse_vllm_metrics(response.text, model or self._model, self._last_available)
        if snapshot.available:
            self._last_available = snapshot
        self.latest = snapshot
        return snapshot

    def poll(self, interval_s: float | None) -> None:
        """Scrape every interval_s in the background (None stops)."""

        async def poll(interval: float) -> None:
            while True:
                await self.scrape()
                await asyncio.sleep(interval)

        def switch() -> None:
            if self._poller is not None:
                self._poller.cancel()
                self._poller = None
            if interval_s is not None:
                self._poller = asyncio.ensure_future(poll(interval_s))

        self._io.call_soon(switch)

    @property
    def poller(self) -> asyncio.Future | None:
        """The background task, to cancel when the client stops (on the loop's thread)."""
        return self._poller
