"""ModelChoice: what the user picked to load: model spec, dtype, quantization, device and KV-cache budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from engine.load.load_options import LoadOptions

AUTO_KV_MIB = 0  # the KV budget worked out from the model and the free memory (engine/load/kv_policy.py)
DEFAULT_KV_MIB = AUTO_KV_MIB


@dataclass(frozen=True)
class ModelChoice:
    spec: str = "default"  # the embedded model, a folder, a .gguf file or a hub repo id
    dtype: str = "auto"
    quantization: str = "none"
    device: str = "auto"
    kv_memory_mib: int = DEFAULT_KV_MIB  # 0: automatic

    @classmethod
    def of(cls, spec: str, options: LoadOptions, kv_memory_mib: int = DEFAULT_KV_MIB) -> ModelChoice:
        return cls(spec, options.dtype, options.quantization, options.device, kv_memory_mib)

    @property
    def load_options(self) -> LoadOptions:
        """How the loader is asked for this model (the one place a choice becomes engine options)."""
        return LoadOptions(self.dtype, self.quantization, self.device)

    @property
    def kv_memory_bytes(self) -> int:
        """The budget asked for; 0 when it is automatic."""
        return self.kv_memory_mib * 1024**2

    @property
    def label(self) -> str:
        extras = [v for v in (self.dtype, self.quantization, self.device) if v not in ("auto", "none")]
        name = "embedded SmolLM2-135M-Instruct" if self.spec in ("", "default") else self.spec
        return f"{name} ({', '.join(extras)})" if extras else name

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ModelChoice:
        if not isinstance(data, dict):
            return cls()
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return cls()
