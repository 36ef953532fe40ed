"""EngineConfig: page size, KV pool size, batching limits and prefix caching."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UnsupportedOptionError

# a fixed budget for comparisons (the bench's baselines); the engine's own default is automatic (kv_policy.py)
DEFAULT_KV_MEMORY = 512 * 1024**2


# A CPU prefills a few hundred tokens a second: 256 tokens make a step of about half a second on two cores, so a
# long prompt arriving costs the chats already streaming at most that much (512 doubled the stall and, with many
# requests arriving at once, made them all wait for the same long steps). A GPU prefills thousands a second.
CPU_STEP_TOKENS = 256
GPU_STEP_TOKENS = 2048


def step_tokens_for(device: str) -> int:
    """The default token budget of one step on this device ("cpu", "cuda", "cuda:1", "mps")."""
    return CPU_STEP_TOKENS if str(device).startswith("cpu") else GPU_STEP_TOKENS


@dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    #: explicit number of KV pages; when None the pool is sized by kv_memory_bytes
    kv_pages: int | None = None
    #: the KV budget; None: automatic, by the model's bytes per token and the memory free (engine/load/kv_policy.py)
    kv_memory_bytes: int | None = None
    max_running: int = 64
    #: prefill + decode tokens computed in one step (chunked prefill keeps long prompts from stalling decodes);
    #: None picks one for the device (see step_tokens_for)
    max_step_tokens: int | None = None
    prefix_caching: bool = True
    #: seconds a step may spend prefilling beside running streams (or stall_ratio x their decode step, if longer);
    #: measured per model and machine as the engine runs (core/step_cost.py); None: the token budget alone
    prefill_budget_s: float | None = 0.1
    prefill_stall_ratio: float = 1.0
    #: speculative decoding with prompt-lookup drafts, while at most speculative_max_batch requests decode (a few
    #: rows cost a bandwidth-bound step almost nothing more; many rows do), drafts up to draft_max tokens
    speculative: bool = True
    speculative_max_batch: int = 4
    draft_max: int = 8
    #: fused projections, fused RMSNorm and (CPU float32) prepacked weights; see engine/model/kernels.py and patches.py
    optimize: bool = True
    #: every layer of the lean forward's steps in one C++ call, compiled on the first start where a C++ compiler is
    #: found (engine/model/compiled_step.py); the Python layers otherwise
    compiled_step: bool = True
    #: JSON schemas' objects (response formats, tool arguments) take only the properties they declare unless the
    #: schema says additionalProperties, as vLLM decodes them; True lets the model add others (core/schemas.py)
    open_schema_objects: bool = False
    #: steps kept in the metrics ring buffer
    metrics_capacity: int = 8192

    def validate(self) -> None:
        if self.page_size < 1 or self.page_size > 4096:
            raise UnsupportedOptionError(f"page size must be between 1 and 4096 tokens, not {self.page_size}")
        if self.kv_pages is not None and self.kv_pages < 2:
            raise UnsupportedOptionError(f"the KV pool needs at least 2 pages, not {self.kv_pages}")
        if self.kv_pages is None and self.kv_memory_bytes is not None and self.kv_memory_bytes <= 0:
            raise UnsupportedOptionError("the KV memory budget must be positive")
        if self.max_running < 1:
            raise UnsupportedOptionError(f"max running sequences must be at least 1, not {self.max_running}")
        if self.max_step_tokens is not None and self.max_step_tokens < 1:
            raise UnsupportedOptionError(f"tokens per step must be at least 1, not {self.max_step_tokens}")
        if self.prefill_budget_s is not None and not 0 < self.prefill_budget_s <= 60:
            raise UnsupportedOptionError(f"the prefill time budget must be in (0, 60] s, not {self.prefill_budget_s}")
        if not 0 <= self.draft_max <= 64 or self.speculative_max_batch < 0:
            raise UnsupportedOptionError(f"draft length must be in [0, 64], not {self.draft_max}")
        if not 0 <= self.prefill_stall_ratio <= 100:
            raise UnsupportedOptionError(f"the prefill stall ratio must be in [0, 100], not {self.prefill_stall_ratio}")

    def pages_for(self, kv_bytes_per_token: int, auto_budget: int | None = None) -> int:
        """Pages of the pool: kv_pages, or the budget's worth (auto_budget when the budget is automatic)."""
        if self.kv_pages is not None:
            return self.kv_pages
        budget = self.kv_memory_bytes if self.kv_memory_bytes is not None else auto_budget
        if budget is None:
            raise UnsupportedOptionError("the KV budget is automatic but no automatic budget was worked out")
        pages = budget // (kv_bytes_per_token * self.page_size)
        if pages < 2:
            raise UnsupportedOptionError(
                f"a KV budget of {budget} bytes holds fewer than 2 pages of {self.page_size} tokens for this model; "
                "raise it"
            )
        return int(pages)
