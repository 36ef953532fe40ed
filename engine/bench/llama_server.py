"""llama.cpp's own HTTP server (llama-server, from the optional PyPI package `xllamacpp`) on a GGUF file, run as
its own process by the benchmark: `python -m engine.bench.llama_server --model X.gguf --port 0 --threads 2 ...`
prints `READY <url>` once /health answers and stops on SIGTERM."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
import urllib.request

# What the benchmark records of the peer: llama.cpp as its server runs by default, with continuous batching and one
# KV buffer shared by the slots (so a slot's context is the whole context, as in the studio), no speculation.
FLAGS = {"cont_batching": True, "kv_unified": True, "speculative": "none", "cache_prompt": True, "n_batch": 2048}


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def parameters(args: argparse.Namespace):
    import xllamacpp as xlc  # the optional extra; the benchmark checks for it before starting this process

    p = xlc.CommonParams()
    p.model.path = args.model
    p.cpuparams.n_threads = args.threads  # decode
    p.cpuparams_batch.n_threads = args.threads  # prompt processing
    p.n_parallel = args.slots
    p.n_ctx = args.ctx  # all slots together (kv_unified: one buffer)
    p.kv_unified = FLAGS["kv_unified"]
    p.cont_batching = FLAGS["cont_batching"]
    p.n_batch = FLAGS["n_batch"]
    p.hostnames = [args.host]
    p.port = args.port
    p.endpoint_metrics = True
    p.ui = False
    p.speculative.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE]
    p.cache_prompt = FLAGS["cache_prompt"]
    p.n_gpu_layers = 0
    p.verbosity = 0
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.port == 0:
        args.port = free_port(args.host)
    import xllamacpp as xlc

    server = xlc.Server(parameters(args))  # returns once the model is loaded
    url = server.listening_address
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # llama-server installs its own handlers: take them back
        signal.signal(sig, lambda *_: stop.set())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    else:
        print("llama-server did not answer /health within 60 s", file=sys.stderr)
        return 1
    flags = {**FLAGS, "threads": args.threads, "slots": args.slots, "ctx": args.ctx, "xllamacpp": xlc.__version__}
    print(f"READY {url} {json.dumps(flags)}", flush=True)
    while not stop.wait(0.5):
        pass
    del server  # its destructor stops the server thread
    return 0


if __name__ == "__main__":
    sys.exit(main())
