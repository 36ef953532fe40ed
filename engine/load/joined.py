"""Joint buffers for the matrices the lean forward joins (a layer's q, k and v; its gate and up): one buffer per run of
neighbours in one format, allocated when the first of them is converted, and the loader's C++ decoders write each
matrix into its rows. The fused projection then takes the buffer as it lies (engine/model/stored.py), where joining
the parts afterwards copied every gate and up (0.8 GB of a 3B Q4 model, 0.3-0.4 s of its start)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.load import gguf_blocks, native
from engine.load.gguf_header import GGUFHeader, TensorEntry
from engine.load.weight_plan import INT4, INT8, TensorPlan
from engine.model import int4pack
from engine.model.quantized import INT4_GROUP, SCALE_DTYPE

#: the lean forward's joined projections, as GGUF names a layer's matrices (engine/model/fast_forward.py)
GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
INT4_ROWS = int4pack.ROW_MULTIPLE  # a part padded beyond its rows would leave padding inside the joint packing


@dataclass
class Slot:
    """A matrix's rows of its run's buffers: int4 (packed, scales_and_zeros [groups, rows, 2], a slice of rows) or
    int8 (q, scale)."""

    fmt: str
    first: torch.Tensor
    second: torch.Tensor


@dataclass
class _Run:
    fmt: str
    columns: int
    members: list[TensorEntry]
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    offsets: dict[str, int] = field(default_factory=dict)

    def slot(self, name: str) -> Slot:
        if self.buffers is None:
            total = sum(entry.rows for entry in self.members)
            if self.fmt == INT4:
                self.buffers = (
                    torch.empty(total, self.columns // 2, dtype=torch.uint8),
                    torch.empty(self.columns // INT4_GROUP, total, 2, dtype=SCALE_DTYPE),
                )
            else:
                codes = torch.empty(total, self.columns, dtype=torch.int8)
                self.buffers = (codes, torch.empty(total, dtype=SCALE_DTYPE))
        start = self.offsets[name]
        rows = next(entry.rows for entry in self.members if entry.name == name)
        first, second = self.buffers
        if self.fmt == INT4:
            return Slot(INT4, first[start : start + rows], second[:, start : start + rows])
        return Slot(INT8, first[start : start + rows], second[start : start + rows])


class JoinedBuffers:
    """Which matrices of a file share a buffer, and their slots. plan_of: a layer matrix's plan (as the loader gives
    it)."""

    def __init__(self, header: GGUFHeader, plan_of: Callable[[TensorEntry], TensorPlan]) -> None:
        self._runs: dict[str, _Run] = {}
        by_name = {entry.name: entry for entry in header.tensors}
        layers = sorted({entry.name.split(".")[1] for entry in header.tensors if entry.name.startswith("blk.")})
        for layer in layers:
            for group in GROUPS:
                entries = [by_name.get(f"blk.{layer}.{part}.weight") for part in group]
                self._add_runs([e for e in entries if e is not None], plan_of)

    def _add_runs(self, entries: list[TensorEntry], plan_of: Callable[[TensorEntry], TensorPlan]) -> None:
        run: list[TensorEntry] = []
        key: tuple[str, int] | None = None
        for entry in [*entries, None]:
            this = None if entry is None else _joint_format(entry, plan_of)
            if run and (this is None or this != key):
                self._close(run, key)
                run = []
            if this is not None:
                run.append(entry)  # type: ignore[arg-type]
                key = this
        # a run of one is a matrix of its own: nothing to join

    def _close(self, members: list[TensorEntry], key: tuple[str, int] | None) -> None:
        if len(members) < 2 or key is None:
            return
        run = _Run(key[0], key[1], list(members))
        start = 0
        for entry in members:
            run.offsets[entry.name] = start
            start += entry.rows
            self._runs[entry.name] = run

    def slot(self, name: str) -> Slot | None:
        """Where this matrix's conversion goes, or None for a tensor of its own."""
        run = self._runs.get(name)
        return None if run is None else run.slot(name)

    def __len__(self) -> int:
        return len(self._runs)


def _joint_format(entry: TensorEntry, plan_of: Callable[[TensorEntry], TensorPlan]) -> tuple[str, int] | None:
    """(format, columns) of a matrix the C++ decoders can write into a joint buffer, else None."""
    if len(entry.shape) != 2 or not native.available() or entry.kind not in gguf_blocks.DECODED:
        return None  # a type the decoders do not take (or refuse: the loader says so when it reaches the tensor)
    plan = plan_of(entry)
    columns = entry.shape[-1]
    if plan.fmt == INT4 and entry.kind in gguf_blocks.INT4_TYPES and int4pack.layout() is not None:
        return (INT4, columns) if entry.rows % INT4_ROWS == 0 else None
    if plan.fmt == INT8:
        return INT8, columns
    return None
