"""`inference-studio serve`: the engine behind an OpenAI-compatible HTTP API, with Prometheus metrics."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from app.cli.options import add_engine_options, add_model_options, engine_options_from
from engine.core.engine_thread import EngineThread
from engine.credentials import SERVICE, read_secret
from engine.cycle_collector import set_aside_what_is_loaded
from engine.errors import ServeError
from engine.launch import EngineOptions, start_engine
from engine.serve.app import create_app
from engine.serve.cross_site import check_origins
from engine.serve.http_server import HttpServer, bind_socket, is_loopback
from engine.serve.limits import MIB, ServeLimits, allowed_hosts_for

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    server.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    server.add_argument(
        "--api-key-from-keyring",
        metavar="NAME",
        default=None,
        help="require 'Authorization: Bearer <key>' with the key stored in the system keyring under NAME "
        "(store it with: keyring set inference-studio NAME)",
    )
    server.add_argument(
        "--served-model-name", metavar="NAME", default=None, help="the model id clients use (default: its name)"
    )
    defaults = ServeLimits()
    server.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a Host name to answer to besides localhost, 127.0.0.1 and [::1] (repeatable); others get 403, "
        "which stops DNS rebinding",
    )
    server.add_argument(
        "--allowed-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="a web page origin (scheme://host[:port]) that may call the API from a browser (CORS; repeatable; "
        "'*' allows any page, with a warning); none by default",
    )
    server.add_argument(
        "--max-waiting",
        type=int,
        default=defaults.max_waiting,
        help=f"API requests that may wait for their first token; more get 429 (default {defaults.max_waiting})",
    )
    server.add_argument(
        "--max-queue-wait",
        type=int,
        default=defaults.max_queue_wait_s,
        metavar="S",
        help="seconds an API request may wait in the queue before it starts; then it gets 429 and is dropped "
        f"(default {defaults.max_queue_wait_s})",
    )
    server.add_argument(
        "--max-body-mib",
        type=float,
        default=defaults.max_body_bytes / MIB,
        help=f"largest request body in MiB; larger get 413 (default {defaults.max_body_bytes / MIB:g})",
    )
    server.add_argument(
        "--open-schema-objects",
        action="store_true",
        help="let JSON schemas' objects (response_format, structured_outputs, tool arguments) take properties they "
        "do not declare; by default an object without 'additionalProperties' in its schema takes only its own, "
        "as vLLM decodes them",
    )
    add_engine_options(parser)
    parser.set_defaults(handler=run)


def api_key_from_keyring(name: str) -> str:
    key = read_secret(name)  # a locked keyring is said as such, not as a missing key
    if not key:
        raise ServeError(
            f"no API key named {name!r} in the system keyring; store one with: keyring set {SERVICE} {name}"
        )
    return key


def limits_from(args: argparse.Namespace) -> ServeLimits:
    if args.max_waiting < 1:
        raise ServeError(f"--max-waiting must be at least 1, not {args.max_waiting}")
    if not args.max_body_mib > 0:
        raise ServeError(f"--max-body-mib must be positive, not {args.max_body_mib:g}")
    if args.max_queue_wait < 1:
        raise ServeError(f"--max-queue-wait must be at least 1 s, not {args.max_queue_wait}")
    return dataclasses.replace(
        ServeLimits(),
        max_waiting=args.max_waiting,
        max_body_bytes=max(1, int(args.max_body_mib * MIB)),
        max_queue_wait_s=args.max_queue_wait,
    )


def serve_options_from(args: argparse.Namespace) -> EngineOptions:
    """The engine options of `generate` plus the server's own engine setting (open schema objects)."""
    options = engine_options_from(args)
    config = dataclasses.replace(options.config, open_schema_objects=args.open_schema_objects)
    return dataclasses.replace(options, config=config)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be between 0 and 65535, not {args.port}")
    limits = limits_from(args)
    allowed_hosts = allowed_hosts_for(args.host, args.allowed_host)
    allowed_origins = check_origins(args.allowed_origin)
    # everything that can fail quickly fails before the model loads
    api_key = api_key_from_keyring(args.api_key_from_keyring) if args.api_key_from_keyring else None
    options = serve_options_from(args)
    options.check()
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ServeError("--served-model-name must not be empty")
    sock = bind_socket(args.host, args.port)  # a taken port fails now, not after a minute of loading

    def progress(message: str) -> None:
        print(f"[{message}]", file=sys.stderr, flush=True)

    try:
        engine = start_engine(options, progress=progress)
    except BaseException:
        sock.close()
        raise
    set_aside_what_is_loaded()
    model_name = args.served_model_name or engine.loaded.info.name
    with EngineThread(engine) as worker:
        app = create_app(
            worker,
            model_name,
            api_key=api_key,
            limits=limits,
            allowed_hosts=allowed_hosts,
            allowed_origins=allowed_origins,
        )
        server = HttpServer(app, args.host, args.port, access_log=args.verbose, sock=sock)
        if not is_loopback(args.host) and api_key is None:
            log.warning("listening on %s without an API key: anyone who can reach it can use the model", args.host)

        def ready(url: str) -> None:
            key_note = "API key required" if api_key else "no API key"
            print(f"inference-studio: serving {model_name!r} at {url}/v1 ({key_note}; Ctrl+C stops)", flush=True)

        server.run(on_ready=ready)
    return 0
