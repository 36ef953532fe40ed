"""An asyncio event loop in a daemon thread with one httpx.AsyncClient: where a remote client's streams run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx

from engine.errors import RemoteError


class LoopThread:
    """Started on first use; stop() ends it for good (a stopped loop is never restarted)."""

    def __init__(self, name: str, make_client: Callable[[], httpx.AsyncClient]) -> None:
        self.name = name
        self._make_client = make_client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopped = False

    def start(self, timeout: float = 30.0) -> None:
        if self._stopped:
            raise RemoteError(f"the connection to {self.name} was closed; create a new client")
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"remote-{self.name}", daemon=True)
                self._thread.start()
        if not self._ready.wait(timeout):
            raise RemoteError(f"the connection thread for {self.name} did not start within {timeout:g} s")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._client = self._make_client()
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._client.aclose())
            loop.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def client(self) -> httpx.AsyncClient:
        """The HTTP client (use it from coroutines running on this loop)."""
        assert self._client is not None, "start() the loop first"
        return self._client

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the loop and wait for its result (from another thread)."""
        self.start()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call_soon(self, fn: Callable[[], None], start: bool = True) -> None:
        """Run fn on the loop's thread. Without start, a loop not running (not yet, or no more) ignores it."""
        if start:
            self.start()
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing runs on it any more
            loop.call_soon_threadsafe(fn)

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """On the loop's thread only."""
        assert self._loop is not None
        return self._loop.create_task(coro)

    def stop(self, before: Callable[[], Awaitable[None]] | None = None, timeout: float = 10.0) -> None:
        """Await `before` on the loop (cancel open work), then stop the loop and join its thread."""
        self._stopped = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def stop() -> None:
            if before is not None:
                await before()
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        thread.join(timeout)
