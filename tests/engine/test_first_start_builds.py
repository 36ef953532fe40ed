"""The first start's two C++ builds: the decode step compiles beside the model's load (not after it), each build is
said as its own stage while the load waits for it, and a process that exits mid-build leaves no compiler running and
no partial file in the cache. Each case runs in a fresh process with its own cache and a fake compiler that copies
the library this run built (a real compile is 10-20 s)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.load import native
from engine.model import compiled_step
from tests.gguf_files import write_tiny_model
from tests.helpers import make_tiny_tokenizer


def _fresh_process(code: str, env: dict[str, str], cache: Path) -> list[str]:
    environment = {**os.environ, "INFERENCE_STUDIO_CACHE": str(cache), **env}
    environment.pop(compiled_step.DISABLE_ENV, None)
    environment.pop(native.DISABLE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def _fake_compiler(folder: Path, library: Path, before: str = "") -> Path:
    """A compiler that notes when it started, runs `before`, and writes `library` where -o says."""
    script = folder / "fake-cxx"
    script.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo fake 1.0; exit 0; }\n'
        f'echo "$$ $(date +%s.%N)" >> "{folder}/started"\n{before}\n'
        f'while [ "$1" != -o ]; do shift; done\ncp \'{library}\' "$2"\n'
    )
    script.chmod(0o755)
    return script


def _compiled_step_library() -> Path:
    if not compiled_step.ensure_loaded():
        pytest.skip(f"no compiled step here: {compiled_step.failure_reason()}")
    assert compiled_step._state.loaded is not None
    return compiled_step._state.loaded


def test_the_decode_step_compiles_while_the_load_runs_and_its_wait_is_named(tmp_path: Path) -> None:
    fake = _fake_compiler(tmp_path, _compiled_step_library(), before="sleep 1")
    lines = _fresh_process(
        """
        import time
        from engine.model import compiled_step
        compiled_step.prepare_in_background()
        time.sleep(0.3)  # the model's load
        asked = time.time()
        said = []
        print(compiled_step.ensure_loaded(said.append), compiled_step.failure_reason())
        print(said == [compiled_step.COMPILING_WORDS])
        print(asked)
        """,
        {"CXX": str(fake)},
        tmp_path / "cache",
    )
    assert lines[0] == "True None"
    assert lines[1] == "True"  # the load waited for the compiler, and said so
    started = float((tmp_path / "started").read_text().split()[1])
    assert started < float(lines[2])  # the compiler ran before the load asked for the step: beside it


def test_a_cached_decode_step_is_loaded_without_a_stage(tmp_path: Path) -> None:
    fake = _fake_compiler(tmp_path, _compiled_step_library())
    code = """
        import time
        from engine.model import compiled_step
        compiled_step.prepare_in_background()
        said = []
        print(compiled_step.ensure_loaded(said.append), said)
        """
    assert _fresh_process(code, {"CXX": str(fake)}, tmp_path / "cache")[-1].startswith("True")  # built
    # the next process finds the build in the cache: it loads in milliseconds, and no stage is said for it
    assert _fresh_process(code, {"CXX": str(fake)}, tmp_path / "cache")[-1] == "True []"


BUILDS_ON_A_THREAD = {
    "decode step": "from engine.model import compiled_step\ncompiled_step.prepare_in_background()",
    "GGUF decoders": "import threading\nfrom engine.load import native\n"
    "threading.Thread(target=native.available, daemon=True).start()  # the window's loader thread",
}


@pytest.mark.parametrize("build", sorted(BUILDS_ON_A_THREAD))
def test_a_process_that_exits_mid_build_stops_its_compiler_and_leaves_no_partial_file(tmp_path: Path, build) -> None:
    fake = _fake_compiler(tmp_path, _compiled_step_library(), before="sleep 60")
    # the compiler is running when the command exits (its load refused, the window closed)
    _fresh_process(BUILDS_ON_A_THREAD[build] + "\nimport time\ntime.sleep(1)\n", {"CXX": str(fake)}, tmp_path / "cache")
    pid = int((tmp_path / "started").read_text().split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()
    assert not [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_the_first_gguf_load_names_the_decoders_compile_before_reading(tmp_path: Path) -> None:
    compiler = next((shutil.which(c) for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None or not native.available():
        pytest.skip(f"the C++ decoders are unavailable here: {native.unavailable_reason()}")
    fake = _fake_compiler(tmp_path, native._library_path(compiler))
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    make_tiny_tokenizer(tokenizer)
    from gguf import GGMLQuantizationType

    path = write_tiny_model(tmp_path / "tiny.gguf", tokenizer, lambda name: GGMLQuantizationType.Q4_0)
    lines = _fresh_process(
        f"""
        import json
        from engine.load import loader, native
        said = []
        loader.load_model({str(path)!r}, progress=said.append)
        print(native.available())
        print(json.dumps([s.split(":")[0].split(" (")[0] for s in said]))
        """,
        {"CXX": str(fake)},
        tmp_path / "cache",
    )
    assert lines[0] == "True"
    stages = json.loads(lines[1])
    assert stages[0] == "compiling the GGUF decoders for this CPU"
    assert stages.index("compiling the GGUF decoders for this CPU") < min(
        i for i, s in enumerate(stages) if s.startswith("reading")
    )


@pytest.mark.parametrize(("free", "beside"), [(8 << 30, True), (1 << 30, False)])
def test_start_engine_starts_the_build_before_the_load_where_memory_allows(monkeypatch, free, beside) -> None:
    from engine import launch
    from engine.errors import ModelFormatError

    calls: list[str] = []
    monkeypatch.setattr(launch, "free_memory_bytes", lambda device: free)
    monkeypatch.setattr(compiled_step, "prepare_in_background", lambda: calls.append("build"))

    def loader(spec, options, progress=None):
        calls.append("load")
        raise ModelFormatError("the file ends inside tensor 3")

    with pytest.raises(ModelFormatError):
        launch.start_engine(launch.EngineOptions(), loader=loader)
    # the compiler's ~860 MB beside the load only with room for both; else it compiles after the load, as before
    assert calls == (["build", "load"] if beside else ["load"])
