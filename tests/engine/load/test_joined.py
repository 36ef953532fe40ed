"""A layer's q/k/v and gate/up written by the loader into one buffer per run of one format: the same bytes each matrix
gets alone, a wrong buffer refused, and the lean forward's fused projection taking the buffer without a copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from engine.load import native, weight_plan
from engine.load.loader import load_model
from engine.model import int4pack, stored
from engine.model.quantized import Int4Linear, Int8Linear
from tests.gguf_files import blocks, write_tiny_model
from tests.helpers import make_tiny_tokenizer

Q = GGMLQuantizationType
COLUMNS = 512


@pytest.fixture(autouse=True)
def decoders() -> None:
    if not native.available():
        pytest.skip(f"the C++ decoders are unavailable here: {native.unavailable_reason()}")


@pytest.fixture
def as_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_plan, "SMALL_MODEL_FLOAT32_BYTES", 0)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tiny_tokenizer(folder)
    return folder


def _raw(kind: GGMLQuantizationType, rows: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(blocks(kind, rows, COLUMNS, np.random.default_rng(seed)).view(np.uint8).reshape(rows, -1))


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_int4_packings_written_into_a_joint_buffer_are_the_bytes_each_gets_alone(kind) -> None:
    layout = int4pack.layout()
    if layout is None:
        pytest.skip("this torch's int4 packing is not known here")
    parts = [_raw(kind, 64, 1), _raw(kind, 48, 2), _raw(kind, 32, 3)]  # 48: a full packing block and a short one
    total = sum(part.shape[0] for part in parts)
    packed = torch.full((total, COLUMNS // 2), 0xAB, dtype=torch.uint8)
    sz = torch.full((COLUMNS // 32, total, 2), 7.0, dtype=torch.bfloat16)
    start = 0
    for part in parts:
        rows = slice(start, start + part.shape[0])
        native.int4_pack_into(part, kind, layout.block, layout.split, packed[rows], sz[:, rows])
        alone_packed, alone_sz = native.int4_pack(part, kind, layout.block, layout.split)
        assert torch.equal(packed[rows], alone_packed) and torch.equal(sz[:, rows], alone_sz)
        start += part.shape[0]


@pytest.mark.parametrize("kind", [Q.Q8_0, Q.Q6_K, Q.Q4_K])
def test_int8_rows_written_into_a_joint_buffer_are_the_rows_each_gets_alone(kind) -> None:
    parts = [_raw(kind, 40, 4), _raw(kind, 24, 5)]
    q = torch.zeros(64, COLUMNS, dtype=torch.int8)
    scales = torch.zeros(64, dtype=torch.bfloat16)
    native.int8_rows_into(parts[0], kind, q[:40], scales[:40])
    native.int8_rows_into(parts[1], kind, q[40:], scales[40:])
    for part, rows in zip(parts, (slice(0, 40), slice(40, 64)), strict=True):
        alone_q, alone_scales = native.int8_rows(part, kind)
        assert torch.equal(q[rows], alone_q) and torch.equal(scales[rows], alone_scales)


def test_a_joint_buffer_of_the_wrong_shape_or_layout_is_refused() -> None:
    layout = int4pack.layout()
    raw = _raw(Q.Q4_0, 32, 6)
    if layout is not None:
        too_few = torch.empty(16, COLUMNS // 2, dtype=torch.uint8)
        with pytest.raises(ValueError, match="packing goes into"):
            native.int4_pack_into(raw, Q.Q4_0, layout.block, layout.split, too_few,
                                  torch.empty(COLUMNS // 32, 32, 2, dtype=torch.bfloat16))  # fmt: skip
        with pytest.raises(ValueError, match="scales and zeros go into"):  # rows of a buffer laid out [rows, groups]
            sz = torch.empty(32, COLUMNS // 32, 2, dtype=torch.bfloat16).transpose(0, 1)
            native.int4_pack_into(raw, Q.Q4_0, layout.block, layout.split,
                                  torch.empty(32, COLUMNS // 2, dtype=torch.uint8), sz)  # fmt: skip
    with pytest.raises(ValueError, match="int8 codes go into"):
        native.int8_rows_into(raw, Q.Q4_0, torch.empty(32, COLUMNS, dtype=torch.int8)[:, ::2],
                              torch.empty(32, dtype=torch.bfloat16))  # fmt: skip


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _projection_takes_the_buffer(modules: list, attr: str) -> None:
    """The fused projection holds the parts' own buffer (no copy) and computes what the parts compute."""
    fused = stored.projection(modules, torch.float32, pack=False)
    assert getattr(fused, attr).data_ptr() == getattr(modules[0], attr).data_ptr()
    x = torch.randn(3, modules[0].in_features, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(fused(x), torch.cat([module(x) for module in modules], dim=-1))


def test_a_q8_0_file_holds_each_layers_q_k_and_v_in_one_buffer(tokenizer_folder: Path, tmp_path: Path, as_stored):
    path = write_tiny_model(tmp_path / "q8.gguf", tokenizer_folder, lambda name: Q.Q8_0, arch="qwen2", hidden=256,
                            intermediate=512)  # fmt: skip
    model = load_model(str(path)).model
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert all(isinstance(m, Int8Linear) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        assert _storage(attn.q_proj.q) == _storage(attn.k_proj.q) == _storage(attn.v_proj.q)
        assert _storage(mlp.gate_proj.q) == _storage(mlp.up_proj.q) != _storage(mlp.down_proj.q)
    layer = model.model.layers[1]
    _projection_takes_the_buffer([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], "q")


def test_a_q4_k_m_layer_joins_its_int4_neighbours_and_keeps_v_apart(tokenizer_folder: Path, tmp_path: Path, as_stored):
    def kind_of(name: str) -> GGMLQuantizationType:
        return Q.Q6_K if ".attn_v." in name or ".ffn_down." in name else Q.Q4_K

    path = write_tiny_model(tmp_path / "q4.gguf", tokenizer_folder, kind_of, hidden=256, intermediate=512)
    model = load_model(str(path)).model
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn.q_proj, Int4Linear) and isinstance(attn.v_proj, Int8Linear)
        assert _storage(attn.q_proj.packed) == _storage(attn.k_proj.packed)
        assert _storage(mlp.gate_proj.packed) == _storage(mlp.up_proj.packed)
    if int4pack.layout() is not None:
        _projection_takes_the_buffer([model.model.layers[0].mlp.gate_proj, model.model.layers[0].mlp.up_proj], "packed")


def test_a_part_of_a_joint_buffer_computed_on_its_own_gets_contiguous_scales(
    tokenizer_folder: Path, tmp_path: Path, as_stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the packings do not concatenate (or the neighbours differ), each part runs alone: the kernels take its
    scales contiguous, not as its strided rows of the joint scales."""
    if int4pack.layout() is None:
        pytest.skip("this torch's int4 packing is not known here")
    path = write_tiny_model(tmp_path / "q4.gguf", tokenizer_folder, lambda name: Q.Q4_K, hidden=256, intermediate=512)
    mlp = load_model(str(path)).model.model.layers[0].mlp
    assert not mlp.gate_proj.scales_and_zeros.is_contiguous()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
    monkeypatch.setattr(stored, "fuse_int4", lambda group: None)  # as where packings do not concatenate
    split = stored.projection([mlp.gate_proj, mlp.up_proj], torch.float32, pack=False)
    assert isinstance(split, stored.SplitLinear)
    assert all(part.scales_and_zeros.is_contiguous() for part in split.parts)
    with torch.inference_mode():
        assert torch.equal(split(x), expected)
