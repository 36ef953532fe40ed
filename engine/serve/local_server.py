"""The API server in a background thread over an engine thread its caller keeps (the studio window's toggle)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.engine_thread import EngineThread
from engine.serve.app import create_app
from engine.serve.cross_site import check_origins
from engine.serve.http_server import HttpServer
from engine.serve.limits import allowed_hosts_for


class LocalApiServer:
    """Serves `worker` under `model_name` until stop(); the engine and the chats using it carry on after."""

    def __init__(
        self,
        worker: EngineThread,
        model_name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        allowed_origins: Sequence[str] = (),
    ) -> None:
        """allowed_origins: web pages that may call it from a browser (cross_site.check_origins)."""
        self.worker = worker
        self.model_name = model_name
        self.app = create_app(
            worker,
            model_name,
            api_key=api_key,
            allowed_hosts=allowed_hosts_for(host),
            allowed_origins=check_origins(allowed_origins),
        )
        self.http = HttpServer(self.app, host, port)  # binds now: a taken port raises ServeError here

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int:
        return self.http.port

    def start(self, timeout: float = 15.0) -> LocalApiServer:
        self.http.start(timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the API's requests (their clients get an error, their pages are freed), then stop serving."""
        self.app.state.api_server.cancel_all()
        self.http.stop(timeout)
