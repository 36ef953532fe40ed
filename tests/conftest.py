"""Session fixtures: isolated user folders, an in-memory keyring, the tiny model and the embedded model."""

from __future__ import annotations

import os
from pathlib import Path

import keyring
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No test reaches the model hub (huggingface_hub reads this when it is imported, so before anything imports it): a
# hub repo comes from a fake local hub cache, a download from a stub; the server processes inherit it.
os.environ["HF_HUB_OFFLINE"] = "1"

from tests.helpers import MemoryKeyring, make_tiny_llama

BF16_BLOCKS_ENV = "INFERENCE_STUDIO_BF16_BLOCKS"  # engine/model/bf16_blocks.py's, named here before engine imports


@pytest.fixture(scope="session", autouse=True)
def _isolated_user_folders(tmp_path_factory: pytest.TempPathFactory):
    """Data, settings and the cache go to folders of this run: nothing a test reads (the compiled step, the weight
    formats measured on this machine, converted models) comes from an earlier run or the user's own studio. What
    the cache gets is built once per run (see prepared_cache) and shared by the run's server processes."""
    home = tmp_path_factory.mktemp("studio-home")
    previous = {k: os.environ.get(k) for k in ("INFERENCE_STUDIO_HOME", "INFERENCE_STUDIO_CACHE", BF16_BLOCKS_ENV)}
    os.environ["INFERENCE_STUDIO_HOME"] = str(home)
    os.environ["INFERENCE_STUDIO_CACHE"] = str(tmp_path_factory.mktemp("studio-cache"))
    # bfloat16 copies in oneDNN's packing on every machine (the blocks' tests force them): a bfloat16 head's or layer's
    # sums would otherwise be rounded or not by what this CPU measured, and each server process would measure it
    os.environ[BF16_BLOCKS_ENV] = "never"
    yield home
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session", autouse=True)
def prepared_cache(_isolated_user_folders) -> None:
    """The run's cache with the compiled step built once, here, before any test: the first engine of the run (in a
    window test, a server process) would otherwise compile it within that test's waits, and two processes starting
    at once would both compile it. The GGUF decoders are compiled beside it, as a first start does. The embedded
    model is converted by the embedded_model fixture: tests and processes that run it depend on that fixture."""
    from engine.load import native
    from engine.model import compiled_step

    compiled_step.prepare_in_background()
    native.available()  # False where they can't be built: torch's decoders run
    compiled_step.ensure_loaded()  # False where it can't be built (no compiler, turned off): the Python layers run


@pytest.fixture(autouse=True)
def memory_keyring() -> MemoryKeyring:
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    return backend


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def embedded_model():
    """The real embedded default model (SmolLM2-135M-Instruct), float32 on CPU, loaded once per session. The dtype is
    pinned: under `auto` the engine may compute in bfloat16 where it is faster, and golden tests are token-exact."""
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions

    return load_model(None, LoadOptions(dtype="float32"))


@pytest.fixture(scope="session")
def server_api_key() -> str:
    import secrets

    return "sk-studio-test-" + secrets.token_urlsafe(18)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path, server_api_key: str, tmp_path_factory: pytest.TempPathFactory):
    """`inference-studio serve` on the tiny model, API key from the (test) keyring, a KV pool small enough that
    eight long streams preempt each other. One process for the session: tests compare metric deltas. Float32 pinned:
    the soak and the tests that compare a stream with the same request alone need batch-invariant arithmetic, which
    `auto` (bfloat16 layers where this CPU runs them faster) does not promise."""
    from tests.env_keyring import subprocess_env
    from tests.serving import start_studio_server

    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--page-size", "8", "--kv-pages", "128",
            "--dtype", "float32", "--api-key-from-keyring", "test-server-key"]  # fmt: skip
    env = subprocess_env({"test-server-key": server_api_key})
    server = start_studio_server(args, tmp_path_factory.mktemp("tiny-server"), env)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory: pytest.TempPathFactory, embedded_model):
    """`inference-studio serve` on the embedded model (real text), no API key. After embedded_model: the model is
    in the run's cache by then, so the server's start-up loads it rather than converting it."""
    from tests.serving import start_studio_server

    server = start_studio_server(["--served-model-name", "smollm2"], tmp_path_factory.mktemp("embedded-server"))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def collect_qt_garbage_in_the_main_thread(request):
    """After a Qt test, collect reference cycles here, in the GUI thread: left to Python, a later collection
    may run in an engine or server thread and destroy Qt objects there (seen as "QObject::killTimer: Timers
    cannot be stopped from another thread" and, once, a segfault in the next test)."""
    yield
    if "qtbot" in request.fixturenames or "qapp" in request.fixturenames:
        import gc

        gc.collect()
