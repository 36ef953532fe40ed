"""GGUF files loaded as stored: tiny Llama and Qwen2 files with Q4_K_M-like mixes, their float32 reference equal to
transformers' own GGUF loading, bad files and too-large models refused with one line, estimates that match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from engine.errors import ModelFormatError, ModelTooLargeError
from engine.load import gguf_loader, memory, weight_plan
from engine.load.loader import estimate_for_spec, load_model
from engine.load.options import LoadOptions
from engine.model.quantized import HalfLinear, Int4Linear, Int8Linear, QuantizedEmbedding
from tests.gguf_files import write_tiny_model
from tests.helpers import make_tiny_tokenizer

Q = GGMLQuantizationType


def q4_k_m(name: str) -> GGMLQuantizationType:
    """llama.cpp's Q4_K_M mix, roughly: Q6_K for attn_v and ffn_down (every layer, in a file this small), Q4_K else
    (K-quants need rows of 256: these files are 256 wide)."""
    if ".attn_v." in name or ".ffn_down." in name or name == "output.weight":
        return Q.Q6_K
    return Q.Q8_0 if name == "token_embd.weight" else Q.Q4_K


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def llama_file(tokenizer_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("llama") / "tiny-q4_k_m.gguf", tokenizer_folder, q4_k_m,
                            hidden=256, intermediate=512)  # fmt: skip


@pytest.fixture
def as_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold even a tiny file as stored (a small one is dequantized to float32 under `auto`)."""
    monkeypatch.setattr(weight_plan, "SMALL_MODEL_FLOAT32_BYTES", 0)


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_the_float32_reference_is_transformers_own_gguf_loading(llama_file: Path) -> None:
    from transformers import AutoModelForCausalLM

    ours = load_model(str(llama_file), LoadOptions(dtype="float32"))
    folder, name = str(llama_file.parent), llama_file.name
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    expected = theirs.state_dict()
    got = ours.model.state_dict()
    assert set(expected) <= set(got)
    assert all(torch.equal(got[name], value) for name, value in expected.items())
    assert "dequantized in memory to float32" in ours.info.description


def test_a_q4_k_m_file_is_held_as_stored(llama_file: Path, as_stored) -> None:
    loaded = load_model(str(llama_file))
    model = loaded.model
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, Int4Linear) and isinstance(layer.mlp.up_proj, Int4Linear)
    assert isinstance(layer.self_attn.v_proj, Int8Linear) and isinstance(layer.mlp.down_proj, Int8Linear)
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert model.model.embed_tokens.rows_module is model.lm_head  # tied: one copy of the bytes
    assert all(p.dtype == torch.float32 for p in model.parameters())  # norms
    assert loaded.as_stored and loaded.info.quantization == "int4+int8" and loaded.info.dtype == "float32"
    formats = loaded.info.weight_formats
    assert "int4 (Q4_K as stored): 10 tensors" in formats and "int8 (Q6_K requantized per row" in formats
    reference = load_model(str(llama_file), LoadOptions(dtype="float32"))
    ids = loaded.tokenizer("hello world, the quick brown fox").input_ids
    expected, got = _logits(reference.model, ids), _logits(model, ids)
    # 0.4 % weight errors and bfloat16 activations, through a random model whose logits span +-26: a few % of that
    assert (got - expected).abs().max() < 0.15 * expected.abs().max()
    # the weights are the file's: each module reads back as the reference's weight, to its format's rounding
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):  # q and k: rows un-permuted like theirs
        weight = reference.model.model.layers[1].get_submodule(name).weight
        back = model.model.layers[1].get_submodule(name).dequantize()
        assert (back - weight).abs().max() < 0.02 * weight.abs().max()


def test_a_qwen2_file_with_biases_and_an_untied_head(tokenizer_folder: Path, tmp_path: Path, as_stored) -> None:
    path = write_tiny_model(tmp_path / "qwen.gguf", tokenizer_folder, q4_k_m, arch="qwen2", tied=False, hidden=256,
                            intermediate=512)  # fmt: skip
    loaded = load_model(str(path))
    model = loaded.model
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Int4Linear) and q_proj.bias is not None and q_proj.bias.dtype == torch.float32
    assert isinstance(model.lm_head, Int8Linear)  # output.weight Q6_K
    embedding = model.model.embed_tokens
    assert isinstance(embedding, QuantizedEmbedding) and embedding.rows_module is not model.lm_head
    reference = load_model(str(path), LoadOptions(dtype="float32")).model
    ids = torch.tensor([3, 17, 250])
    rows, expected = embedding(ids), reference.model.embed_tokens(ids)
    assert (rows - expected).abs().max() <= INT8_BOUND * reference.model.embed_tokens.weight.abs().max()
    torch.testing.assert_close(q_proj.bias, reference.model.layers[0].self_attn.q_proj.bias)
    assert "Qwen2ForCausalLM" in loaded.info.description


INT8_BOUND = weight_plan.INT8_ROW_ERROR


def test_16_bit_tensors_in_a_quantized_file_stay_16_bit(tokenizer_folder: Path, tmp_path: Path, as_stored) -> None:
    path = write_tiny_model(tmp_path / "mixed.gguf", tokenizer_folder, lambda n: Q.F16 if ".ffn_" in n else Q.Q4_0)
    model = load_model(str(path)).model
    assert isinstance(model.model.layers[0].mlp.up_proj, HalfLinear)
    assert isinstance(model.model.layers[0].self_attn.o_proj, Int4Linear)


def test_an_engine_runs_a_model_held_as_stored(llama_file: Path, as_stored) -> None:
    """The paged engine on a model of weight modules: the same greedy tokens as transformers' own generate."""
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.types import SamplingParams
    from tests.helpers import reference_greedy, run_to_completion

    loaded = load_model(str(llama_file))
    engine = Engine(loaded, EngineConfig(kv_pages=32, page_size=4))
    prompt = loaded.tokenizer("hello world, the quick brown fox jumps").input_ids
    request = engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    run_to_completion(engine)
    assert request.output_ids == reference_greedy(loaded.model, prompt, 8, eos=False)


def test_a_truncated_file_is_refused_in_one_line(tokenizer_folder: Path, tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "cut.gguf", tokenizer_folder, lambda n: Q.Q4_0, truncate_to=60_000)
    with pytest.raises(ModelFormatError, match=r"cut.gguf is truncated: its tensors need [\d,]+ bytes but the file"):
        load_model(str(path))


def test_a_type_the_studio_cannot_read_is_refused_naming_it(tokenizer_folder: Path, tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "odd.gguf", tokenizer_folder, lambda n: Q.Q8_1 if "ffn_up" in n else Q.Q4_0)
    with pytest.raises(ModelFormatError, match="stores weights as Q8_1, which the studio cannot read"):
        load_model(str(path), LoadOptions(quantization="int8"))


def test_a_model_too_large_for_free_memory_is_refused_before_loading(
    llama_file: Path, monkeypatch: pytest.MonkeyPatch, as_stored
) -> None:
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 200 * 1024**2)

    def not_called(*args, **kwargs):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(gguf_loader, "load_gguf", not_called)
    with pytest.raises(ModelTooLargeError) as caught:
        load_model(str(llama_file))
    message = str(caught.value)
    assert "\n" not in message
    assert "tiny-q4_k_m needs about" in message and "only 200.0 MiB of RAM is free" in message


def test_the_estimate_is_the_bytes_the_loader_allocates(llama_file: Path, as_stored) -> None:
    estimate = estimate_for_spec(str(llama_file))
    loaded = load_model(str(llama_file))
    tensors = [*loaded.model.named_parameters(), *loaded.model.named_buffers()]
    held = sum(t.numel() * t.element_size() for name, t in tensors if "rotary" not in name)
    assert estimate.weight_bytes == held
    assert estimate.weight_formats == loaded.info.weight_formats
    assert estimate.kv_bytes_per_token == loaded.info.kv_bytes_per_token


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _held(model) -> dict[str, torch.Tensor]:
    return {name: t for name, t in [*model.named_parameters(), *model.named_buffers()]}


@pytest.fixture
def ahead(monkeypatch: pytest.MonkeyPatch) -> list[gguf_loader.Prefetch]:
    """The conversions started ahead in this test, whatever this machine's free memory."""
    started: list[gguf_loader.Prefetch] = []
    real = gguf_loader.Prefetch.start.__func__

    def start(cls, header, options, free):
        prefetch = real(cls, header, options, 1 << 40)
        if prefetch is not None:
            started.append(prefetch)
        return prefetch

    monkeypatch.setattr(gguf_loader.Prefetch, "start", classmethod(start))
    return started


# qwen2: q, k and v biases, before their weights (as converters that write in name order put them) or after
@pytest.mark.parametrize(("arch", "biases_first"), [("llama", False), ("qwen2", True), ("qwen2", False)])
def test_converting_ahead_gives_the_model_the_builder_alone_gives(
    tokenizer_folder: Path, tmp_path: Path, as_stored, ahead, monkeypatch: pytest.MonkeyPatch, arch, biases_first
) -> None:
    path = write_tiny_model(tmp_path / f"{arch}.gguf", tokenizer_folder, q4_k_m, arch=arch, hidden=256,
                            intermediate=512, biases_first=biases_first)  # fmt: skip
    taken: list[int] = []
    real_finish = gguf_loader.Prefetch.finish

    def finish(self):
        self._thread.join(timeout=30)  # all of it converted ahead, so that the builder takes some
        done = real_finish(self)
        taken.append(len(done))
        return done

    monkeypatch.setattr(gguf_loader.Prefetch, "finish", finish)
    model = load_model(str(path)).model
    with_ahead = _held(model)
    assert len(ahead) == 1 and taken[0] > 0
    monkeypatch.setattr(gguf_loader.Prefetch, "start", classmethod(lambda cls, header, options, free: None))
    alone_model = load_model(str(path)).model
    alone = _held(alone_model)
    for built in (model, alone_model):  # gate and up written into one buffer, ahead (its thread) or by the builder
        for layer in built.model.layers:
            assert _storage(layer.mlp.gate_proj.packed) == _storage(layer.mlp.up_proj.packed)
    assert set(with_ahead) == set(alone)
    assert all(torch.equal(with_ahead[name], alone[name]) for name in alone)


def test_a_fault_while_converting_ahead_costs_only_the_time(llama_file: Path, as_stored, ahead, monkeypatch) -> None:
    import threading

    real = gguf_loader.weight_module

    def failing(*args, **kwargs):
        if threading.current_thread().name == "gguf-prefetch":
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_loader, "weight_module", failing)
    loaded = load_model(str(llama_file))
    assert len(ahead) == 1 and not ahead[0].done
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, Int4Linear)


def test_a_model_refused_by_the_memory_check_lets_go_of_what_was_converted_ahead(
    llama_file: Path, as_stored, ahead, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from engine.load import loader

    def refuse(*args, **kwargs):
        ahead[0]._thread.join(timeout=30)  # converted all it could before the check said no
        raise ModelTooLargeError("tiny-q4_k_m needs more than is free")

    monkeypatch.setattr(loader, "check_fits", refuse)
    threads = torch.get_num_threads()
    with pytest.raises(ModelTooLargeError):
        load_model(str(llama_file))
    assert len(ahead) == 1 and not ahead[0]._thread.is_alive() and not ahead[0].done
    seen: list[int] = []
    later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    later.start()
    later.join(timeout=10)
    assert torch.get_num_threads() == threads and seen == [threads]  # one thread for the conversions: not for others
