"""The compiled step: the same logits and KV writes as the Python layers for every weight format, mixed decode rows,
short chunks and prompts, pages out of order, sliding windows and QKV biases; the Python layers and a one-line reason
wherever it can't be built, loaded or run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.core.request import Request
from engine.core.scheduler import ScheduledChunk
from engine.load.loader import load_model
from engine.load.options import LoadOptions
from engine.model import compiled_step, fast_forward
from engine.model import formats as formats_
from engine.model.attention import PagedKVCache
from engine.model.batch import pack
from engine.types import SamplingParams
from tests.engine.model.test_architectures import architectures, save_tiny
from tests.helpers import run_to_completion

pytestmark = pytest.mark.skipif(not compiled_step.ensure_loaded(), reason="no C++ compiler here")

PAGE = 4
PAGES = 64
LONG = 20  # rows of a chunk the C++ attends through SDPA rather than its loops (over 16)


def _model(folder: Path):
    return load_model(str(folder), LoadOptions(dtype="float32")).model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, torch.nn.Module]:
    from tests.helpers import make_tiny_llama

    root = tmp_path_factory.mktemp("compiled")
    found = {"llama": _model(make_tiny_llama(root / "llama"))}
    for name in ("qwen2", "mistral-sliding"):  # QKV biases; a sliding window of 8 tokens
        config_class, model_class, extra = architectures()[name]
        found[name] = _model(save_tiny(root / name, config_class, model_class, **extra))
    return found


def _requests(vocab: int) -> list[Request]:
    """Three sequences whose pages are interleaved and out of order, as a busy pool hands them out."""
    generator = torch.Generator().manual_seed(3)
    lengths = (21, 12, 60)
    requests = []
    for index, length in enumerate(lengths):
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        request = Request(f"r{index}", ids, SamplingParams())
        request.page_table = [PAGES - 1 - (3 * page + index) for page in range(length // PAGE + 1)]
        requests.append(request)
    return requests


def _run(fast, cache, requests, compiled: bool) -> list[torch.Tensor]:
    """Prompts (one whole, one in two chunks, one short), then mixed steps: decode rows beside a 4-token chunk over
    cached pages (what a verified draft is), and a decode row beside a long chunk over cached pages."""
    logits = []
    steps = [
        [(requests[0], 17, 0), (requests[1], 8, 0)],
        [(requests[2], LONG, 0)],
        [(requests[2], 5, LONG)],
        [(requests[0], 4, 17), (requests[1], 1, 8), (requests[2], 1, 25)],
        [(requests[1], 1, 9), (requests[2], LONG, 26)],
    ]
    with torch.inference_mode():
        for step in steps:
            batch = pack([ScheduledChunk(r, n, start, samples=True) for r, n, start in step], cache, tables=compiled)
            logits.append(fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables))
            assert fast.last_compiled == compiled
    return logits


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral-sliding"])
@pytest.mark.parametrize("fmt", [formats_.FLOAT32, formats_.BFLOAT16, formats_.INT8, formats_.INT4])
def test_same_logits_and_cache_as_the_python_layers(models, name: str, fmt: str, monkeypatch) -> None:
    model = models[name]
    if fmt != formats_.FLOAT32 and not formats_.usable(fmt, torch.device("cpu")):
        pytest.skip(f"{fmt} kernels are unavailable in this torch build")
    # this format at every batch size, whatever this machine measures faster (a fresh cache measures anew)
    monkeypatch.setattr(formats_, "measure", lambda *args, **kwargs: formats_.single(fmt))
    fast = fast_forward.FastForward(model, pack=True, formats=(formats_.FLOAT32, fmt))
    assert fmt in fast.compiled, fast.compiled_note
    caches = []
    results = []
    for compiled in (False, True):
        cache = _cache(fast)
        results.append(_run(fast, cache, _requests(model.config.vocab_size), compiled))
        caches.append(cache.storage)
    # float32 sums in another order; lower-precision formats round activations to bfloat16 alike, with rare ties
    tolerance = 1e-4 if fmt == formats_.FLOAT32 else 2e-2
    for python, ours in zip(*results, strict=True):
        scale = python.abs().max()
        assert float((python - ours).abs().max() / scale) < tolerance
        assert torch.equal(python.argmax(-1), ours.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < tolerance * float(caches[0].abs().max())


def test_the_engine_uses_it_and_says_so(make_engine, tiny_loaded) -> None:
    from tests.helpers import reference_greedy

    engine = make_engine()
    assert any(kind.startswith("compiled step") for kind in engine.kernels)
    assert engine.runtime_record()["compiled_step"].startswith("on for")
    prompt = [5, 9, 13, 40, 41, 42, 77, 100, 101, 102, 103, 7, 8, 200, 201]
    request = engine.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    run_to_completion(engine)
    assert request.output_ids == reference_greedy(tiny_loaded.model, prompt, 12, eos=False)
    assert engine.runner.fast.last_compiled  # the last decode step ran compiled


def test_turned_off_by_config_runs_the_python_layers(make_engine) -> None:
    engine = make_engine(compiled_step=False)
    assert engine.runtime_record()["compiled_step"] == "off (not asked for)"
    assert not any(kind.startswith("compiled step") for kind in engine.kernels)


def test_a_failure_while_running_falls_back_without_losing_the_step(models, monkeypatch) -> None:
    model = models["llama"]
    fast = fast_forward.FastForward(model, pack=True)
    fmt = fast.choice.format_for(2)
    reference = _run(fast, _cache(fast), _requests(model.config.vocab_size), compiled=False)

    def broken(*args):
        raise RuntimeError("injected fault in the compiled step")

    monkeypatch.setattr(fast.compiled[fmt], "forward", broken)
    requests = _requests(model.config.vocab_size)
    with torch.inference_mode():
        chunks = [ScheduledChunk(requests[0], 17, 0, True), ScheduledChunk(requests[1], 8, 0, True)]
        batch = pack(chunks, _cache(fast), tables=True)
        logits = fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables)
    assert not fast.last_compiled and not fast.compiled
    assert fast.compiled_note.startswith("off: failed while running: injected fault")
    assert not any(kind.startswith("compiled step") for kind in fast.kinds)
    assert torch.equal(logits, reference[0])  # the step was redone by the Python layers, as if nothing happened


def _cache(fast) -> PagedKVCache:
    return PagedKVCache(len(fast.layers), fast.kv_heads, fast.head_dim, PAGES, PAGE, torch.float32, "cpu")


def _in_a_fresh_process(code: str, env: dict[str, str], tmp_path: Path) -> str:
    """Run code where nothing is loaded yet, with its own user cache; returns its stdout's last line."""
    environment = {**os.environ, "INFERENCE_STUDIO_CACHE": str(tmp_path / "cache"), **env}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environment, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


FAKE_VERSION = '[ "$1" = --version ] && { echo fake 1.0; exit 0; }\n'
REPORT = """
    from engine.model import compiled_step
    print(compiled_step.ensure_loaded(), "|", compiled_step.failure_reason())
"""


def test_without_a_compiler_it_says_so(tmp_path: Path) -> None:
    out = _in_a_fresh_process(REPORT, {"CXX": "", "PATH": str(tmp_path / "empty")}, tmp_path)
    assert out.startswith("False | no C++ compiler found")


def test_a_failing_compile_gives_its_first_error_line(tmp_path: Path) -> None:
    script = tmp_path / "cxx"
    script.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo fake 1.0; exit 0; }\necho 'x.cpp:1: error: no' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    out = _in_a_fresh_process(REPORT, {"CXX": str(script)}, tmp_path)
    assert out == "False | compiling the decode step failed: x.cpp:1: error: no"
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-written is left to load


def test_a_damaged_cached_library_is_built_again(tmp_path: Path) -> None:
    """The fake compiler copies the library this process built: the damaged entry is replaced and loads."""
    built = compiled_step._state.loaded
    script = tmp_path / "cxx"
    script.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo fake 1.0; exit 0; }\n'
        f'while [ "$1" != -o ]; do shift; done\ncp \'{built}\' "$2"\n'
    )
    script.chmod(0o755)
    code = """
        import os
        os.environ["CXX"] = os.environ["FAKE_CXX"]
        from engine.model import compiled_step
        target = compiled_step._library_path(compiled_step._compiler())
        target.parent.mkdir(parents=True)
        target.write_bytes(b"not a library")
        print(compiled_step.ensure_loaded(), "|", compiled_step.failure_reason(), "|", target.stat().st_size > 1000)
    """
    out = _in_a_fresh_process(code, {"FAKE_CXX": str(script)}, tmp_path)
    assert out == "True | None | True"


def test_turned_off_by_the_environment(tmp_path: Path) -> None:
    out = _in_a_fresh_process(REPORT, {compiled_step.DISABLE_ENV: "0"}, tmp_path)
    assert out == f"False | turned off ({compiled_step.DISABLE_ENV}=0)"


def test_a_package_without_the_source_says_so_as_information(tmp_path: Path) -> None:
    """A frozen studio ships neither the C++ source nor torch's headers: the Python layers run, said at INFO."""
    code = """
        import logging, pathlib
        records = []
        logging.getLogger("engine.model.compiled_step").addHandler(logging.Handler())
        logging.getLogger("engine.model.compiled_step").handlers[0].emit = records.append
        logging.getLogger("engine.model.compiled_step").setLevel(logging.INFO)
        from engine.model import compiled_step
        compiled_step.SOURCE = pathlib.Path("/nonexistent/decode_step.cpp")
        ok = compiled_step.ensure_loaded()
        print(ok, "|", compiled_step.failure_reason(), "|", [r.levelname for r in records])
    """
    out = _in_a_fresh_process(code, {}, tmp_path)
    assert out == "False | its source is not part of this installation (a packaged studio) | ['INFO']"
