"""RemoteClient: chats against any OpenAI-compatible endpoint (vLLM, TGI, Ollama, LM Studio, another studio) with
the same submit / events / cancel interface as the local EngineThread, timed on the client side."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import httpx

from engine.core.metrics import MetricsRecorder, TokenRecord
from engine.errors import InvalidRequestError, RemoteError
from engine.handle import RequestHandle
from engine.remote.context_length import fetch_context_length
from engine.remote.loop import LoopThread
from engine.remote.metrics import RemoteMetricsSnapshot
from engine.remote.monitor import MetricsMonitor
from engine.remote.stream import (
    StatusError,
    StreamState,
    chunk_logprobs,
    error_message,
    sampling_fields,
    sse_chunks,
    status_message,
    transport_message,
)
from engine.remote.urls import cleartext_warning, normalize_base_url, server_root
from engine.types import EventSink, FinishReason, SamplingParams, TokenEvent, new_request_id, validate_messages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointHealth:
    ok: bool
    message: str
    latency_s: float | None = None


class RemoteClient:
    """Owns one event loop thread with an httpx.AsyncClient; each request streams in its own task there, so
    cancel() closes a stream at once (the remote then frees its pages, as our own server does)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        name: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.root_url = server_root(self.base_url)
        self.name = name or urlsplit(self.base_url).netloc
        warning = cleartext_warning(self.base_url) if api_key else None
        if warning:
            log.warning("endpoint %s: %s", self.name, warning)
        self.model = model
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._api_key = api_key  # sent only in the Authorization header, never logged
        self.metrics = MetricsRecorder()  # client-side token timings, for the same dashboard plots as local chats
        self._tasks: dict[str, asyncio.Task] = {}
        self._io = LoopThread(self.name, self._make_http_client)
        self.monitor = MetricsMonitor(self._io, self.root_url, self._get, model)
        self._include_usage = True  # dropped after a server refuses stream_options
        self.context_length: int | None = None  # the model's context, once the server said (request_context_length)
        self._context_asked = False

    def __repr__(self) -> str:  # no key in reprs: they end up in logs and tracebacks
        return f"RemoteClient({self.name!r}, {self.base_url!r}, model={self.model!r})"

    # ---- lifecycle --------------------------------------------------------------------------
    def _make_http_client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.read_timeout_s, connect=self.connect_timeout_s)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return httpx.AsyncClient(timeout=timeout, headers=headers, follow_redirects=True)

    def start(self) -> RemoteClient:
        self._io.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every open request and stop the loop thread."""

        async def cancel_open_work() -> None:
            tasks = list(self._tasks.values())
            if self.monitor.poller is not None:
                tasks.append(self.monitor.poller)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._io.stop(cancel_open_work, timeout)

    def __enter__(self) -> RemoteClient:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        return self._io.alive

    # ---- one-off queries (blocking; call them off the GUI thread) ------------------------------
    async def _get(self, url: str) -> httpx.Response:
        try:
            return await self._io.client.get(url)
        except httpx.HTTPError as exc:
            raise RemoteError(self._transport_message(exc, url)) from None

    def list_models(self) -> list[str]:
        async def fetch() -> list[str]:
            try:
                return await self._models_async()
            except StatusError as exc:
                raise RemoteError(status_message(self.name, exc.status, exc.message)) from None

        return self._io.call(fetch(), self.connect_timeout_s + self.read_timeout_s)

    def health(self) -> EndpointHealth:
        """Up and answering? /health where the server has one (vLLM, TGI, the studio), else the model list."""

        async def probe() -> EndpointHealth:
            started = time.monotonic()
            try:
                response = await self._get(f"{self.root_url}/health")
                if response.status_code in (404, 405):
                    response = await self._get(f"{self.base_url}/models")
            except RemoteError as exc:
                return EndpointHealth(False, str(exc))
            latency = time.monotonic() - started
            if response.status_code == 200:
                return EndpointHealth(True, f"{self.name} is up", latency)
            return EndpointHealth(
                False, status_message(self.name, response.status_code, error_message(response.content))
            )

        return self._io.call(probe(), 2 * (self.connect_timeout_s + self.read_timeout_s))

    def scrape_metrics(self, model: str | None = None) -> RemoteMetricsSnapshot:
        """The remote's own view (KV cache, queue, TTFT) if it serves vLLM-style /metrics; otherwise a snapshot
        saying that only client-side timings are available."""
        return self._io.call(self.monitor.scrape(model), self.connect_timeout_s + self.read_timeout_s)

    def poll_metrics(self, interval_s: float | None = 1.0) -> None:
        """Scrape /metrics every interval_s in the background (None stops); read `latest_metrics` any time, from
        any thread, without waiting (the dashboard's timer does)."""
        self.monitor.poll(interval_s)

    @property
    def latest_metrics(self) -> RemoteMetricsSnapshot | None:
        """The newest scrape of the remote's /metrics (poll_metrics keeps it fresh); None before the first."""
        return self.monitor.latest

    @latest_metrics.setter
    def latest_metrics(self, snapshot: RemoteMetricsSnapshot | None) -> None:
        self.monitor.latest = snapshot

    def request_context_length(self) -> None:
        """Ask the server for the model's context once, in the background; `context_length` holds the answer."""
        if self._context_asked:
            return
        self._context_asked = True

        async def ask() -> None:
            self.context_length = await fetch_context_length(self._get, self.base_url, self.root_url, self.model)

        self._io.call_soon(lambda: self._io.create_task(ask()))

    # ---- requests ---------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: Sequence[int] | None = None,
        *,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        raw: bool = False,
        params: SamplingParams | None = None,
        tag: str = "",
        request_id: str | None = None,
        model: str | None = None,
        tools: Sequence[dict] | None = None,
        tool_choice: object = None,
        sink: EventSink | None = None,
    ) -> RequestHandle:
        """Start a request; bad input raises here. Chats and plain prompts go to /chat/completions, raw prompts and
        token ids to /completions. Its events go to sink (called in the client's loop thread, with one event at a
        time) when one is given, else into the handle."""
        params = params or SamplingParams()
        params.validate()
        if prompt_ids is not None:
            if not prompt_ids:
                raise InvalidRequestError("the prompt is empty")
            body: dict = {"prompt": list(prompt_ids)}
            path = "/completions"
        elif messages is None and (prompt is None or not prompt.strip()):
            raise InvalidRequestError("the prompt is empty")
        elif raw and messages is None:
            body, path = {"prompt": prompt}, "/completions"
        else:
            chat = validate_messages(messages) if messages is not None else [{"role": "user", "content": prompt}]
            body, path = {"messages": chat}, "/chat/completions"
        body.update(sampling_fields(params, chat=path == "/chat/completions"))
        if tools:  # passed through as they are: the remote renders and parses them itself
            body["tools"] = list(tools)
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        request_id = request_id or new_request_id()
        handle = RequestHandle(self.cancel, request_id, 0, sink=sink)

        def begin() -> None:
            task = self._io.create_task(self._stream(handle, path, body, tag, model or self.model))
            self._tasks[request_id] = task
            task.add_done_callback(lambda _t: self._tasks.pop(request_id, None))

        self._io.call_soon(begin)
        return handle

    def cancel(self, request_id: str) -> None:
        """Stop a request: its stream is closed, which tells the remote to stop too. Unknown ids are harmless."""

        def cancel_task() -> None:
            task = self._tasks.get(request_id)
            if task is not None:
                task.cancel()

        self._io.call_soon(cancel_task, start=False)

    # ---- the stream -------------------------------------------------------------------------
    async def _stream(self, handle: RequestHandle, path: str, body: dict, tag: str, model: str | None) -> None:
        state = StreamState(handle.request_id, tag, time.monotonic())
        try:
            if model is None:
                models = await self._models_async()
                if not models:
                    raise RemoteError(f"{self.name} serves no models")
                model = models[0]
            body = {**body, "model": model, "stream": True}
            try:
                await self._read_stream(path, body, state, handle)
            except StatusError as exc:
                if exc.status == 400 and "stream_options" in exc.message and self._include_usage:
                    self._include_usage = False  # an older server: retry once without it, count chunks instead
                    await self._read_stream(path, body, state, handle)
                else:
                    raise
            if state.finish_reason is None:
                raise RemoteError(f"{self.name} ended the stream before the reply was complete")
            self._finish(handle, state, state.finish_reason)
        except asyncio.CancelledError:
            self._finish(handle, state, FinishReason.ABORT)
        except StatusError as exc:
            self._finish(handle, state, FinishReason.ERROR, status_message(self.name, exc.status, exc.message))
        except RemoteError as exc:
            self._finish(handle, state, FinishReason.ERROR, str(exc))
        except httpx.HTTPError as exc:
            self._finish(handle, state, FinishReason.ERROR, self._transport_message(exc, f"{self.base_url}{path}"))
        except Exception as exc:  # a bug or a wildly wrong answer: report it in the tab, keep the client alive
            log.exception("remote request %s failed", handle.request_id)
            self._finish(handle, state, FinishReason.ERROR, f"{self.name}: unexpected {type(exc).__name__}: {exc}")

    async def _models_async(self) -> list[str]:
        response = await self._get(f"{self.base_url}/models")
        if response.status_code != 200:
            raise StatusError(response.status_code, error_message(response.content))
        try:
            return [str(card["id"]) for card in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise RemoteError(f"{self.name}: {self.base_url}/models did not answer with a model list") from None

    async def _read_stream(self, path: str, body: dict, state: StreamState, handle: RequestHandle) -> None:
        if self._include_usage:
            body = {**body, "stream_options": {"include_usage": True}}
        state.started = time.monotonic()
        async with self._io.client.stream("POST", f"{self.base_url}{path}", json=body) as response:
            if response.status_code != 200:
                raise StatusError(response.status_code, error_message(await response.aread()))
            async for chunk in sse_chunks(response.aiter_lines(), self.name):
                self._on_chunk(chunk, state, handle)

    def _on_chunk(self, chunk: dict, state: StreamState, handle: RequestHandle) -> None:
        text, _ = state.apply(chunk)
        logprobs = chunk_logprobs(chunk)
        if not text and not logprobs:
            return
        now = time.monotonic()
        previous = state.token_times[-1] if state.token_times else state.started
        state.token_times.append(now)
        record = TokenRecord(state.request_id, state.tag, now, len(state.token_times) - 1, now - previous)
        self.metrics.record_tokens([record])
        handle.deliver(TokenEvent(state.request_id, state.tag, [], text, now, logprobs=logprobs))

    def _finish(
        self, handle: RequestHandle, state: StreamState, reason: FinishReason, error: str | None = None
    ) -> None:
        if handle.done:
            return
        now = time.monotonic()
        stats = state.stats(reason, now)
        handle.prompt_tokens = stats.prompt_tokens
        self.metrics.record_finished({"request_id": state.request_id, "tag": state.tag, **asdict(stats)})
        if error:
            log.warning("remote request %s: %s", state.request_id, error)
        event = TokenEvent.ending(state.request_id, reason, tag=state.tag, error=error, stats=stats, at=now)
        event.tool_calls = state.calls
        handle.deliver(event)

    def _transport_message(self, exc: httpx.HTTPError, url: str) -> str:
        return transport_message(self.name, exc, url, self.connect_timeout_s, self.read_timeout_s)
