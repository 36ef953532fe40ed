"""int4/int8 weights multiplied for several rows at once as bfloat16 tiles (the compiled library's int4_tiles_mm and
int8_tiles_mm): the products of the weights the kernels multiply, in both of brgemm's layouts this CPU takes, whole
and short packing blocks; and from how many rows a load uses them (measured, forced, or never for tiny weights)."""

from __future__ import annotations

import pytest
import torch

from engine.model import compiled_step, int4pack, tiles
from engine.model import formats as formats_
from engine.model.quantized import Int4Linear, Int8Linear
from tests.helpers import require_compiled_step


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    require_compiled_step()


def _layout(vnni: bool) -> bool:
    """brgemm's B as pairs of columns (AMX CPUs) or as rows (any CPU): both wherever this one takes both."""
    if vnni and not torch.ops.studio.tiles_vnni():
        pytest.skip("this CPU's brgemm takes no pairs of columns")
    return vnni


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def _int4_case(rows: int, seed: int) -> tuple[int4pack.Layout, Int4Linear, torch.Tensor, torch.Tensor]:
    """(layout, a 208x640 int4 weight, `rows` bfloat16 rows, its contiguous scales): three whole packing blocks of 64
    rows and a short one of 16; skipped where this torch's packing layout is unknown."""
    layout = int4pack.layout()
    if layout is None:
        pytest.skip("this torch's int4 packing layout is unknown here")
    generator = torch.Generator().manual_seed(seed)
    linear = Int4Linear(torch.randn(208, 640, generator=generator) * 0.05, None)
    x = torch.randn(rows, 640, generator=generator).to(torch.bfloat16)
    return layout, linear, x, linear.scales_and_zeros.contiguous()


@pytest.mark.parametrize("vnni", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_int4_tiles_multiply_the_kernels_weights_rounded_to_bfloat16(vnni, rows) -> None:
    """208 weight rows: three whole packing blocks of 64 and a short one of 16 (torch packs those as row pairs);
    K = 640: a tile of 512 columns and a shorter one."""
    vnni = _layout(vnni)
    layout, linear, x, scales = _int4_case(rows, seed=3)
    got = torch.ops.studio.int4_tiles_mm(x, linear.packed, scales, layout.block, layout.split, vnni)
    weights = linear.dequantize().to(torch.bfloat16).double()  # the tiles' weights: the kernel's, in bfloat16
    assert got.shape == (rows, linear.packed.shape[0]) and got.dtype == torch.float32
    assert _close(got[:, :208], x.double() @ weights.t()) < 1e-5  # float32 sums in another order
    kernel = torch._weight_int4pack_mm_for_cpu(x, linear.packed, 32, scales).double()
    assert _close(got, kernel) < 1e-2  # as close to the kernel as its own bfloat16 output is


@pytest.mark.parametrize("vnni", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 16])
def test_int8_tiles_multiply_the_codes_exactly_and_scale_the_product(vnni, rows) -> None:
    vnni = _layout(vnni)
    generator = torch.Generator().manual_seed(4)
    linear = Int8Linear(torch.randn(150, 1100, generator=generator) * 0.05, None)  # a short 64-row tile, 3 K tiles
    x = torch.randn(rows, 1100, generator=generator).to(torch.bfloat16)
    got = torch.ops.studio.int8_tiles_mm(x, linear.q, linear.scale, vnni)
    assert got.shape == (rows, 150) and got.dtype == torch.float32
    assert _close(got, x.double() @ linear.dequantize().double().t()) < 1e-5


def test_tiles_refuse_a_wrong_weight_with_one_line() -> None:
    x = torch.randn(2, 64).to(torch.bfloat16)
    with pytest.raises((ValueError, RuntimeError), match="int8 weight"):
        torch.ops.studio.int8_tiles_mm(x, torch.zeros(4, 32, dtype=torch.int8), torch.ones(4), False)
    with pytest.raises((ValueError, RuntimeError), match="packing blocks"):
        packed, scales = torch.zeros(16, 32, dtype=torch.uint8), torch.zeros(2, 16, 2)
        torch.ops.studio.int4_tiles_mm(x, packed, scales, 48, True, False)


def test_a_quantized_module_takes_the_tiles_from_its_measured_row_count() -> None:
    """The LM head is no compiled-step layer: a stored int8/int4 head takes the tiles from the rows its format was
    measured for, and gives what the kernel gives."""
    generator = torch.Generator().manual_seed(5)
    head = Int8Linear(torch.randn(300, 256, generator=generator) * 0.05, None)
    x = torch.randn(6, 256, generator=generator)
    kernel = head(x)
    head.tiles_from = 4
    assert _close(head(x), kernel.double()) < 1e-2
    assert torch.equal(head(x[:2]), kernel[:2])  # fewer rows: the kernel


def test_tiny_weights_and_the_users_override_choose_without_measuring(monkeypatch) -> None:
    def no_measuring(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(formats_, "measure", no_measuring)
    small = Int8Linear(torch.randn(64, 64), None)
    monkeypatch.delenv(tiles.ENV, raising=False)
    assert tiles.tiles_from("int8", small.q, small.scale) == 0
    monkeypatch.setenv(tiles.ENV, "always")
    assert tiles.tiles_from("int8", small.q, small.scale) == tiles.BUCKETS[0]
    monkeypatch.setenv(tiles.ENV, "never")
    assert tiles.tiles_from("int8", small.q, small.scale) == 0


@pytest.mark.parametrize(
    ("chosen", "start"),
    [
        ({2: "kernel", 4: "kernel", 8: "tiles", 16: "tiles"}, 5),
        ({2: "kernel", 4: "kernel", 8: "kernel", 16: "tiles"}, 9),
        ({2: "tiles", 4: "tiles", 8: "tiles", 16: "tiles"}, 2),  # one row was not measured: the kernel's
        ({2: "kernel", 4: "tiles", 8: "kernel", 16: "tiles"}, 9),  # a noisy win below a loss does not count
        ({2: "kernel", 4: "kernel", 8: "tiles", 16: "kernel"}, 0),
    ],
)
def test_the_measured_start_is_the_first_row_of_the_run_of_wins_up_to_the_largest_bucket(
    monkeypatch, chosen, start
) -> None:
    measured = []

    def measure(passes, buckets, key, budget_s):
        measured.append((sorted(passes), tuple(buckets), budget_s))
        for run in passes.values():  # both routes run on the weight itself
            run(buckets[0])
        return formats_.FormatChoice(chosen)

    monkeypatch.setattr(formats_, "measure", measure)
    monkeypatch.delenv(tiles.ENV, raising=False)
    monkeypatch.setattr(tiles, "MIN_WEIGHTS", 0)
    weight = Int8Linear(torch.randn(64, 128), None)
    assert tiles.tiles_from("int8", weight.q, weight.scale) == start
    assert measured == [(["kernel", "tiles"], tiles.BUCKETS, tiles.MEASURE_BUDGET_S)]


def test_the_status_bar_hears_of_a_measurement_only_when_one_runs(monkeypatch) -> None:
    monkeypatch.delenv(tiles.ENV, raising=False)
    monkeypatch.setattr(tiles, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(tiles, "MEASURE_BUDGET_S", 0.05)
    weight = Int8Linear(torch.randn(80, 96), None)  # a shape no other test measures: nothing remembered yet
    told: list[str] = []
    first = tiles.tiles_from("int8", weight.q, weight.scale, told.append)
    assert len(told) == 1 and told[0].startswith("measuring int8 products")
    assert tiles.tiles_from("int8", weight.q, weight.scale, told.append) == first  # remembered: nothing to say
    assert len(told) == 1


def _int8_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [M, K] quantized to int8 per group of 32 against their largest magnitude: (codes [M, K / 32, 32] as
    floats, steps [M, K / 32])."""
    rows, k = x.shape
    groups = x.float().view(rows, k // 32, 32)
    amax = groups.abs().amax(-1)
    # a true division (torch's 127 / tensor multiplies by the reciprocal, rounding twice)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    scaled = groups * inverse[..., None]
    return (scaled.sign() * (scaled.abs() + 0.5).floor()).clamp(-127, 127), amax / 127  # halves away from zero


def _fused(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c rounded once, in float32 (the float32 products are exact in float64)."""
    return (a.double() * b.double() + c.double()).float()


def _int4_with_int8_activations(x: torch.Tensor, linear: Int4Linear) -> torch.Tensor:
    """int4_vnni_mm's arithmetic in torch, step by step in float32: each row's groups of 32 quantized to int8 against
    their largest magnitude, integer dot products with the codes, then per group the scale's and the zero's terms
    added with fused multiply-adds."""
    rows, k = x.shape
    q, step = _int8_groups(x)
    total = step * q.sum(-1)  # [rows, groups]
    codes = linear.codes(torch.arange(linear.out_features)).double().view(linear.out_features, k // 32, 32)
    dots = torch.einsum("mgk,ngk->mng", q.double(), codes).float()  # exact integers
    parts = linear.scales_and_zeros[:, : linear.out_features].float()  # [groups, N, 2]
    scale, zero = parts[..., 0].t(), parts[..., 1].t()  # [N, groups]
    offset = zero - 8 * scale

    out = torch.zeros(rows, linear.out_features)
    for g in range(k // 32):
        out = _fused(dots[:, :, g], scale[:, g][None, :] * step[:, g][:, None], out)
        out = _fused(offset[:, g][None, :], total[:, g][:, None], out)
    return out


def _int8_with_int8_activations(x: torch.Tensor, linear: Int8Linear) -> torch.Tensor:
    """int8_vnni_mm's and int8_amx_mm's arithmetic in torch: the activations quantized as above, integer dot products
    with the codes per group, each group's sums times its steps added with fused multiply-adds in group order, then the
    row scale."""
    rows, k = x.shape
    q, step = _int8_groups(x)
    codes = linear.q.double().view(linear.out_features, k // 32, 32)
    dots = torch.einsum("mgk,ngk->mng", q.double(), codes).float()  # exact integers
    out = torch.zeros(rows, linear.out_features)
    for g in range(k // 32):
        out = _fused(dots[:, :, g], step[:, g][:, None].expand_as(out), out)
    return out * linear.scale.float()[None, :]


@pytest.mark.parametrize("product", ["int8_vnni_mm", "int8_amx_mm"])
@pytest.mark.parametrize("rows", [1, 5, 16, 19])
def test_int8_weights_times_int8_activations_are_computed_as_specified(rows, product) -> None:
    """int8_vnni_mm on any CPU (VNNI dot products where the build has them, plain loops elsewhere), and int8_amx_mm
    where the CPU has AMX tiles: bit for bit their specification in torch, within the activations' rounding of the
    exact product, a row's result the same alone as among others. 200 weight rows: twelve blocks of 16 and a short
    one; 19 rows of activations: 8 + 8 + 2 + 1 (VNNI), a tile of 16 and one of 3 (AMX). Codes of -128 and 127 are
    the extremes the unsigned offset must carry."""
    if product == "int8_amx_mm" and not torch.ops.studio.int4_amx():
        pytest.skip("this CPU or build has no AMX int8 tiles")
    generator = torch.Generator().manual_seed(9)
    linear = Int8Linear(torch.randn(200, 640, generator=generator) * 0.05, None)
    linear.q[:3, :64] = torch.tensor([-128, 127, -127, 0], dtype=torch.int8).repeat(16)
    x = torch.randn(rows, 640, generator=generator).to(torch.bfloat16)
    x[:, :32] = torch.tensor([127.0, -126.5, 2.5, -2.5, 0.5, -0.5, 3.5, 100.5] * 4)  # halves: away from zero
    got = getattr(torch.ops.studio, product)(x, linear.q, linear.scale)
    assert got.shape == (rows, 200) and got.dtype == torch.float32
    assert torch.equal(got, _int8_with_int8_activations(x, linear))
    exact = x.double() @ linear.dequantize().double().t()
    assert _close(got, exact) < 1.5e-2
    for row in range(rows):
        assert torch.equal(getattr(torch.ops.studio, product)(x[row : row + 1], linear.q, linear.scale)[0], got[row])
    with pytest.raises(ValueError, match="multiple of 32"):
        getattr(torch.ops.studio, product)(x[:, :48], linear.q[:, :48].contiguous(), linear.scale)


def test_int8_weights_take_int8_activations_where_measured_forced_or_never(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(formats_, "_store", lambda: tmp_path / "weight-formats.json")
    # a measurement taken while other processes hold the CPUs is not kept: this machine may be busy with others
    monkeypatch.setattr(formats_.contention, "others_share", lambda start, end: 0.0)
    small = Int8Linear(torch.randn(64, 64), None)
    vnni, amx = torch.ops.studio.int4_vnni(), torch.ops.studio.int4_amx()
    everywhere = tiles.Int8Activations(tiles.ACTIVATION_BUCKETS[0], tiles.ACTIVATION_BUCKETS[-1])
    with_amx = everywhere._replace(amx_from=everywhere.first if amx else 0)
    for forced, expected in (("never", tiles.NEVER), ("always", everywhere), ("amx", with_amx)):
        monkeypatch.setenv(tiles.VNNI_ENV, forced)
        assert tiles.int8_rows(small.q, small.scale, 0) == (expected if vnni else tiles.NEVER)
    monkeypatch.delenv(tiles.VNNI_ENV)
    assert tiles.int8_rows(small.q, small.scale, 0) == tiles.NEVER  # tiny: never measured
    odd = Int8Linear(torch.randn(64, 40), None)  # rows that are not groups of 32 inputs: never
    monkeypatch.setenv(tiles.VNNI_ENV, "always")
    assert tiles.int8_rows(odd.q, odd.scale, 0) == tiles.NEVER
    monkeypatch.delenv(tiles.VNNI_ENV)
    if not vnni:
        return
    weight = Int8Linear(torch.randn(1024, 2048) * 0.05, None)  # 2M weights: measured
    told: list[str] = []
    first = tiles.int8_rows(weight.q, weight.scale, 0, told.append)
    assert first == tiles.NEVER or (first.first <= first.last and first.last in tiles.ACTIVATION_BUCKETS)
    assert first.amx_from == 0 or (amx and first.first <= first.amx_from <= first.last)
    assert told and told[0].startswith("measuring int8 products: int8 activations")
    assert tiles.int8_rows(weight.q, weight.scale, 0, told.append) == first
    assert len(told) == 1  # remembered: nothing to say


@pytest.mark.parametrize("product", ["int4_vnni_mm", "int4_amx_mm"])
@pytest.mark.parametrize("rows", [1, 5, 16, 19])
def test_int4_weights_times_int8_activations_are_computed_as_specified(rows, product) -> None:
    """int4_vnni_mm on any CPU (VNNI dot products over whole split blocks where the build has them, plain loops for
    the rest and elsewhere), and int4_amx_mm where the CPU has AMX tiles: bit for bit their specification in torch,
    within the activations' rounding of the exact product, and a row's result is the same alone as among others.
    208 rows: three whole blocks and a short one; 19 rows: a tile of 16 and one of 3. Some groups' values are
    halfway between two int8 steps (their largest is 127, so the scaled values are the values): they round away
    from zero."""
    if product == "int4_amx_mm" and not torch.ops.studio.int4_amx():
        pytest.skip("this CPU or build has no AMX int8 tiles")
    layout, linear, x, scales = _int4_case(rows, seed=6)
    x[:, :32] = torch.tensor([127.0, -126.5, 2.5, -2.5, 0.5, -0.5, 3.5, 100.5] * 4)  # exact in bfloat16
    got = getattr(torch.ops.studio, product)(x, linear.packed, scales, layout.block, layout.split)
    assert got.shape == (rows, linear.packed.shape[0]) and got.dtype == torch.float32
    assert torch.equal(got[:, :208], _int4_with_int8_activations(x, linear))
    exact = x.double() @ linear.dequantize().double().t()
    assert _close(got[:, :208], exact) < 1.5e-2  # half a step of each group's largest / 127, summed over groups
    for row in range(rows):
        alone = getattr(torch.ops.studio, product)(x[row : row + 1], linear.packed, scales, layout.block, layout.split)
        assert torch.equal(alone[0], got[row])


def test_int8_activations_start_where_measured_forced_or_never(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(formats_, "_store", lambda: tmp_path / "weight-formats.json")
    # a measurement taken while other processes hold the CPUs is not kept: this machine may be busy with others
    monkeypatch.setattr(formats_.contention, "others_share", lambda start, end: 0.0)
    if int4pack.layout() is None:
        pytest.skip("this torch's int4 packing layout is unknown here")
    small = Int4Linear(torch.randn(64, 64) * 0.05, None)
    scales = small.scales_and_zeros.contiguous()
    monkeypatch.delenv(tiles.VNNI_ENV, raising=False)
    assert tiles.vnni_rows(small.packed, scales, 0) == tiles.NEVER  # tiny: never measured
    monkeypatch.setenv(tiles.VNNI_ENV, "never")
    assert tiles.vnni_rows(small.packed, scales, 0) == tiles.NEVER
    vnni, amx = torch.ops.studio.int4_vnni(), torch.ops.studio.int4_amx()
    monkeypatch.setenv(tiles.VNNI_ENV, "always")
    everywhere = tiles.Int8Activations(tiles.ACTIVATION_BUCKETS[0], tiles.ACTIVATION_BUCKETS[-1])
    assert tiles.vnni_rows(small.packed, scales, 0) == (everywhere if vnni else tiles.NEVER)
    monkeypatch.setenv(tiles.VNNI_ENV, "amx")  # AMX where the CPU has it, else VNNI
    with_amx = everywhere._replace(amx_from=tiles.ACTIVATION_BUCKETS[0] if amx else 0)
    assert tiles.vnni_rows(small.packed, scales, 0) == (with_amx if vnni else tiles.NEVER)
    if not vnni:
        return
    monkeypatch.delenv(tiles.VNNI_ENV)
    weight = Int4Linear(torch.randn(1024, 2048) * 0.05, None)  # 2M weights: measured
    told: list[str] = []
    first = tiles.vnni_rows(weight.packed, weight.scales_and_zeros.contiguous(), 0, told.append)
    assert first == tiles.NEVER or (first.first <= first.last and first.last in tiles.ACTIVATION_BUCKETS)
    assert first.amx_from == 0 or (amx and first.first <= first.amx_from <= first.last)
    assert told and "int8 activations" in told[0]
    assert tiles.vnni_rows(weight.packed, weight.scales_and_zeros.contiguous(), 0, told.append) == first
    assert len(told) == 1  # remembered: nothing to say


@pytest.mark.parametrize(
    ("wins", "rows"),
    [
        ({4: "v", 8: "v"}, (3, 8, 0)),
        ({2: "v", 8: "v", 16: "a"}, (5, 16, 9)),
        ({2: "a", 4: "v", 16: "v"}, (2, 4, 0)),
        ({}, (0, 0, 0)),
        ({2: "v", 4: "v", 8: "v", 16: "v"}, (2, 16, 0)),
        ({2: "v", 4: "a", 8: "v", 16: "a"}, (2, 16, 9)),
        ({2: "a", 4: "a", 8: "a", 16: "a"}, (2, 16, 2)),
        ({1: "v", 2: "v", 8: "a"}, (1, 2, 0)),
        ({1: "v", 2: "a", 4: "a"}, (1, 4, 2)),
    ],
)
def test_int8_activations_take_the_longest_run_of_buckets_they_win(monkeypatch, wins, rows) -> None:
    """A bucket holds the rows above the one below it: winning at 4 and 8 (not 2 or 16) means 3 to 8 rows. VNNI
    ("v") and AMX ("a") buckets make one run; AMX tiles run from the first of the AMX buckets that end it."""
    if int4pack.layout() is None or not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI int4 products: never chosen")
    has_amx = torch.ops.studio.int4_amx()
    monkeypatch.setattr(torch.ops.studio, "int4_amx", lambda: True)  # measured as where the CPU has AMX
    named = {"v": tiles.VNNI, "a": tiles.AMX}

    def measure(passes, buckets, key=None, budget_s=None):
        assert set(passes) == {tiles.OTHERS, tiles.VNNI, tiles.AMX}
        for name, run in passes.items():  # the routes run on the weight itself (AMX where the CPU has it)
            if name != tiles.AMX or has_amx:
                run(buckets[0])
        return formats_.FormatChoice({b: named[wins[b]] if b in wins else tiles.OTHERS for b in buckets})

    monkeypatch.setattr(formats_, "measure", measure)
    monkeypatch.delenv(tiles.VNNI_ENV, raising=False)
    monkeypatch.setattr(tiles, "MIN_WEIGHTS", 0)
    weight = Int4Linear(torch.randn(64, 64) * 0.05, None)
    assert tiles.vnni_rows(weight.packed, weight.scales_and_zeros.contiguous(), 0) == rows


def test_the_runtime_record_names_every_route_a_step_takes() -> None:
    """CompiledStep.tiles_note: the bfloat16 tiles, int8 activations for int8 weights and for int4 weights per input
    width (VNNI, AMX from some rows), the float weights' claimed dot products, each only where it runs."""
    from types import SimpleNamespace

    note = compiled_step.CompiledStep.tiles_note.fget
    step = SimpleNamespace(
        tiles_from={"int4": 9, "int8": 0},
        int8_rows=tiles.Int8Activations(1, 16, 1),
        vnni_rows={2048: tiles.Int8Activations(1, 16, 5), 11008: tiles.Int8Activations(1, 8)},
        claimed_to=2,
        claimed_linears=3,
    )
    assert note(step) == (
        "bfloat16 tiles for int4 from 9 rows; int8 activations for int8 at 1-16 rows (AMX from 1); "
        "int8 activations for int4 2048-wide at 1-16 rows (AMX from 5), 11008-wide at 1-8 rows; "
        "claimed dot products for 3 float linears at 1-2 rows"
    )
    nothing = SimpleNamespace(
        tiles_from={"int4": 0}, int8_rows=tiles.NEVER, vnni_rows={2048: tiles.NEVER}, claimed_to=8, claimed_linears=0
    )
    assert note(nothing) is None
