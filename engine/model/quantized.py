"""Weight-only quantized linears on torch's own CPU kernels: int8 per output channel, int4 in groups of 32 along
the input (the layout of GGUF's Q4_1). Activations are bfloat16, outputs float32; they read 4x and 8x fewer weight
bytes than float32, which is what a decode step on a CPU waits for."""

from __future__ import annotations

import torch
from torch import nn

INT4_GROUP = 32
INT4_TILES = 2  # inner k tiles of torch's int4 CPU packing


class Int8Linear(nn.Module):
    """Symmetric int8 per output channel: w = q * scale."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
        self.q = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(rows, self.q, self.scale).float()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """Asymmetric int4 in groups of INT4_GROUP input columns: w = (q - 8) * scale + zero (torch's convention)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        n, k = weight.shape
        if k % INT4_GROUP or n % 8:
            raise ValueError(f"int4 needs rows divisible by 8 and columns by {INT4_GROUP}, not {n}x{k}")
        self.in_features, self.out_features = k, n
        groups = weight.reshape(n, k // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = (high - low).clamp_min(1e-12) / 15
        q = ((groups - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = low + 8 * scale
        self.scales_and_zeros = (
            torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        )
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, INT4_TILES)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        # the kernel reads its scales as contiguous whatever their strides (the lean forward's fused modules leave
        # the model's own modules strided views of theirs)
        scales = self.scales_and_zeros.contiguous()
        out = torch._weight_int4pack_mm_for_cpu(rows, self.packed, INT4_GROUP, scales).float()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)
