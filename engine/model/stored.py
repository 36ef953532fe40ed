"""The lean forward's projections over weights as stored: neighbours of one format fused into one linear (float and
16-bit weights concatenated, int8 rows and int4 packings concatenated, the model's own modules re-pointed at slices
so nothing is held twice), side-by-side parts where a file stores them in different formats, and float weights of
another dtype than the activations computed in their own dtype with float32 out (HalfLinear)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.model import int4pack, kernels, weights
from engine.model.quantized import HalfLinear, Int4Linear, Int8Linear

log = logging.getLogger(__name__)

#: whether int4 packings of these shapes concatenate exactly (probed on the first group of each shape: every layer of a
#: model has the same shapes, and probing each of a 3B model's 72 groups took half a second of the load)
_CONCATENATE: dict[tuple, bool] = {}


class SplitLinear(nn.Module):
    """Several linears of one input side by side (each in its own format): their outputs concatenated."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def projection(modules: list[nn.Module], activations: torch.dtype, pack: bool) -> nn.Module:
    """One module computing `modules` (same input) side by side: runs of one format fused, where they fuse exactly."""
    groups: list[list[nn.Module]] = []
    for module in modules:
        if groups and _fusable(groups[-1][-1], module):
            groups[-1].append(module)
        else:
            groups.append([module])
    parts: list[nn.Module] = []
    for group in groups:
        fused = _fuse(group, activations, pack)
        if fused is None:  # a packing that does not concatenate here: each on its own
            parts.extend(_fuse([module], activations, pack) for module in group)
        else:
            parts.append(fused)
    parts = [_own_scales(part) for part in parts]
    return parts[0] if len(parts) == 1 else SplitLinear(parts)


def _own_scales(module: nn.Module) -> nn.Module:
    """A matrix the loader wrote into a joint buffer (engine/load/joined.py) but computed on its own here (its
    neighbours in another format, or packings that do not concatenate) gets a copy of its scales: its rows of the
    joint scales are strided, and the kernels take them contiguous."""
    if isinstance(module, Int4Linear) and not module.scales_and_zeros.is_contiguous():
        module.scales_and_zeros = module.scales_and_zeros.contiguous()
    return module


def _fusable(a: nn.Module, b: nn.Module) -> bool:
    return (
        type(a) is type(b)
        and weights.linear_format(a) == weights.linear_format(b)
        and a.in_features == b.in_features
        and (a.bias is None) == (b.bias is None)
    )


def _fuse(group: list[nn.Module], activations: torch.dtype, pack: bool) -> nn.Module | None:
    first = group[0]
    if len(group) > 1 and isinstance(first, Int8Linear):
        return _fuse_int8(group)
    if len(group) > 1 and isinstance(first, Int4Linear):
        return fuse_int4(group)
    if len(group) > 1 and isinstance(first, HalfLinear):
        return _fuse_half(group)
    if weights.weight_module(first):
        return first
    if first.weight.dtype == activations:
        if len(group) == 1:
            return kernels.PackedLinear(first.weight, first.bias, keep_plain=True) if pack else first
        return kernels.fuse_linears(group, pack)
    # a float weight of another dtype than the activations (a model cast whole to 16 bits): computed in its dtype
    fused = first if len(group) == 1 else kernels.fuse_linears(group, pack=False)
    return HalfLinear(fused.weight, fused.bias, fused.weight.dtype)  # holds the same tensor: no copy


def _bias(group: list[nn.Module]) -> torch.Tensor | None:
    return None if group[0].bias is None else torch.cat([m.bias.detach().float() for m in group])


def _fuse_int8(group: list[Int8Linear]) -> Int8Linear:
    """Rows concatenated, scales too (per row); the originals re-pointed at their rows of the fused tensors. Parts the
    loader wrote into one buffer (engine/load/joined.py) are taken as they lie: no copy."""
    q, scale = _slices_of_one([m.q for m in group], 0), _slices_of_one([m.scale for m in group], 0)
    if q is None or scale is None:
        q, scale = torch.cat([m.q for m in group]), torch.cat([m.scale for m in group])
    fused = Int8Linear.from_rows(q, scale, _bias(group))
    start = 0
    for module in group:
        rows = slice(start, start + module.out_features)
        module.q, module.scale = fused.q[rows], fused.scale[rows]
        start += module.out_features
    return fused


def _fuse_half(group: list[HalfLinear]) -> HalfLinear:
    weight = torch.cat([m.weight for m in group])
    fused = HalfLinear(weight, _bias(group), weight.dtype)
    start = 0
    for module in group:
        module.weight = fused.weight[start : start + module.out_features]
        start += module.out_features
    return fused


def fuse_int4(group: list[Int4Linear]) -> Int4Linear | None:
    """torch's CPU packing is by blocks of rows, so packings concatenate where every part fills whole blocks and has
    no padding rows: checked on a probe (the fused output must equal the parts' exactly) once per shape, else None.
    The originals are re-pointed at the fused tensors, so nothing is held twice (their scales become strided views:
    Int4Linear makes them contiguous per call, which only the transformers forward pays)."""
    if any(m.packed.shape[0] != m.out_features for m in group):
        return None
    fused = Int4Linear.__new__(Int4Linear)
    nn.Module.__init__(fused)
    fused.in_features, fused.out_features = group[0].in_features, sum(m.out_features for m in group)
    # parts the loader wrote into one buffer (views of it, in this order: engine/load/joined.py) are taken as they lie
    packed = _slices_of_one([m.packed for m in group], 0)
    scales = _slices_of_one([m.scales_and_zeros for m in group], 1)
    fused.register_buffer("packed", packed if packed is not None else torch.cat([m.packed for m in group]))
    fused.register_buffer(
        "scales_and_zeros",
        scales if scales is not None else torch.cat([m.scales_and_zeros.contiguous() for m in group], dim=1),
    )
    fused.register_buffer("bias", _bias(group))
    shapes = (
        int4pack.layout(),
        fused.in_features,
        *[(m.out_features, *m.packed.shape, *m.scales_and_zeros.shape) for m in group],
    )
    if shapes not in _CONCATENATE:  # a question of the packing's layout and the shapes alone: asked once per shape
        probe = torch.randn(3, fused.in_features, generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            together = fused(probe)
            apart = torch.cat([m(probe) for m in group], dim=-1)
        _CONCATENATE[shapes] = torch.equal(together, apart)
    if not _CONCATENATE[shapes]:
        log.debug("int4 packings of %s rows do not concatenate here", [m.out_features for m in group])
        return None
    start = 0
    for module in group:
        module.packed = fused.packed[start : start + module.out_features]
        module.scales_and_zeros = fused.scales_and_zeros[:, start : start + module.out_features]
        start += module.out_features
    return fused


def _slices_of_one(parts: list[torch.Tensor], dim: int) -> torch.Tensor | None:
    """The contiguous tensor these are consecutive slices of along `dim` (as a fusion leaves its parts), or None."""
    first = parts[0]
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for part in parts:
        same_sides = part.shape[:dim] == first.shape[:dim] and part.shape[dim + 1 :] == first.shape[dim + 1 :]
        if part.untyped_storage().data_ptr() != storage or part.stride() != first.stride() or not same_sides:
            return None
        if part.storage_offset() != offset:
            return None
        offset += part.shape[dim] * part.stride(dim)
    size = list(first.shape)
    size[dim] = sum(part.shape[dim] for part in parts)
    whole = first.as_strided(size, first.stride())
    return whole if whole.is_contiguous() else None


def weight_module(module: nn.Module) -> nn.Module:
    """A linear as one of the engine's weight modules: itself, or a float nn.Linear held in HalfLinear (no copy)."""
    if weights.weight_module(module):
        return module
    return HalfLinear(module.weight, module.bias, module.weight.dtype)
