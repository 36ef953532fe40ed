"""What a model really takes against what the picker estimated: load time, weights, KV bytes per token, memory."""

from __future__ import annotations

import resource
import time

from engine.core.config import EngineConfig
from engine.load.estimate import format_bytes
from engine.model.geometry import attention_geometry


def resident_bytes() -> int:
    """The process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryProbe:
    """Created before the model loads; loaded() after; report() once the engine has run (its own copies made)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.before = resident_bytes()
        self.load_s = 0.0
        self.after_load = self.before

    def loaded(self, loaded) -> None:
        self.load_s = time.perf_counter() - self.started
        self.after_load = resident_bytes()

    def report(self, loaded, config: EngineConfig) -> dict:
        model = loaded.model
        # an engine weight module holds its bytes in buffers (int4 packing, int8 rows): counted with the parameters
        held = [*model.named_parameters(), *model.named_buffers()]
        weights = sum(t.numel() * t.element_size() for name, t in held if "rotary" not in name)
        element = loaded.kv_dtype.itemsize
        return {
            "load_s": self.load_s,
            "parameters": loaded.info.parameters,
            "weight_bytes": weights,
            "weight_bytes_estimated": loaded.info.weight_bytes,
            "kv_bytes_per_token": attention_geometry(model.config).kv_bytes_per_token(element),
            "kv_bytes_per_token_estimated": loaded.info.kv_bytes_per_token,
            "kv_pool_bytes": config.kv_memory_bytes if config.kv_pages is None else None,
            "resident_after_load_bytes": self.after_load - self.before,
            "resident_after_runs_bytes": resident_bytes() - self.before,
        }

    @staticmethod
    def line(report: dict) -> str:
        return (
            f"load {report['load_s']:.1f} s; weights {format_bytes(report['weight_bytes'])} "
            f"(estimated {format_bytes(report['weight_bytes_estimated'])}); KV "
            f"{format_bytes(report['kv_bytes_per_token'])}/token (estimated "
            f"{format_bytes(report['kv_bytes_per_token_estimated'])}); process memory +"
            f"{format_bytes(report['resident_after_load_bytes'])} after loading, +"
            f"{format_bytes(report['resident_after_runs_bytes'])} after the runs (engine copies, KV pools, baselines)"
        )
