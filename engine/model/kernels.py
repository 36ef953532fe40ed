"""Linear kernels: oneDNN weight-prepacked linears (CPU, float32), and fusing several linears into one."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.load.memory import free_memory_bytes
from engine.model import weights

log = logging.getLogger(__name__)

_PACK_HINT = 16  # oneDNN picks its weight layout for about this many rows; any row count works


def onednn_packing_available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or ops is None:
        return False
    try:
        weight = torch.randn(8, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
        x = torch.randn(3, 4)
        return torch.allclose(
            torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), x @ weight.T, atol=1e-5
        )
    except Exception:  # an internal op: absent or changed in this torch build
        return False


class PackedLinear(nn.Module):
    """nn.Linear with its weight pre-packed by oneDNN, which multiplies small row counts faster than a plain
    sgemm on CPUs (decode batches are 1–64 rows)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_plain: bool = False) -> None:
        """keep_plain: hold `weight` too, where the model keeps it anyway (no copy): the compiled step's claimed
        products read its plain rows (engine/model/dense_rows.py)."""
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        plain = weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(plain.contiguous(), _PACK_HINT)
        self.bias = None if bias is None else bias.detach().contiguous()
        shared = keep_plain and plain.is_contiguous() and plain.dtype == torch.float32
        self.plain: torch.Tensor | None = plain if shared else None  # an attribute: not the module's state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def should_pack(model: nn.Module) -> bool:
    """Prepacked weights are a second copy of every float32 linear weight: worth it on a CPU when that copy fits
    easily beside everything else (a quarter of the memory available now). Other formats are never prepacked."""
    float32 = [m for m in model.modules() if type(m) is nn.Linear and m.weight.dtype == torch.float32]
    if weights.device_of(model).type != "cpu" or not float32 or not onednn_packing_available():
        return False
    linear_bytes = sum(m.weight.numel() * 4 for m in float32)
    return linear_bytes < free_memory_bytes("cpu") // 4


def fuse_linears(linears: list[nn.Linear], pack: bool) -> nn.Module:
    """One linear computing several (same input) side by side. The originals are re-pointed at slices of the fused
    weight, so the fused rows cost no memory and the transformers modules keep working; packed, the packing is the
    one copy more (and the plain fused rows stay for the compiled step's claimed products)."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
    if pack:
        fused: nn.Module = PackedLinear(weight, bias, keep_plain=True)
    else:
        fused = nn.Linear(
            weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype
        )
        fused.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            fused.bias = nn.Parameter(bias, requires_grad=False)
    start = 0
    for module in linears:
        rows = module.out_features
        module.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            module.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return fused


def linear_from(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> nn.Module:
    if pack:
        return PackedLinear(weight, bias)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if bias is not None:
            fused.bias.copy_(bias)
    fused.requires_grad_(False)
    return fused
