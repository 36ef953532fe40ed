"""ModelRunner: runs one packed batch through the model (the lean forward or transformers' with paged attention)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.errors import UnsupportedOptionError
from engine.model import attention, fast_forward, llama_family, patches
from engine.model.attention import PagedKVCache
from engine.model.batch import allowed_masks, pack
from engine.model.step_plan import StepPlan

log = logging.getLogger(__name__)


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [sampled rows, vocab], float32: each sampling row's 1 + len(draft), in the plan's order
    forward_s: float
    weight_format: str = ""  # the format the step's linears ran in
    grammar_applied: bool = False  # the logits carry the grammars' masks and min_tokens' bans (the LM head's)


def output_size(model: torch.nn.Module) -> int:
    """The LM head's rows (the vocabulary it scores): an nn.Linear or an engine weight module (no .weight)."""
    head = model.get_output_embeddings()
    return head.out_features if hasattr(head, "out_features") else head.weight.shape[0]


def prepare_model(model: torch.nn.Module) -> None:
    """Switch the model's attention to the paged implementation, or say why this model can't use it."""
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise UnsupportedOptionError(
            f"{name} does not dispatch attention through transformers' AttentionInterface, so the paged engine "
            "cannot run it; pick a Llama, Mistral, Qwen, Gemma or Phi-3 style model"
        )
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(text_config, "attn_logit_softcapping", None):
        raise UnsupportedOptionError(f"{name} uses attention logit soft-capping, which the paged engine lacks")
    attention.register()
    model.set_attn_implementation(attention.ATTENTION_NAME)
    if model.config._attn_implementation != attention.ATTENTION_NAME:
        # frozen installs have no module source for transformers' heuristic check; set it directly
        model.config._attn_implementation_internal = attention.ATTENTION_NAME


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        cache: PagedKVCache,
        optimize: bool = True,
        formats: Sequence[str] = (),
        compiled: bool = True,
        progress: Callable[[str], None] | None = None,
        weights_identity: str | None = None,
    ) -> None:
        """optimize: the lean forward where the architecture allows, else the transformers modules with fused,
        reversible kernels; off: the transformers forward as it is (with paged attention). formats: weight formats
        the lean forward may use besides the model's own, the fastest per batch size (model/formats.py). compiled:
        every layer of the lean forward's steps in one C++ call where it builds (model/compiled_step.py). progress: told
        what the lean forward measures and checks while it is built (the window's status bar). weights_identity:
        where the weights come from, so a check passed at an earlier start is remembered (model/check_memory.py)."""
        own_modules = isinstance(model, llama_family.LlamaFamilyForCausalLM)
        if not own_modules:
            prepare_model(model)
        self.cache = cache
        self.vocab_size = output_size(model)
        #: tokens that end a reply (the engine's EOS ids): banned before the LM head's leaders while min_tokens is due
        self.end_token_ids: set[int] = set()
        self.fast = None
        if optimize:
            self.fast = fast_forward.build(
                model, formats=formats, compiled=compiled, kv_dtype=cache.storage.dtype, progress=progress,
                weights_identity=weights_identity,
            )  # fmt: skip
        if self.fast is None and own_modules:
            # the lean forward is off or was rejected: transformers' forward, around the same modules
            model = llama_family.transformers_model(model)
            prepare_model(model)
        self.model = model
        if self.fast is not None:
            self.kernels = list(self.fast.kinds)
            patches.restore(model)  # an earlier engine on this model may have patched its modules
        elif optimize:
            self.kernels = patches.optimize(model).kinds
        else:
            self.kernels = []
            patches.restore(model)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> ForwardResult:
        batch = pack(plan, self.cache, tables=self.fast is not None and bool(self.fast.compiled))
        started = time.perf_counter()
        weight_format = ""
        allowed = None
        if self.fast is not None:
            leading = batch.leading
            if leading is not None:
                allowed = allowed_masks(batch.sampling, self.vocab_size, self.end_token_ids)
            logits = self.fast(
                batch.context, batch.input_ids, batch.positions, batch.keep, leading, allowed, batch.tables,
                batch.penalized,
            ).float()  # fmt: skip
            weight_format = self.fast.last_format
        else:
            with attention.step_context(batch.context):
                output = self.model(
                    input_ids=batch.input_ids.unsqueeze(0),
                    position_ids=batch.positions.unsqueeze(0),
                    use_cache=False,
                    logits_to_keep=batch.keep,
                )
            logits = output.logits[0].float()
        elapsed = time.perf_counter() - started
        return ForwardResult(logits, elapsed, weight_format, allowed is not None)
