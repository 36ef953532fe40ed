"""The server builds the grammar engine's tokenizer once the engine has been idle a moment: not in its start (0.3 s of
every time to ready) and not beside a reply's steps (it holds the interpreter lock while it builds)."""

from __future__ import annotations

import asyncio
import time

from engine.serve import app as serve_app


class Engine:
    def __init__(self, busy_until: float) -> None:
        self.busy_until = busy_until
        self.warmed_at: float | None = None
        self.grammars = self

    @property
    def has_unfinished(self) -> bool:  # a request runs until busy_until
        return time.monotonic() < self.busy_until

    def warm(self) -> None:
        self.warmed_at = time.monotonic()


class Worker:
    num_waiting = 0

    def __init__(self, busy_until: float) -> None:
        self.engine = Engine(busy_until)


def test_it_warms_only_after_the_engine_was_idle_long_enough(monkeypatch) -> None:
    monkeypatch.setattr(serve_app, "WARM_AFTER_IDLE_S", 0.2)
    monkeypatch.setattr(serve_app, "IDLE_POLL_S", 0.02)
    started = time.monotonic()
    worker = Worker(busy_until=started + 0.3)
    asyncio.run(asyncio.wait_for(serve_app._warm_grammars_when_idle(worker), timeout=5))
    assert worker.engine.warmed_at is not None
    assert worker.engine.warmed_at - started >= 0.3 + 0.2  # after the request, and a quiet moment after it


def test_a_server_that_stops_while_busy_never_warms(monkeypatch) -> None:
    monkeypatch.setattr(serve_app, "IDLE_POLL_S", 0.02)
    worker = Worker(busy_until=float("inf"))

    async def run() -> None:
        task = asyncio.create_task(serve_app._warm_grammars_when_idle(worker))
        await asyncio.sleep(0.2)
        task.cancel()  # the lifespan's end

    asyncio.run(run())
    assert worker.engine.warmed_at is None
