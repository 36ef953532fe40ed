"""Builders shared by the tests: a tiny random Llama with a tiny byte-level tokenizer, an in-memory keyring."""

from __future__ import annotations

from pathlib import Path

import keyring.backend
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n",
    "Large language models predict the next token from the previous ones.",
]


def require_compiled_step() -> None:
    """The compiled step built and loaded here: the calling test is skipped only where it can't be by how this machine
    is (no compiler, no torch headers, turned off); a failing compile, load or contract fails it."""
    import pytest

    from engine.model import compiled_step

    if not compiled_step.ensure_loaded():
        if compiled_step.failure_expected():
            pytest.skip(f"no compiled step here: {compiled_step.failure_reason()}")
        pytest.fail(f"the compiled step does not build or load: {compiled_step.failure_reason()}")


def make_tiny_tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 5, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def make_tiny_llama(folder: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A randomly initialised Llama (2 layers, hidden 64) with its tokenizer, saved as an HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tiny_tokenizer(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Random init gives near-uniform logits; sharpen them so greedy decoding is not decided by rounding noise.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    return folder


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring that lives in a dict, so tests never touch the real one."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        import keyring.errors

        if (service, username) not in self.store:
            raise keyring.errors.PasswordDeleteError(username)
        del self.store[(service, username)]


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos: bool = True) -> list[int]:
    """transformers' own greedy generate, with attention_mask passed (see DESIGN.md: the pad token is a
    chat token here) and the model's standard attention, as the golden reference."""
    from engine.model.llama_family import transformers_model
    from engine.model.reference import transformers_mode

    model = transformers_model(model)  # a model held as stored: transformers' classes around the same modules
    with transformers_mode(model):
        ids = torch.tensor([prompt_ids])
        kwargs = {} if eos else {"eos_token_id": None, "min_new_tokens": max_new_tokens}
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
                **kwargs,
            )
        return out[0, len(prompt_ids) :].tolist()


def run_to_completion(engine, max_steps: int = 100_000) -> dict[str, list]:
    """Step an engine until it is idle; events per request id."""
    events: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished:
            return events
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
    raise AssertionError("engine did not finish")


def hold_as_stored(model, plan, embed: str | None = None, head: str | None = None):
    """The model with its decoder linears swapped for the engine's weight modules per tensor, as the loader holds a
    file that stores tensors in different formats (llama.cpp's Q4_K_M mix): plan(layer, name) -> "float32" |
    "bfloat16" | "int8" | "int4" (name: q_proj ... down_proj), or one format for all. embed: a QuantizedEmbedding of
    its own in that format; head: the LM head's format. Norms stay float32. Returns the model (changed in place)."""
    from engine.model.quantized import QuantizedEmbedding, make_weight_module

    def swap(module, fmt: str):
        return module if fmt == "float32" else make_weight_module(module.weight.detach().float(), module.bias, fmt)

    choose = plan if callable(plan) else (lambda _layer, _name: plan)
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                  (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):  # fmt: skip
                for name in names:
                    setattr(parent, name, swap(getattr(parent, name), choose(index, name)))
        if embed is not None:
            model.model.embed_tokens = QuantizedEmbedding.from_float(model.model.embed_tokens.weight.float(), embed)
        if head is not None:
            model.config.tie_word_embeddings = False
            model.lm_head = swap(model.lm_head, head)
    return model.requires_grad_(False)


def make_tiny_as_stored(folder: Path, fmt: str = "int4"):
    """The tiny Llama as the loader holds a quantized file: float32 norms, every decoder linear and the LM head an
    engine weight module in `fmt` (int8, int4, bfloat16), the embedding a QuantizedEmbedding. For tests of code that
    runs such models before a GGUF file is involved."""
    from transformers import AutoModelForCausalLM

    from engine.load.quantize_model import quantize_model

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    quantize_model(model, fmt)
    return model.eval()
