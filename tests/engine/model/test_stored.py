"""Weights as stored fused for the lean forward: int4 packings concatenate exactly, and whether they do is probed once
per shape, not once per layer."""

from __future__ import annotations

import pytest
import torch

from engine.model import stored
from engine.model.quantized import Int4Linear


def _group(generator: torch.Generator, rows: tuple[int, ...], k: int = 128) -> list[Int4Linear]:
    return [Int4Linear(torch.randn(n, k, generator=generator), None) for n in rows]


def test_int4_packings_fuse_exactly_and_are_probed_once_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored, "_CONCATENATE", {})
    probes = 0
    real_forward = Int4Linear.forward

    def counting(self, x):
        nonlocal probes
        probes += 1
        return real_forward(self, x)

    generator = torch.Generator().manual_seed(3)
    layers = [_group(generator, (128, 64, 64)) for _ in range(4)]  # four layers of one shape: q, k, v
    x = torch.randn(5, 128, generator=generator)
    with torch.inference_mode():
        expected = [torch.cat([m(x) for m in group], dim=-1) for group in layers]
    monkeypatch.setattr(Int4Linear, "forward", counting)
    fused = [stored.fuse_int4(group) for group in layers]
    assert probes == 1 + 3  # the first layer's fused probe and its three parts; the other layers ask no one
    assert len(stored._CONCATENATE) == 1
    monkeypatch.setattr(Int4Linear, "forward", real_forward)
    with torch.inference_mode():
        for module, group, want in zip(fused, layers, expected, strict=True):
            assert module is not None and torch.equal(module(x), want)
            assert torch.equal(torch.cat([m(x) for m in group], dim=-1), want)  # the parts now view the fused bytes


def test_parts_fused_already_are_taken_as_they_lie() -> None:
    """The loader fuses a layer's gate and up while it reads the file; the lean forward's fusion then copies nothing."""
    generator = torch.Generator().manual_seed(5)
    gate, up = _group(generator, (128, 128))
    x = torch.randn(4, 128, generator=generator)
    with torch.inference_mode():
        expected = torch.cat([gate(x), up(x)], dim=-1)
    first = stored.fuse_int4([gate, up])
    again = stored.fuse_int4([gate, up])
    assert first is not None and again is not None
    assert again.packed.data_ptr() == first.packed.data_ptr() == gate.packed.data_ptr()
    assert again.scales_and_zeros.data_ptr() == first.scales_and_zeros.data_ptr()
    with torch.inference_mode():
        assert torch.equal(again(x), expected) and torch.equal(torch.cat([gate(x), up(x)], dim=-1), expected)
    reversed_order = stored.fuse_int4([up, gate])  # not one buffer in this order: copied, and still exact
    assert reversed_order is not None and reversed_order.packed.data_ptr() != first.packed.data_ptr()
    with torch.inference_mode():
        assert torch.equal(reversed_order(x), torch.cat([expected[:, 128:], expected[:, :128]], dim=-1))
