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
from engine.core.step_planner import plan_step
from engine.load.loader import load_model
from engine.load.options import LoadOptions
from engine.model import compiled_step, fast_forward
from engine.model import formats as formats_
from engine.model.attention import PagedKVCache
from engine.model.batch import pack
from engine.types import SamplingParams
from tests.engine.model.test_architectures import architectures, save_tiny
from tests.helpers import require_compiled_step, run_to_completion

PAGE = 4
PAGES = 64
LONG = 20  # rows of a chunk the C++ attends through SDPA rather than its loops (over 16)


@pytest.fixture(scope="module")
def library() -> None:
    require_compiled_step()


needs_library = pytest.mark.usefixtures("library")


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
            chunks = [ScheduledChunk(r, n, start, samples=True) for r, n, start in step]
            batch = pack(plan_step(chunks, cache.page_size)[0], cache, tables=compiled)
            logits.append(fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables))
            assert fast.last_compiled == compiled
    return logits


@needs_library
@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral-sliding"])
@pytest.mark.parametrize("fmt", [formats_.FLOAT32, formats_.BFLOAT16, formats_.INT8, formats_.INT4])
def test_same_logits_and_cache_as_the_python_layers(models, name: str, fmt: str, monkeypatch) -> None:
    model = models[name]
    if fmt != formats_.FLOAT32 and not formats_.usable(fmt, torch.device("cpu")):
        pytest.skip(f"{fmt} kernels are unavailable in this torch build")
    # this format at every batch size, whatever this machine measures faster (a fresh cache measures anew)
    monkeypatch.setattr(formats_, "measure", lambda *args, **kwargs: formats_.single(fmt))
    monkeypatch.setattr(formats_, "remembered", lambda *args, **kwargs: None)  # nor what an earlier test measured
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


# formats per tensor as loaders hold files: one format throughout, llama.cpp's Q4_K_M mix (int8 for attn_v and
# ffn_down in every other layer), and three formats within one projection
STORED_PLANS = {
    "int4": "int4",
    "int8": "int8",
    "bfloat16": "bfloat16",
    "Q4_K_M-like mix": lambda layer, name: "int8" if name in ("v_proj", "down_proj") and layer % 2 == 0 else "int4",
    "mixed in one projection": lambda layer, name: {"k_proj": "int8", "v_proj": "bfloat16"}.get(name, "int4"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from tests.helpers import make_tiny_llama

    root = tmp_path_factory.mktemp("stored")
    config_class, model_class, extra = architectures()["qwen2"]
    return {
        "llama": make_tiny_llama(root / "llama"),
        "qwen2": save_tiny(root / "qwen2", config_class, model_class, **extra),
    }


STORED_CASES = [("llama", plan, kv) for plan in STORED_PLANS for kv in (torch.float32, torch.bfloat16)] + [
    ("qwen2", plan, torch.bfloat16)
    for plan in ("Q4_K_M-like mix", "mixed in one projection")  # QKV biases fused
]


@needs_library
@pytest.mark.parametrize(
    ("name", "plan", "kv"), STORED_CASES, ids=[f"{n}-{p}-{str(k)[6:]} KV" for n, p, k in STORED_CASES]
)
def test_models_held_as_stored_give_the_python_layers_logits_and_cache(folders, name, plan, kv) -> None:
    """Weights as a loader holds them (int4, int8, bfloat16, mixed per tensor; an int8 embedding and LM head):
    the compiled step computes what the Python layers do, into a float32 or bfloat16 KV cache."""
    from tests.helpers import hold_as_stored

    model = hold_as_stored(_model(folders[name]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    assert fast.stored_format in fast.compiled, fast.compiled_note
    results, caches = [], []
    for compiled in (False, True):
        cache = _cache(fast, kv)
        results.append(_run(fast, cache, _requests(model.config.vocab_size), compiled))
        caches.append(cache.storage.float())
    for python, ours in zip(*results, strict=True):
        assert float((python - ours).abs().max() / python.abs().max()) < 2e-2
        assert torch.equal(python.argmax(-1), ours.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < 2e-2 * float(caches[0].abs().max())


@needs_library
@pytest.mark.parametrize("plan", ["int4", "int8", "Q4_K_M-like mix"])
def test_a_prompts_many_rows_on_quantized_weights_run_unpacked_tiles_in_python(folders, monkeypatch, plan) -> None:
    """torch's int4 and int8 kernels cost as much per row at any batch size: a step of many rows (a prompt) runs the
    Python layers, which multiply unpacked bfloat16 tiles; decode steps stay in the compiled step. Both give the
    logits and the cache the compiled step gives with those kernels throughout."""
    from engine.model import quantized
    from tests.helpers import hold_as_stored

    if plan != "int8" and quantized.int4_unpacker() is None:
        pytest.skip("the loader's C++ decoders or this torch's int4 packing layout are unknown here")
    model = hold_as_stored(_model(folders["llama"]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    assert fast.stored_format in fast.compiled, fast.compiled_note
    rows = quantized.UNPACK_FROM_ROWS + 12
    ids = torch.randint(0, model.config.vocab_size, (rows + 1,), generator=torch.Generator().manual_seed(5)).tolist()
    runs, caches, compiled = [], [], []
    for threshold in (quantized.UNPACK_FROM_ROWS, 10**9):  # tiles for the prompt; then the int4 kernel throughout
        monkeypatch.setattr(quantized, "UNPACK_FROM_ROWS", threshold)
        request = Request("r", ids, SamplingParams())
        request.page_table = list(range(rows // PAGE + 1))
        cache = _cache(fast, torch.bfloat16)
        logits = []
        with torch.inference_mode():
            for count, start in ((rows, 0), (1, rows)):  # the prompt, then one decode row
                chunks = [ScheduledChunk(request, count, start, samples=True)]
                batch = pack(plan_step(chunks, cache.page_size)[0], cache, tables=True)
                logits.append(fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables))
                compiled.append(fast.last_compiled)
        runs.append(logits)
        caches.append(cache.storage.float())
    assert compiled == [False, True, True, True]
    for tiles, kernel in zip(*runs, strict=True):
        assert float((tiles - kernel).abs().max() / kernel.abs().max()) < 2e-2
        assert torch.equal(tiles.argmax(-1), kernel.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < 2e-2 * float(caches[1].abs().max())


@needs_library
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_an_engine_on_a_model_held_as_stored_runs_it_over_a_bfloat16_cache(tiny_model_dir, quantization) -> None:
    """End to end: the loader holds the weights as stored with a bfloat16 KV cache; the engine's steps run the
    compiled step, and greedy replies equal the Python layers' (same weights, same cache dtype)."""
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine

    loaded = load_model(str(tiny_model_dir), LoadOptions(quantization=quantization))
    assert loaded.as_stored and loaded.kv_dtype == torch.bfloat16
    replies = []
    for compiled in (True, False):
        engine = Engine(loaded, EngineConfig(kv_pages=64, page_size=4, compiled_step=compiled))
        record = engine.runtime_record()
        assert record["kv_cache"] == "bfloat16" and record["fast_path_check"].startswith("agrees")
        assert record["compiled_step"].startswith("on for") == compiled, record["compiled_step"]
        prompts = [[5, 9, 13, 40, 41, 42, 77, 100, 101, 102], [7, 8, 200, 201, 202] * 5]
        requests = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
        run_to_completion(engine)
        assert engine.runner.fast.last_compiled == compiled
        replies.append([r.output_ids for r in requests])
    assert replies[0] == replies[1]


@needs_library
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


class _BrokenStep:
    """A compiled step that fails the way c10 errors reach Python (RuntimeError, ValueError, TypeError, IndexError)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def forward(self, *args) -> torch.Tensor:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError, ValueError, TypeError, IndexError])
def test_any_failure_while_running_falls_back_without_losing_the_step(models, error) -> None:
    """Runs everywhere (a stand-in step): any exception turns the compiled step off and the Python layers redo it."""
    model = models["llama"]
    fast = fast_forward.FastForward(model, pack=True, compiled=False)
    reference = _run(fast, _cache(fast), _requests(model.config.vocab_size), compiled=False)
    fast.compiled = {fast.choice.format_for(2): _BrokenStep(error("injected fault in the compiled step"))}
    fast.kinds.append("compiled step (C++, stand-in)")
    requests = _requests(model.config.vocab_size)
    with torch.inference_mode():
        chunks = [ScheduledChunk(requests[0], 17, 0, True), ScheduledChunk(requests[1], 8, 0, True)]
        cache = _cache(fast)
        batch = pack(plan_step(chunks, cache.page_size)[0], cache, tables=True)
        logits = fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables)
    assert not fast.last_compiled and not fast.compiled
    assert fast.compiled_note.startswith("off: failed while running: injected fault")
    assert not any(kind.startswith("compiled step") for kind in fast.kinds)
    assert torch.equal(logits, reference[0])  # the step was redone by the Python layers, as if nothing happened


def test_a_format_whose_step_fails_to_build_runs_in_python(models, monkeypatch) -> None:
    """Runs everywhere (a stand-in library): any exception building one format's step leaves the others compiled."""
    fast = fast_forward.FastForward(models["llama"], pack=True, compiled=False)

    class Step:
        def __init__(self, fast, linears, progress=None, like=None) -> None:
            if linears == "int8 linears":
                raise TypeError("add_linear(): incompatible function arguments")

    monkeypatch.setattr(compiled_step, "ensure_loaded", lambda progress=None: True)
    monkeypatch.setattr(compiled_step, "CompiledStep", Step)
    steps, reason = compiled_step.build_steps(fast, {"float32": "float32 linears", "int8": "int8 linears"})
    assert list(steps) == ["float32"]
    assert reason == "int8: add_linear(): incompatible function arguments"


@needs_library
def test_the_library_states_the_contract_python_builds_to() -> None:
    from engine.model.batch import CHUNK_COLUMNS

    kinds, columns = (part.split(":")[1].split(",") for part in torch.ops.studio.contract().split(";"))
    assert tuple(columns) == CHUNK_COLUMNS and set(compiled_step.KINDS) <= set(kinds)


@needs_library
def test_a_library_with_another_contract_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(compiled_step, "CHUNK_COLUMNS", ("rows", "first_row", "start"))
    with pytest.raises(compiled_step.CompileUnavailable, match="contract"):
        compiled_step._check_contract()


@needs_library
def test_it_builds_without_warnings() -> None:
    """Built with -Wall -Wextra (torch's headers as system headers): a new warning in decode_step.cpp fails here."""
    assert compiled_step.build_warnings() == []


def test_the_build_targets_the_cpu_torch_is_held_to(monkeypatch) -> None:
    monkeypatch.delenv(compiled_step.ARCH_ENV, raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert compiled_step.target_arch() == "native"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # an older CPU emulated: no AVX-512 in our loops either
    assert compiled_step.target_arch() == "x86-64-v3"
    monkeypatch.setenv(compiled_step.ARCH_ENV, "haswell")
    assert compiled_step.target_arch() == "haswell"


def _step_inputs(fast) -> dict[str, torch.Tensor]:
    """A valid step's inputs for the compiled step's forward: two chunks over pages out of order."""
    requests = _requests(fast.model.config.vocab_size)
    chunks = [ScheduledChunk(requests[0], 3, 0, True), ScheduledChunk(requests[1], 2, 0, True)]
    cache = _cache(fast)
    batch = pack(plan_step(chunks, cache.page_size)[0], cache, tables=True)
    hidden = fast.embed(batch.input_ids)
    cos, sin = fast.rotary(hidden.unsqueeze(0), batch.positions.unsqueeze(0))
    inputs = {"hidden": hidden, "cos": cos[0], "sin": sin[0], "storage": cache.storage,
              "chunks": batch.tables.chunks, "pages": batch.tables.pages}  # fmt: skip
    return inputs


def _changed(tensor: str, row: int, column: int, value: int):
    def change(inputs: dict) -> dict:
        changed = inputs[tensor].clone()
        changed[row, column] = value
        return {tensor: changed}

    return change


BAD_INPUTS = {
    "chunk table two columns wide": lambda i: {"chunks": i["chunks"][:, :2].contiguous()},
    "a chunk starting before position 0": _changed("chunks", 1, 2, -1),
    # the step's last row in no chunk: it would write its KV into chunk 0's first slot (maybe a shared prefix page)
    "a row in no chunk": _changed("chunks", 1, 1, 1),
    "chunks overlapping": _changed("chunks", 1, 0, 1),
    "int32 chunk table": lambda i: {"chunks": i["chunks"].int()},
    "page tables for fewer chunks": lambda i: {"pages": i["pages"][:1]},
    "a page id outside the pool": lambda i: {"pages": i["pages"] + PAGES},
    "hidden of another width": lambda i: {"hidden": i["hidden"][:, :-1]},
    "hidden in bfloat16": lambda i: {"hidden": i["hidden"].bfloat16()},
    "cos for fewer rows": lambda i: {"cos": i["cos"][:-1]},
    "KV storage of another layer count": lambda i: {"storage": i["storage"][:1]},
    "KV storage with its dimensions swapped": lambda i: {"storage": i["storage"].transpose(3, 4)},
}


@needs_library
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_every_input_is_checked_at_the_boundary(models, case: str) -> None:
    """A bad table or tensor fails the call with a one-line error and writes nothing into the KV pages."""
    fast = fast_forward.FastForward(models["llama"], pack=True)
    inputs, step = _step_inputs(fast), fast.compiled[fast.choice.format_for(5)]
    before = inputs["storage"].clone()
    bad = {**inputs, **BAD_INPUTS[case](inputs)}
    with torch.inference_mode(), pytest.raises((RuntimeError, ValueError, TypeError)):
        step.forward(*bad.values())
    assert torch.equal(inputs["storage"], before)
    with torch.inference_mode():
        step.forward(*inputs.values())  # the same step with its own inputs runs
    assert not torch.equal(inputs["storage"], before)


@needs_library
def test_a_linear_of_the_wrong_shape_is_refused_when_building(models) -> None:
    fast = fast_forward.FastForward(models["llama"], pack=True, compiled=False)
    fmt = fast.choice.format_for(1)
    layers = fast.linears[fmt].layers
    swapped = fast_forward.LinearSet([(down, o_proj, gate_up, qkv) for qkv, o_proj, gate_up, down in layers])
    steps, reason = compiled_step.build_steps(fast, {fmt: swapped})
    assert not steps
    assert reason == f"{fmt}: a linear of slot 0 takes 64 features, not 128"
    narrow = fast_forward.LinearSet([(o_proj, o_proj, gate_up, down) for qkv, o_proj, gate_up, down in layers])
    with pytest.raises(ValueError, match="layer 0 slot 0 computes 64 features, not 128"):
        compiled_step.CompiledStep(fast, narrow).forward(*_step_inputs(fast).values())


def _cache(fast, dtype: torch.dtype = torch.float32) -> PagedKVCache:
    return PagedKVCache(len(fast.layers), fast.kv_heads, fast.head_dim, PAGES, PAGE, dtype, "cpu")


def _in_a_fresh_process(code: str, env: dict[str, str], tmp_path: Path) -> str:
    """Run code where nothing is loaded yet, with its own user cache; returns its stdout's last line."""
    environment = {**os.environ, "INFERENCE_STUDIO_CACHE": str(tmp_path / "cache")}
    environment.pop(compiled_step.DISABLE_ENV, None)  # a suite run with it turned off still tests these paths
    environment.update(env)
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


@needs_library
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


@pytest.mark.parametrize(
    ("compiler", "outcome"), [("failing", "1 error"), ("none", "1 skipped")], ids=["broken build", "no compiler"]
)
def test_a_broken_build_fails_the_suite_and_only_a_missing_compiler_skips(tmp_path: Path, compiler, outcome) -> None:
    """This module's tests that need the library, run where the build fails: they fail (a broken decode_step.cpp
    must not leave the suite green while users run the slow path); where there is no compiler, they skip."""
    script = tmp_path / "cxx"
    script.write_text("#!/bin/sh\n" + FAKE_VERSION + "echo 'decode_step.cpp:1: error: broken' >&2\nexit 1\n")
    script.chmod(0o755)
    env = {"CXX": str(script)} if compiler == "failing" else {"CXX": "", "PATH": str(tmp_path / "empty")}
    environment = {**os.environ, "INFERENCE_STUDIO_CACHE": str(tmp_path / "cache"), **env}
    environment.pop(compiled_step.DISABLE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "test_it_builds_without_warnings",
         __file__],
        capture_output=True, text=True, env=environment, timeout=300, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert outcome in done.stdout.splitlines()[-1], done.stdout[-2000:]


def _prompt_step(fast, ids: list[int], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of a prompt's first `rows` tokens through a fresh bfloat16 cache: (logits, the cache as float32)."""
    request = Request("r", ids, SamplingParams())
    request.page_table = list(range(rows // PAGE + 1))
    cache = _cache(fast, torch.bfloat16)
    with torch.inference_mode():
        chunks = [ScheduledChunk(request, rows, 0, samples=True)]
        batch = pack(plan_step(chunks, cache.page_size)[0], cache, tables=True)
        logits = fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables)
    return logits, cache.storage.float()


@needs_library
@pytest.mark.parametrize("rows", [12, 76])
@pytest.mark.parametrize("plan", ["int4", "int8", "Q4_K_M-like mix"])
def test_steps_on_quantized_weights_give_the_kernels_results_through_bfloat16_tiles(folders, plan, rows) -> None:
    """Steps of several rows may multiply int4/int8 weights as bfloat16 tiles (torch's brgemm) instead of torch's
    weight-only kernels, from a row count measured at load: forced on here (tiny weights never measure them), the
    compiled step gives the logits and the cache it gives without them, whichever this CPU would pick: with torch's
    kernels for a dozen rows, with the Python layers' oneDNN tiles for a prompt of 76 (which the compiled step
    takes itself once every quantized weight has tiles)."""
    from engine.model import int4pack, quantized
    from tests.helpers import hold_as_stored

    assert 12 < quantized.UNPACK_FROM_ROWS <= 76  # the two sides of the Python layers' threshold

    if plan != "int8" and int4pack.layout() is None:
        pytest.skip("this torch's int4 packing layout is unknown here")
    model = hold_as_stored(_model(folders["llama"]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    step = fast.compiled[fast.stored_format]
    assert step.tiles_from == {kind: 0 for kind in step.tiles_from}  # tiny weights: torch's kernels, unmeasured
    layout = int4pack.layout()
    ids = torch.randint(0, model.config.vocab_size, (rows + 1,), generator=torch.Generator().manual_seed(7)).tolist()
    runs, caches = [], []
    for start in (1, 0):  # tiles from one row, then never
        step.tiles_from = dict.fromkeys(step.tiles_from, start)
        step.model.use_tiles(start, start, layout.block if layout else 32, bool(layout and layout.split))
        logits, cache = _prompt_step(fast, ids, rows)
        runs.append(logits)
        assert fast.last_compiled == (start == 1 or rows < quantized.UNPACK_FROM_ROWS)
        caches.append(cache)
    tiles, kernel = runs
    assert not torch.equal(tiles, kernel)  # the tiles ran: their sums are float32, the kernels' bfloat16
    assert float((tiles - kernel).abs().max() / kernel.abs().max()) < 2e-2
    assert torch.equal(tiles.argmax(-1), kernel.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < 2e-2 * float(caches[1].abs().max())


@needs_library
@pytest.mark.parametrize("plan", ["int4", "Q4_K_M-like mix"])
@pytest.mark.parametrize("rows", [12, 40])
def test_steps_of_a_few_rows_may_multiply_int4_weights_with_int8_activations(folders, plan, rows) -> None:
    """For the row counts measured at load per input width (forced here to 2-64 rows: tiny weights never measure
    it), int4 weights multiply int8 activations with VNNI dot products: a step of 12 rows (chats decoding), or of 40
    (a prompt's chunk beside them, still a compiled step), gives the logits and the cache torch's kernels give,
    within the activations' rounding; with AMX tiles (where the CPU has them), the same logits and cache as VNNI's,
    bit for bit."""
    from engine.model import int4pack, tiles
    from tests.helpers import hold_as_stored

    if int4pack.layout() is None or not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI int4 products (their plain loops are tested in test_tiles.py)")
    model = hold_as_stored(_model(folders["llama"]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    step = fast.compiled[fast.stored_format]
    assert step.vnni_rows and all(rows == tiles.NEVER for rows in step.vnni_rows.values())  # tiny: never measured
    assert tiles.ACTIVATION_BUCKETS[-1] == 64  # what a load may measure them for
    ids = torch.randint(0, model.config.vocab_size, (rows + 1,), generator=torch.Generator().manual_seed(8)).tolist()
    runs, caches = [], []
    amx = torch.ops.studio.int4_amx()
    # int8 activations from two rows (AMX tiles from 8), with VNNI throughout, then never
    for start, amx_from in ((2, 8 if amx else 0), (2, 0), (0, 0)):
        for width in step.vnni_rows:
            step.model.use_vnni(width, start, 64, amx_from)
        logits, cache = _prompt_step(fast, ids, rows)
        runs.append(logits)
        assert fast.last_compiled
        caches.append(cache)
    with_amx, vnni, kernel = runs
    assert torch.equal(with_amx, vnni) and torch.equal(caches[0], caches[1])
    assert not torch.equal(vnni, kernel)  # they ran
    assert float((vnni - kernel).abs().max() / kernel.abs().max()) < 3e-2
    assert float((caches[1] - caches[2]).abs().max()) < 3e-2 * float(caches[2].abs().max())
    width = next(iter(step.vnni_rows))
    with pytest.raises(ValueError, match="range of row counts"):
        step.model.use_vnni(width, 8, 4, 0)
    with pytest.raises(ValueError, match="AMX tiles start within"):
        step.model.use_vnni(width, 4, 8, 12)


@needs_library
@pytest.mark.parametrize("plan", ["int8", "Q4_K_M-like mix"])
@pytest.mark.parametrize("rows", [12, 40])
def test_steps_of_a_few_rows_may_multiply_int8_weights_with_int8_activations(folders, plan, rows) -> None:
    """For the row counts measured at load (forced here to 2-64 rows: tiny weights never measure it), int8 weights
    multiply int8 activations with VNNI dot products: a step of 12 or 40 rows gives the logits and the cache torch's
    kernels give, within the activations' rounding; with AMX tiles (where the CPU has them), the same logits and cache
    as VNNI's, bit for bit."""
    from engine.model import tiles
    from tests.helpers import hold_as_stored

    if not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI products (never chosen; plain loops: test_tiles.py)")
    model = hold_as_stored(_model(folders["llama"]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    step = fast.compiled[fast.stored_format]
    assert step.int8_rows == tiles.NEVER and all(rows == tiles.NEVER for rows in step.vnni_rows.values())
    ids = torch.randint(0, model.config.vocab_size, (rows + 1,), generator=torch.Generator().manual_seed(8)).tolist()
    runs, caches = [], []
    amx = torch.ops.studio.int4_amx()
    # int8 activations from two rows (AMX tiles from 8), with VNNI throughout, then never
    for start, amx_from in ((2, 8 if amx else 0), (2, 0), (0, 0)):
        step.model.use_int8_activations(start, 64, amx_from)
        logits, cache = _prompt_step(fast, ids, rows)
        runs.append(logits)
        assert fast.last_compiled
        caches.append(cache)
    with_amx, vnni, kernel = runs
    assert torch.equal(with_amx, vnni) and torch.equal(caches[0], caches[1])
    assert not torch.equal(vnni, kernel)  # they ran
    assert float((vnni - kernel).abs().max() / kernel.abs().max()) < 3e-2
    assert float((caches[1] - caches[2]).abs().max()) < 3e-2 * float(caches[2].abs().max())
    with pytest.raises(ValueError, match="range of row counts"):
        step.model.use_int8_activations(8, 4, 0)
    with pytest.raises(ValueError, match="AMX tiles start within"):
        step.model.use_int8_activations(4, 8, 12)


@needs_library
def test_the_check_allows_for_int8_activations_only_where_they_run(folders, monkeypatch) -> None:
    """A 7B-shape file's lean forward was rejected (2.5e-2 against 2e-2) once int8 activations ran in the check: their
    rounding is in its tolerance where a step uses them, and nowhere else."""
    from engine.model import int4pack, tiles
    from tests.helpers import hold_as_stored

    if int4pack.layout() is None or not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI int4 products")
    checks = {}
    for forced in ("always", "never"):
        monkeypatch.setenv(tiles.VNNI_ENV, forced)
        model = hold_as_stored(_model(folders["llama"]), STORED_PLANS["int4"], embed="int8", head="int8")
        fast = fast_forward.build(model)
        assert fast is not None and fast.check.passed
        checks[forced] = fast.check.tolerance
    assert checks["always"] >= fast_forward.INT8_ACTIVATIONS_TOLERANCE > checks["never"]


@needs_library
def test_the_fast_path_checks_a_part_of_the_model_with_the_tiles_measured_for_the_whole(folders, monkeypatch) -> None:
    """The check runs the first layers' own compiled steps: they take the whole model's measured row counts (the
    same routes as the steps that serve), and nothing is measured a second time while the model loads."""
    from engine.model import int4pack, tiles
    from tests.helpers import hold_as_stored

    plan = "int8" if int4pack.layout() is None else "Q4_K_M-like mix"
    measured = []

    def tiles_from(kind, a, b, progress=None):
        measured.append(kind)
        return 5

    monkeypatch.setattr(tiles, "tiles_from", tiles_from)
    model = hold_as_stored(_model(folders["llama"]), STORED_PLANS[plan], embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    step = fast.compiled[fast.stored_format]
    assert measured and set(step.tiles_from.values()) == {5}
    count = len(measured)
    part = fast.truncated(1)
    assert len(measured) == count  # nothing measured again
    assert part.compiled[fast.stored_format].tiles_from == step.tiles_from


@needs_library
def test_the_step_hands_its_arguments_back_to_be_let_go_with_the_interpreter_lock(models) -> None:
    """The C++ step returns its output, then the very tensors it was given: let go inside the call (the lock released),
    each would take the lock to release its Python object, waiting on whichever thread holds it."""
    fast = fast_forward.FastForward(models["llama"], pack=True)
    inputs, step = _step_inputs(fast), fast.compiled[fast.choice.format_for(5)]
    given = [inputs[name] for name in ("hidden", "cos", "sin", "storage", "chunks", "pages")]
    output, *handed_back = step.model.forward(*given)
    assert all(back is tensor for back, tensor in zip(handed_back, given, strict=True))
    assert torch.equal(step.forward(*given), output)  # what the engine takes: the output alone


CLAIMED_CASES = {  # how the loader holds float weights: prepacked float32 with its plain rows, plain float32, bfloat16
    "float32 prepacked": (True, "float32"),
    "float32 not prepacked": (False, "float32"),
    "bfloat16 as stored": (None, "bfloat16"),
}


@needs_library
@pytest.mark.parametrize("case", list(CLAIMED_CASES))
def test_float_weights_may_take_claimed_dot_products(folders, monkeypatch, case: str) -> None:
    """Forced onto the claimed dot products at every decode row count, a step of float32 or bfloat16 weights gives
    the Python layers' logits and cache; forced off, no linear takes them."""
    from engine.model import dense_rows
    from tests.helpers import hold_as_stored

    pack, plan = CLAIMED_CASES[case]
    monkeypatch.setattr(formats_, "measure", lambda *args, **kwargs: formats_.single(formats_.FLOAT32))
    monkeypatch.setattr(formats_, "remembered", lambda *args, **kwargs: None)
    monkeypatch.setenv(dense_rows.ENV, "never")
    model = _model(folders["qwen2"])  # QKV biases: added after the claimed product
    if plan != "float32":
        model = hold_as_stored(model, plan, head=plan)
    off = next(iter(fast_forward.FastForward(model, pack=pack).compiled.values()))
    assert off.claimed_to == 0 and "claimed" not in (off.tiles_note or "")
    monkeypatch.setenv(dense_rows.ENV, "always")
    fast = fast_forward.FastForward(model, pack=pack)
    step = next(iter(fast.compiled.values()))
    layers = len(model.model.layers)
    assert step.claimed_to == dense_rows.BUCKETS[-1] and step.claimed_linears == 4 * layers  # qkv, o, gate_up, down
    assert "claimed dot products" in step.tiles_note
    if plan != "float32":  # a stored 16-bit head multiplies its decode rows alike
        assert fast.lm_head.fast.claimed_to == step.claimed_to
    results, caches = [], []
    for compiled in (False, True):
        cache = _cache(fast)
        results.append(_run(fast, cache, _requests(model.config.vocab_size), compiled))
        caches.append(cache.storage.float())
    tolerance = 1e-4 if plan == "float32" else 2e-2
    for python, ours in zip(*results, strict=True):
        assert float((python - ours).abs().max() / python.abs().max()) < tolerance
        assert torch.equal(python.argmax(-1), ours.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < tolerance * float(caches[0].abs().max())
    assert step.model.use_claimed(0) == 4 * layers  # every float linear can take them; 0: none does


@needs_library
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_a_bfloat16_copy_in_blocks_gives_the_python_layers_logits(models, name: str, monkeypatch) -> None:
    """A bfloat16 copy held in the library's blocks (forced: which layout a machine takes is measured) runs as its own
    kind in the step, with the Python layers' logits and cache."""
    from engine.model import bf16_blocks

    monkeypatch.setenv(bf16_blocks.ENV, "always")
    monkeypatch.setattr(formats_, "measure", lambda *args, **kwargs: formats_.single(formats_.BFLOAT16))
    monkeypatch.setattr(formats_, "remembered", lambda *args, **kwargs: None)
    model = models[name]
    fast = fast_forward.FastForward(model, pack=True, formats=(formats_.FLOAT32, formats_.BFLOAT16))
    assert formats_.BFLOAT16 in fast.compiled, fast.compiled_note
    assert fast.linears[formats_.BFLOAT16].layers[0][0].blocks is not None
    results, caches = [], []
    for compiled in (False, True):
        cache = _cache(fast)
        results.append(_run(fast, cache, _requests(model.config.vocab_size), compiled))
        caches.append(cache.storage)
    for python, ours in zip(*results, strict=True):
        assert float((python - ours).abs().max() / python.abs().max()) < 1e-4  # the same products, summed alike
        assert torch.equal(python.argmax(-1), ours.argmax(-1))
    assert float((caches[0] - caches[1]).abs().max()) < 1e-4 * float(caches[0].abs().max())
