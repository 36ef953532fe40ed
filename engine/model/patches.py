"""Reversible speed-ups patched into a Hugging Face model's modules: fused QKV and gate/up projections, fused
RMSNorm, prepacked linears. Each is checked against the original module on random input before it is kept, so an
architecture it does not fit keeps its own code; baselines and references run the original modules."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import weights
from engine.model.kernels import PackedLinear, linear_from, should_pack

log = logging.getLogger(__name__)

_ATTR = "_studio_patches"


class FusedQKV(nn.Module):
    """Stands in for q_proj: computes q, k and v in one matmul and keeps k and v for the k_proj and v_proj
    stand-ins, which the attention code calls next with the same input tensor."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear, pack: bool) -> None:
        super().__init__()
        weight = torch.cat([q.weight, k.weight, v.weight])
        bias = None if q.bias is None else torch.cat([q.bias, k.bias, v.bias])
        self.linear = linear_from(weight, bias, pack)
        self.sizes = (q.out_features, k.out_features, v.out_features)
        self.local = threading.local()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.linear(x).split(self.sizes, dim=-1)
        self.local.pending = (x, k, v)
        return q

    def take(self, x: torch.Tensor, which: int) -> torch.Tensor:
        pending = getattr(self.local, "pending", None)
        if pending is None or pending[0] is not x:  # called out of the expected order: compute it directly
            return self.linear(x).split(self.sizes, dim=-1)[which]
        result = pending[which]
        if which == 2:
            self.local.pending = None
        return result


class TakeProjection(nn.Module):
    """Stands in for k_proj or v_proj, returning what FusedQKV computed."""

    def __init__(self, fused: FusedQKV, which: int) -> None:
        super().__init__()
        self.which = which
        self._fused = [fused]  # a list, so the fused module is not registered twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fused[0].take(x, self.which)


class FusedGatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up in one matmul."""

    def __init__(self, mlp: nn.Module, pack: bool) -> None:
        super().__init__()
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        bias = None if gate.bias is None else torch.cat([gate.bias, up.bias])
        self.gate_up = linear_from(torch.cat([gate.weight, up.weight]), bias, pack)
        self.down = linear_from(down.weight, down.bias, pack) if pack else down
        self.act_fn = mlp.act_fn
        self.intermediate = gate.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate, dim=-1)
        return self.down(self.act_fn(gate) * up)


class FusedRMSNorm(nn.Module):
    """The Llama-style RMSNorm (weight * x / rms(x)) as one fused torch kernel."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.variance_epsilon
        self.shape = (norm.weight.shape[0],)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)


@dataclass
class ModelPatches:
    """Module replacements that can be undone (baselines and golden references run the original model)."""

    swaps: list[tuple[nn.Module, str, nn.Module, nn.Module]] = field(default_factory=list)
    applied: bool = False
    kinds: list[str] = field(default_factory=list)

    def apply(self) -> None:
        if not self.applied:
            for parent, name, _original, replacement in self.swaps:
                setattr(parent, name, replacement)
            self.applied = True

    def restore(self) -> None:
        if self.applied:
            for parent, name, original, _replacement in reversed(self.swaps):
                setattr(parent, name, original)
            self.applied = False


def _same(original: Callable, replacement: Callable, width: int, device, dtype) -> bool:
    x = torch.randn(3, width, device=device, dtype=dtype)
    with torch.inference_mode():
        expected = original(x)
        got = replacement(x)
    if expected.shape != got.shape:
        return False
    # relative to the output's scale: another summation order moves float32 results by ~1e-7 of it
    scale = expected.abs().max().clamp_min(1e-6)
    return bool(((expected - got).abs().max() / scale) < 1e-4)


def _plain_linear(module: object, dtype: torch.dtype) -> bool:
    """A float nn.Linear computing in the activations' dtype (weights held in another format keep their modules)."""
    return type(module) is nn.Linear and module.weight.dtype == dtype


def _part(fused: FusedQKV, index: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: fused.linear(x).split(fused.sizes, -1)[index]


def _fusable_qkv(q, k, v, dtype: torch.dtype) -> bool:
    return (
        all(_plain_linear(m, dtype) for m in (q, k, v))
        and q.in_features == k.in_features == v.in_features
        and (q.bias is None) == (k.bias is None) == (v.bias is None)
    )


def build_patches(model: nn.Module, pack: bool | None = None) -> ModelPatches:
    """Work out (and verify) the replacements for this model without applying them."""
    device, dtype = weights.device_of(model), weights.activation_dtype(model)
    if pack is None:
        pack = should_pack(model)
    patches = ModelPatches()
    kinds: set[str] = set()
    for module in list(model.modules()):
        q, k, v = (getattr(module, n, None) for n in ("q_proj", "k_proj", "v_proj"))
        if _fusable_qkv(q, k, v, dtype):
            fused = FusedQKV(q, k, v, pack)
            if all(_same(orig, _part(fused, i), q.in_features, device, dtype) for i, orig in enumerate((q, k, v))):
                patches.swaps += [
                    (module, "q_proj", q, fused),
                    (module, "k_proj", k, TakeProjection(fused, 1)),
                    (module, "v_proj", v, TakeProjection(fused, 2)),
                ]
                kinds.add("fused QKV")
                o = getattr(module, "o_proj", None)
                if pack and _plain_linear(o, dtype):
                    patches.swaps.append((module, "o_proj", o, PackedLinear(o.weight, o.bias)))
        gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
        if all(_plain_linear(m, dtype) for m in (gate, up, down)) and hasattr(module, "act_fn"):
            fused_mlp = FusedGatedMLP(module, pack)
            if _same(module.forward, fused_mlp.forward, gate.in_features, device, dtype):
                for parent, name in _parents_of(model, module):
                    patches.swaps.append((parent, name, module, fused_mlp))
                kinds.add("fused gate/up MLP")
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            norm = FusedRMSNorm(module)
            if _same(module.forward, norm.forward, norm.shape[0], device, dtype):
                for parent, name in _parents_of(model, module):
                    patches.swaps.append((parent, name, module, norm))
                kinds.add("fused RMSNorm")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if pack and _plain_linear(head, dtype):
        packed = PackedLinear(head.weight, head.bias)
        if _same(head.forward, packed.forward, head.in_features, device, dtype):
            packed.weight = head.weight  # callers read lm_head.weight (shape, tying); no extra copy kept
            for parent, name in _parents_of(model, head):
                patches.swaps.append((parent, name, head, packed))
    if pack and patches.swaps:
        kinds.add("oneDNN prepacked linears")
    patches.kinds = sorted(kinds)
    return patches


def _parents_of(model: nn.Module, target: nn.Module) -> list[tuple[nn.Module, str]]:
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is target:
                found.append((parent, name))
    return found


def optimize(model: nn.Module, pack: bool | None = None) -> ModelPatches:
    """Apply the speed-ups (once per model); later calls return the same patches, re-applied."""
    patches = getattr(model, _ATTR, None)
    if patches is None:
        patches = build_patches(model, pack)
        setattr(model, _ATTR, patches)
        log.info("engine kernels: %s", ", ".join(patches.kinds) or "none apply to this model")
    patches.apply()
    return patches


def restore(model: nn.Module) -> None:
    """Undo the speed-ups applied to this model, if any (the lean forward reads the original modules)."""
    patches: ModelPatches | None = getattr(model, _ATTR, None)
    if patches is not None:
        patches.restore()


@contextlib.contextmanager
def original_modules(model: nn.Module) -> Iterator[None]:
    """Run code on the model exactly as transformers built it, then put the speed-ups back."""
    patches: ModelPatches | None = getattr(model, _ATTR, None)
    was_applied = bool(patches and patches.applied)
    if patches:
        patches.restore()
    try:
        yield
    finally:
        if patches and was_applied:
            patches.apply()
