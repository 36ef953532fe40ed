"""The model loader: every source, every dtype/quantization this machine supports, bad input, estimates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engine.credentials import HUB_TOKEN, set_secret
from engine.errors import HubError, ModelFormatError, ModelNotFoundError, UnsupportedOptionError
from engine.load.loader import estimate_for_spec, load_model
from engine.load.model_source import SourceKind, embedded_gguf_path, resolve_model_spec
from engine.load.options import LoadOptions


def test_hf_folder_loads_with_description(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir))
    assert loaded.info.source_kind == SourceKind.HF_FOLDER
    assert loaded.info.dtype == "float32" and loaded.info.device == "cpu"
    assert loaded.info.architecture == "LlamaForCausalLM"
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert "float32 on cpu" in loaded.info.description


def test_bfloat16_is_applied(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), LoadOptions(dtype="bfloat16"))
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.info.dtype == "bfloat16"


def test_a_bfloat16_folder_loads_in_bfloat16_under_auto(tmp_path: Path) -> None:
    """No float32 copy: the folder's own dtype (and its KV cache in it), or int4 linears when asked."""
    from engine.bench.synthetic import SHAPES, write_folder
    from engine.model.quantized import Int4Linear

    write_folder(SHAPES["qwen2-tiny"], tmp_path / "bf16")
    loaded = load_model(str(tmp_path / "bf16"), LoadOptions(device="cpu"))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.info.dtype == "bfloat16" and loaded.kv_dtype == torch.bfloat16
    quantized = load_model(str(tmp_path / "bf16"), LoadOptions(quantization="int4", device="cpu"))
    assert isinstance(quantized.model.model.layers[1].mlp.up_proj, Int4Linear)
    assert "int4 (quantized per group of 32 inputs from bfloat16 at load" in quantized.info.description
    estimate = estimate_for_spec(str(tmp_path / "bf16"), LoadOptions(device="cpu"))
    assert estimate.dtype == "bfloat16" and estimate.weight_bytes == loaded.info.weight_bytes


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
def test_bitsandbytes_quantization_on_cpu(tiny_model_dir: Path, quant: str) -> None:
    """nf4 and fp4 are bitsandbytes' (int8 and int4 on a CPU are the engine's own kernels: test_decode_probe)."""
    import bitsandbytes as bnb

    loaded = load_model(str(tiny_model_dir), LoadOptions(quantization=quant))
    proj = loaded.model.model.layers[0].mlp.gate_proj
    assert isinstance(proj, bnb.nn.Linear4bit)
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([[1, 5, 9, 11]])).logits
    assert torch.isfinite(logits).all()
    assert loaded.info.quantization == quant


def test_float16_on_cpu_is_refused_up_front(tiny_model_dir: Path) -> None:
    with pytest.raises(UnsupportedOptionError, match="float16 on the CPU"):
        load_model(str(tiny_model_dir), LoadOptions(dtype="float16", device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(UnsupportedOptionError, match="no usable CUDA"):
        load_model(str(tiny_model_dir), LoadOptions(device="cuda"))


def test_unknown_quantization_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(UnsupportedOptionError, match="unknown quantization 'q3'"):
        load_model(str(tiny_model_dir), LoadOptions(quantization="q3"))


def test_nonexistent_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no model at"):
        resolve_model_spec(str(tmp_path / "nothing-here"))


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ModelFormatError, match="no config.json"):
        load_model(str(tmp_path))


def test_broken_config_json(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        load_model(str(folder))


def test_config_without_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = tmp_path / "noweights"
    shutil.copytree(tiny_model_dir, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ModelFormatError, match="no weights"):
        load_model(str(folder))


def test_corrupt_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ModelFormatError, match="cannot load"):
        load_model(str(folder))


def test_non_gguf_file_named_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("hello, I am not a GGUF file")
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        load_model(str(fake))


def test_truncated_gguf(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with embedded_gguf_path().open("rb") as handle:
        truncated.write_bytes(handle.read(5_000_000))
    with pytest.raises(ModelFormatError, match="truncated"):
        load_model(str(truncated))


def test_other_file_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 16)
    with pytest.raises(ModelFormatError, match="not a .gguf model"):
        resolve_model_spec(str(other))


def _fake_hub_snapshot(cache: Path, repo_id: str, source: Path) -> None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(source, repo / "snapshots" / commit)


def test_hub_repo_from_the_local_hub_cache(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub_snapshot(tmp_path / "hub", "studio-tests/tiny-llama", tiny_model_dir)
    loaded = load_model("studio-tests/tiny-llama")
    assert loaded.info.source_kind == SourceKind.HUB_REPO
    assert loaded.info.name == "studio-tests/tiny-llama"


def test_hub_download_uses_the_keyring_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub
    from huggingface_hub import errors as hub_errors

    calls: list[dict] = []

    def fake_snapshot_download(repo_id: str, **kwargs):
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise hub_errors.LocalEntryNotFoundError("not cached")
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    set_secret(HUB_TOKEN, "hf_secret_for_test")
    from engine.load.hub import download_repo

    assert download_repo("org/private-model") == tmp_path
    assert calls[-1]["token"] == "hf_secret_for_test"
    assert "*.safetensors" in calls[-1]["allow_patterns"]
    download_repo("org/private-model", config_only=True)  # the picker's estimate: no weights
    assert calls[-1]["allow_patterns"] == ["config.json"]


def test_unknown_hub_repo_offline_fails_fast_and_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite runs offline (HF_HUB_OFFLINE=1, tests/conftest.py): the refusal comes without a network request."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the offline suite made a network request")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(HubError, match="not in the local cache"):
        load_model("studio-tests/definitely-not-a-real-repo-7f3a")


def test_memory_estimate_matches_the_loaded_model(tiny_model_dir: Path) -> None:
    estimate = estimate_for_spec(str(tiny_model_dir))
    loaded = load_model(str(tiny_model_dir))
    actual = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert estimate.weight_bytes == actual
    config = loaded.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert estimate.kv_bytes_per_token == config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4
    assert estimate.kv_tokens_for(estimate.kv_bytes_per_token * 100) == 100


def test_quantized_estimates_are_smaller(tiny_model_dir: Path) -> None:
    full = estimate_for_spec(str(tiny_model_dir)).weight_bytes
    bf16 = estimate_for_spec(str(tiny_model_dir), LoadOptions(dtype="bfloat16")).weight_bytes
    nf4 = estimate_for_spec(str(tiny_model_dir), LoadOptions(quantization="nf4")).weight_bytes
    assert nf4 < full and bf16 == full // 2
    # int4 on a CPU: the loader quantizes each linear in turn; no float copy stays, the engine adds none
    int4 = estimate_for_spec(str(tiny_model_dir), LoadOptions(quantization="int4", device="cpu"))
    int8 = estimate_for_spec(str(tiny_model_dir), LoadOptions(quantization="int8", device="cpu"))
    plain = estimate_for_spec(str(tiny_model_dir), LoadOptions(device="cpu"))
    assert int4.weight_bytes < int8.weight_bytes < full // 3 and int4.engine_copy_bytes == 0
    assert plain.engine_copy_bytes > 0  # float32 under auto: prepacked and bfloat16 copies where faster
    for estimate, quantization in ((int4, "int4"), (int8, "int8")):  # the bytes the loader then holds
        model = load_model(str(tiny_model_dir), LoadOptions(quantization=quantization)).model
        held = sum(t.numel() * t.element_size() for n, t in [*model.named_parameters(), *model.named_buffers()]
                   if "rotary" not in n)  # fmt: skip
        assert estimate.weight_bytes == held, quantization


@pytest.mark.slow
def test_embedded_default_model(embedded_model) -> None:
    info = embedded_model.info
    assert info.source_kind == SourceKind.EMBEDDED
    assert info.name == "SmolLM2-135M-Instruct"
    assert "GGUF Q4_1 dequantized in memory to float32" in info.description
    assert info.folder == str(embedded_gguf_path())  # read from the file itself: no converted folder
    assert 130e6 < info.parameters < 140e6  # tied embeddings counted once


@pytest.mark.slow
def test_loading_a_gguf_file_writes_nothing_to_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old path wrote a float32 copy (4x a Q4 file, 11 GiB for a 3B model) under the cache; none is made now."""
    monkeypatch.setenv("INFERENCE_STUDIO_CACHE", str(tmp_path / "cache"))
    loaded = load_model(None, LoadOptions(quantization="int4"))
    assert loaded.info.quantization == "int4"
    written = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in written) < 1_000_000, written  # remembered measurements at most
