"""Session fixtures: isolated user folders, an in-memory keyring, the tiny model and the embedded model."""

from __future__ import annotations

import os
from pathlib import Path

import keyring
import platformdirs
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.helpers import MemoryKeyring, make_tiny_llama


@pytest.fixture(scope="session", autouse=True)
def _isolated_user_folders(tmp_path_factory: pytest.TempPathFactory):
    """Data and settings go to a temp folder; converted models stay in the real cache (rebuilding is slow)."""
    home = tmp_path_factory.mktemp("studio-home")
    real_cache = Path(platformdirs.user_cache_dir("inference-studio"))
    previous = {k: os.environ.get(k) for k in ("INFERENCE_STUDIO_HOME", "INFERENCE_STUDIO_CACHE")}
    os.environ["INFERENCE_STUDIO_HOME"] = str(home)
    os.environ.setdefault("INFERENCE_STUDIO_CACHE", str(real_cache))
    yield home
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
    eight long streams preempt each other. One process for the session: tests compare metric deltas."""
    from tests.env_keyring import subprocess_env
    from tests.serving import start_studio_server

    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--page-size", "8", "--kv-pages", "128",
            "--api-key-from-keyring", "test-server-key"]  # fmt: skip
    env = subprocess_env({"test-server-key": server_api_key})
    server = start_studio_server(args, tmp_path_factory.mktemp("tiny-server"), env)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory: pytest.TempPathFactory):
    """`inference-studio serve` on the embedded model (real text), no API key."""
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
