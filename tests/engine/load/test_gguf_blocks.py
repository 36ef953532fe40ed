"""Every GGUF block type the loader reads, mapped onto the engine's formats and back: the 4-bit types' own codes
within a small fraction of their step (only the scales' bfloat16 rounding), int8-requantized types within the stated
per-row error, 16-bit and 32-bit types as stored. The reference is the gguf package's own dequantization."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from engine.load import gguf_blocks
from engine.load.gguf_loader import weight_module
from engine.load.options import LoadOptions, resolve_options
from engine.load.weight_plan import INT8_ROW_ERROR, LoadPlan, Mode, Role, plan_load
from engine.model.quantized import HalfLinear, Int4Linear, Int8Linear
from tests.gguf_files import blocks, dequantized

Q = GGMLQuantizationType
ROWS, COLUMNS = 48, 512  # 48 rows: torch's int4 packing in a full block and a short one
AS_STORED = LoadPlan(Mode.AS_STORED, torch.float32)
CPU = resolve_options(LoadOptions(device="cpu"))
ALL_DECODED = [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.BF16, Q.F16, Q.F32]


@pytest.fixture(autouse=True, params=["native", "torch"])
def decoders(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every mapping through the C++ decoders (where they build) and through torch's (a packaged studio's)."""
    from engine.load import gguf_loader, native

    if request.param == "torch":
        monkeypatch.setattr(gguf_loader, "_native", lambda kind: False)
    elif not native.available():
        pytest.skip(f"the C++ decoders are unavailable here: {native.unavailable_reason()}")
    return request.param


def _module(kind: GGMLQuantizationType, quantization: str = "none"):
    raw = blocks(kind, ROWS, COLUMNS, np.random.default_rng(int(kind)))
    plan = AS_STORED.tensor(kind, (ROWS, COLUMNS), Role.LINEAR, quantization)
    module = weight_module(torch.from_numpy(raw.view(np.uint8).reshape(ROWS, -1)), kind, plan, Mode.AS_STORED)
    return module, torch.from_numpy(dequantized(raw, kind)).reshape(ROWS, COLUMNS), plan


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.BF16, Q.F16])
def test_our_decoders_give_the_gguf_packages_values(kind: GGMLQuantizationType) -> None:
    raw = blocks(kind, ROWS, COLUMNS, np.random.default_rng(1))
    ours = gguf_blocks.dequantize(torch.from_numpy(raw.view(np.uint8).reshape(ROWS, -1)), kind)
    assert torch.equal(ours, torch.from_numpy(dequantized(raw, kind)).reshape(ROWS, COLUMNS))


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_4_bit_types_keep_their_codes_within_a_sixteenth_of_a_step(kind: GGMLQuantizationType) -> None:
    module, reference, plan = _module(kind)
    assert isinstance(module, Int4Linear) and plan.how == f"{kind.name} as stored"
    codes, scale, _zero = gguf_blocks.int4_groups(
        torch.from_numpy(blocks(kind, ROWS, COLUMNS, np.random.default_rng(int(kind))).reshape(ROWS, -1)), kind
    )
    step = scale.abs().repeat_interleave(32, dim=1)  # Q4_0's scale is signed
    error = (module.dequantize() - reference).abs()
    # the codes are the file's; what moves a weight is its group's scale and zero rounded to bfloat16 (2^-8 of
    # each): up to 8 steps' worth of scale and a zero near 0 in zero-centred blocks, so about 1/32 of a step
    assert (error <= step / 16).all(), float((error / step).max())
    assert torch.equal(module.codes(torch.arange(ROWS)), codes)


@pytest.mark.parametrize("kind", [Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0])
def test_5_to_8_bit_types_are_requantized_per_row_within_the_stated_error(kind: GGMLQuantizationType) -> None:
    module, reference, plan = _module(kind)
    assert isinstance(module, Int8Linear) and plan.how == f"{kind.name} requantized per row"
    row_max = reference.abs().amax(dim=1, keepdim=True)
    assert ((module.dequantize() - reference).abs() <= INT8_ROW_ERROR * row_max + 1e-9).all()


@pytest.mark.parametrize("kind", [Q.Q2_K, Q.Q3_K, Q.IQ4_NL])
def test_other_low_bit_types_are_requantized_to_int4_groups(kind: GGMLQuantizationType) -> None:
    module, reference, plan = _module(kind)
    assert isinstance(module, Int4Linear) and "requantized per group of 32" in plan.how
    groups = reference.view(ROWS, -1, 32)
    half_step = (groups.amax(-1) - groups.amin(-1)) / 15 / 2 * (1 + 2**-6) + 1e-6
    error = (module.dequantize() - reference).abs().view(ROWS, -1, 32)
    assert (error <= half_step[..., None] * 1.2).all()


def test_16_and_32_bit_types_stay_16_and_32_bit() -> None:
    bf16, reference, _ = _module(Q.BF16)
    assert isinstance(bf16, HalfLinear) and torch.equal(bf16.dequantize(), reference)
    f16, reference, plan = _module(Q.F16)  # a CPU has no fast float16: bfloat16, 2^-8 of each weight at most
    assert isinstance(f16, HalfLinear) and plan.how == "F16 converted"
    assert ((f16.dequantize() - reference).abs() <= reference.abs() * 2**-8).all()
    f32, reference, _ = _module(Q.F32)
    assert isinstance(f32, torch.nn.Linear) and torch.equal(f32.weight, reference)


def test_int8_and_int4_options_requantize_what_is_not_already_so() -> None:
    assert isinstance(_module(Q.Q4_K, "int8")[0], Int8Linear)
    module, _reference, plan = _module(Q.Q8_0, "int4")
    assert isinstance(module, Int4Linear) and plan.how == "Q8_0 requantized per group of 32"


@pytest.mark.parametrize("kind", ALL_DECODED)
def test_the_cpp_decoders_give_the_torch_decoders_values_bit_for_bit(kind: GGMLQuantizationType, decoders) -> None:
    from engine.load import native
    from engine.model import int4pack
    from engine.model.quantized import int8_rows_from_float

    if decoders == "torch":
        pytest.skip("compares the two")
    raw = torch.from_numpy(blocks(kind, 176, COLUMNS, np.random.default_rng(7)).view(np.uint8).reshape(176, -1))
    floats = gguf_blocks.dequantize(raw, kind)
    assert torch.equal(native.dequantize(raw, kind), floats)
    q, scale = native.int8_rows(raw, kind)
    expected_q, expected_scale = int8_rows_from_float(floats)
    assert torch.equal(q, expected_q) and torch.equal(scale, expected_scale.bfloat16())
    layout = int4pack.layout()
    if kind in gguf_blocks.INT4_TYPES and layout is not None:
        packed, scales_and_zeros = native.int4_pack(raw, kind, layout.block, layout.split)
        reference = Int4Linear.from_groups(*gguf_blocks.int4_groups(raw, kind))
        assert torch.equal(packed, reference.packed) and torch.equal(scales_and_zeros, reference.scales_and_zeros)


def test_a_type_nothing_can_read_is_refused_naming_it() -> None:
    from engine.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="stores weights as Q8_1, which the studio cannot read"):
        AS_STORED.tensor(Q.Q8_1, (ROWS, COLUMNS), Role.LINEAR, "none")


def test_the_plan_holds_a_quantized_file_as_stored_and_a_small_one_in_float32() -> None:
    big = 8 * 1024**3
    assert plan_load(CPU, {Q.Q4_K, Q.Q6_K}, big).mode is Mode.AS_STORED
    small = plan_load(CPU, {Q.Q4_1, Q.Q8_0}, 600 * 1024**2)
    assert small.mode is Mode.DENSE and small.dtype == torch.float32 and small.small
    assert plan_load(CPU, {Q.F16}, big).dtype == torch.bfloat16  # a 16-bit file: the plain 16-bit model
    reference = resolve_options(LoadOptions(dtype="float32", device="cpu"))
    assert plan_load(reference, {Q.Q4_K}, big) == LoadPlan(Mode.DENSE, torch.float32)
    int4 = resolve_options(LoadOptions(quantization="int4", device="cpu"))
    assert plan_load(int4, {Q.Q4_1}, 600 * 1024**2).mode is Mode.AS_STORED  # asked for: even a small model


def test_per_layer_dequantization_into_a_16_bit_device_format() -> None:
    """A GPU gets each weight dequantized into its 16-bit format at load (tested on the CPU device here)."""
    raw = blocks(Q.Q4_K, ROWS, COLUMNS, np.random.default_rng(3))
    plan = LoadPlan(Mode.DENSE, torch.float16).tensor(Q.Q4_K, (ROWS, COLUMNS), Role.LINEAR, "none")
    module = weight_module(torch.from_numpy(raw), Q.Q4_K, plan, Mode.DENSE, device="cpu")
    assert type(module) is torch.nn.Linear and module.weight.dtype == torch.float16
    reference = torch.from_numpy(dequantized(raw, Q.Q4_K))
    assert torch.equal(module.weight, reference.to(torch.float16))
