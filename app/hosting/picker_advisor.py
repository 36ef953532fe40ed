"""EngineAdvisor: answers the model picker's questions (supported options, estimates, free memory) from the engine."""

from __future__ import annotations

import dataclasses

from engine.credentials import hub_token
from engine.domain.model_choice import ModelChoice
from engine.errors import UnsupportedOptionError
from engine.load import kv_policy, options
from engine.load.decode_probe import compare_note
from engine.load.estimate import MemoryEstimate
from engine.load.loader import estimate_for_spec
from engine.load.memory import free_memory_bytes


class EngineAdvisor:
    dtypes = options.DTYPES
    quantizations = options.QUANTIZATIONS
    devices = options.DEVICES

    def _device(self, device: str) -> str | None:
        try:
            return options.resolve_device(device)
        except UnsupportedOptionError:
            return None

    def device_problem(self, device: str) -> str | None:
        try:
            options.resolve_device(device)
        except UnsupportedOptionError as exc:
            return str(exc)
        return None

    def dtype_problem(self, dtype: str, device: str) -> str | None:
        resolved = self._device(device)
        if resolved is None or dtype == "auto":
            return None
        return options.dtype_problem(dtype, resolved)

    def quantization_problem(self, quantization: str, device: str, dtype: str) -> str | None:
        resolved = self._device(device)
        if resolved is None:
            return None
        problem = options.quantization_problem(quantization, resolved)
        if problem is None and quantization != "none" and self.dtype_problem(dtype, device) is None:
            try:  # the loader also refuses some combinations with the dtype
                options.resolve_options(options.LoadOptions(dtype=dtype, quantization=quantization, device=device))
            except UnsupportedOptionError as exc:
                problem = str(exc)
        return problem

    def estimate(self, choice: ModelChoice) -> MemoryEstimate:
        """The memory estimate, and on a CPU what the chosen format does to decode speed, measured here on the
        model's layer shapes (about a second; the picker calls this off the GUI thread)."""
        load_options = choice.load_options
        estimate = estimate_for_spec(choice.spec, load_options)
        resolved = options.resolve_options(load_options)
        if resolved.device == "cpu" and estimate.shape.hidden_size:
            # a GGUF file held as stored: its main format (int4 for a Q4 file) is what decodes
            held = estimate.quantization.split("+")[0] if estimate.quantization != "none" else resolved.quantization
            dtype_auto = resolved.dtype_auto and estimate.dtype == "float32"
            note = compare_note(estimate.shape, held, dtype_auto)
            estimate = dataclasses.replace(estimate, decode_note=note)
        return estimate

    def auto_kv_budget(self, estimate: MemoryEstimate, free: int) -> int:
        """The KV budget the engine will work out for this model with `free` bytes free before it loads."""
        room = free - estimate.weight_bytes - estimate.engine_copy_bytes - estimate.runtime_bytes
        return kv_policy.default_budget(estimate.kv_bytes_per_token, max(0, room))

    def free_memory(self, device: str) -> tuple[int, str]:
        resolved = self._device(device) or "cpu"
        return free_memory_bytes(resolved), ("free GPU memory" if resolved == "cuda" else "free RAM")

    def hub_token_stored(self) -> bool:
        return bool(hub_token())
