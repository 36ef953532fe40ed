"""Memory estimate before loading: weight bytes for a dtype/quantization, KV bytes per token, free memory."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from engine.errors import ModelTooLargeError
from engine.load import kv_policy
from engine.load.estimate import MemoryEstimate, ModelShape, format_bytes
from engine.load.gguf_header import GGUFHeader
from engine.load.options import ResolvedOptions, element_size
from engine.load.weight_plan import FormatTally, Mode, Role
from engine.model import llama_family
from engine.model.geometry import attention_geometry

# bitsandbytes 4-bit keeps one float32 absmax per block of 64 weights; int8 one float32 scale per row.
_NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64


def model_shape(config, model: nn.Module | None = None) -> ModelShape:
    """Count parameters by building the model on the meta device (no weight is allocated), or on `model`, already
    built so (the loader's, before it fills it)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    geometry = attention_geometry(config)
    if model is None and llama_family.unsupported_reason(config) is None:
        model = llama_family.LlamaFamilyForCausalLM(config)  # the same parameters, without transformers' modeling code
    if model is None:
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config)
    # from_config leaves tied embeddings untied on the meta device (and tying inside the context is undone)
    model.tie_weights()
    parameters = sum(p.numel() for p in model.parameters())
    output = model.get_output_embeddings()
    quantizable = rows = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not output:
            quantizable += module.weight.numel()
            rows += module.out_features
    return ModelShape(
        architecture=(config.architectures or [getattr(model, "architecture", type(model).__name__)])[0],
        num_layers=geometry.num_layers,
        num_kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim,
        context_length=getattr(text, "max_position_embeddings", 0) or 0,
        parameters=parameters,
        quantizable_parameters=quantizable,
        quantizable_rows=rows,
        hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "intermediate_size", 0) or 4 * text.hidden_size,
        num_heads=geometry.num_heads,
        vocab_size=getattr(text, "vocab_size", 0) or 0,
        tied_embeddings=output is not None and output.weight is model.get_input_embeddings().weight,
        engine_modules=isinstance(model, llama_family.LlamaFamilyForCausalLM),
    )


def estimate(shape: ModelShape, options: ResolvedOptions) -> MemoryEstimate:
    elem = element_size(options.dtype)
    plain = shape.parameters - shape.quantizable_parameters
    if options.quantization == "int8":
        weights = plain * elem + shape.quantizable_parameters + shape.quantizable_rows * 4
    elif options.quantization in ("nf4", "fp4"):
        weights = plain * elem + int(shape.quantizable_parameters * _NF4_BYTES_PER_WEIGHT)
    else:
        weights = shape.parameters * elem
    if options.engine_quantized:  # the loader quantizes each linear; the embedding is int8 rows unless tied
        weights = _engine_quantized_bytes(shape, options.quantization)
    kv = kv_policy.kv_dtype(options.device, options.dtype, options.engine_quantized)
    return MemoryEstimate(
        shape=shape,
        dtype=options.dtype_name,
        quantization=options.quantization,
        weight_bytes=int(weights),
        kv_bytes_per_token=shape.kv_bytes_per_token(element_size(kv)),
        engine_copy_bytes=engine_copy_bytes(shape, options),
        runtime_bytes=runtime_bytes(shape, options.device, engine_modules=False),  # folders load transformers'
        kv_dtype=str(kv).removeprefix("torch."),
    )


def _engine_quantized_bytes(shape: ModelShape, quantization: str) -> int:
    """What quantize_model holds: the decoder's linears and the LM head in the format, an untied embedding in int8
    rows of its own (a tied one shares the head's bytes), everything else float32."""
    from engine.load.weight_plan import TensorPlan

    plan = TensorPlan(quantization, "")
    vocab, hidden = shape.vocab_size, shape.hidden_size
    embeddings = vocab * hidden * (1 if shape.tied_embeddings else 2)
    other = max(0, shape.parameters - shape.quantizable_parameters - embeddings)
    linear, rows = shape.quantizable_parameters, shape.quantizable_rows
    # the decoder's linears (int4 pads each one's rows to 16, which their widths always are)
    linear_bytes = linear // 2 + linear // 32 * 4 if quantization == "int4" else linear + rows * 2
    head = plan.nbytes(vocab, hidden)
    own_embedding = 0 if shape.tied_embeddings else TensorPlan("int8", "").nbytes(vocab, hidden)
    return linear_bytes + head + own_embedding + other * 4


def estimate_gguf(header: GGUFHeader, options: ResolvedOptions, shape: ModelShape | None = None) -> MemoryEstimate:
    """What loading this file with these options will hold: each tensor in the format the load plan gives it (the
    bytes the loader allocates), the KV cache per token in its dtype, and the runtime around them. shape: the model's,
    when the caller has it (else read from the file's config)."""
    from engine.load.gguf_loader import plan_for
    from engine.load.gguf_metadata import read_config

    plan = plan_for(header, options)
    shape = shape or model_shape(read_config(header))
    tied = header.tensor("output.weight") is None
    tally = FormatTally()
    for entry in header.tensors:
        if entry.name == "token_embd.weight":
            role = Role.HEAD if tied else Role.EMBEDDING
        elif entry.name == "output.weight":
            role = Role.HEAD
        else:
            role = Role.LINEAR if len(entry.shape) >= 2 else Role.OTHER
        tensor = plan.tensor(entry.kind, entry.shape, role, options.quantization)
        tally.add(tensor, tensor.nbytes(entry.rows, entry.shape[-1]))
    as_stored = plan.mode is Mode.AS_STORED
    kv = kv_policy.kv_dtype(options.device, plan.dtype, as_stored)
    copies = 0 if as_stored else engine_copy_bytes(shape, options)
    formats = [fmt for fmt in tally.formats_by_bytes if fmt != "float32"]
    return MemoryEstimate(
        shape=shape,
        dtype=str(plan.dtype).removeprefix("torch."),
        quantization="+".join(formats) if as_stored and formats else "none",
        weight_bytes=tally.nbytes,
        kv_bytes_per_token=shape.kv_bytes_per_token(element_size(kv)),
        engine_copy_bytes=copies,
        runtime_bytes=runtime_bytes(shape, options.device, shape.engine_modules),
        weight_formats=tally.describe(),
        kv_dtype=str(kv).removeprefix("torch."),
    )


# What a studio process holds besides weights and KV, measured on this project's machines after a load (VmRSS):
# Python with torch, transformers and the engine imported, the tokenizer (grows with the vocabulary), and a step's
# activations and logits at the CPU's step budget (grow with the widths and the vocabulary).
# (380 MiB: the middle of what fresh processes held on CPUs with and without AVX-512: the embedded model's engine
# held ~1,525 MiB on an AVX-512 Xeon and ~1,675 MiB with torch and oneDNN held to AVX2, where 348 left the estimate
# 7.7 % under it, and 12.7 % on a loaded machine; a 0.5B model's ran from 884 to 973 MiB between runs)
RUNTIME_BASE = 380 * 1024**2
# of which transformers' modeling code and the torch._dynamo it imports, absent where a model is built from the
# engine's own modules (measured: 88 MiB of a fresh process's VmRSS; a 0.5B Q4_1 file's engine then held 807 MiB
# against 900 before, the estimate 951)
TRANSFORMERS_MODELING_BYTES = 88 * 1024**2
RUNTIME_PER_VOCAB_TOKEN = 1_200
STEP_ROWS = 256


def runtime_bytes(shape: ModelShape, device: str, engine_modules: bool) -> int:
    """engine_modules: the model is built from the engine's modules (no transformers modeling code is imported)."""
    base = RUNTIME_BASE - (TRANSFORMERS_MODELING_BYTES if engine_modules else 0)
    if device != "cpu":
        return base  # activations live on the device; this is host memory
    widths = shape.hidden_size * 4 + shape.intermediate_size * 3 + shape.num_heads * shape.head_dim * 2
    activations = STEP_ROWS * widths * 4
    return base + shape.vocab_size * RUNTIME_PER_VOCAB_TOKEN + activations


def check_fits(estimate: MemoryEstimate, name: str, device: str, kv_budget_bytes: int, free: int | None = None) -> None:
    """Refuse, before anything is allocated, a model that cannot fit in the memory free now (or `free`, taken before
    the loader began): one line with what it needs and what would fit instead (a 4-bit format, a smaller KV budget)."""
    free = free_memory_bytes(device) if free is None else free
    if not free:
        return  # unknown here: nothing to check against
    needed = estimate.total_bytes(kv_budget_bytes)
    if needed <= free:
        return
    where = "GPU memory" if device == "cuda" else "RAM"
    hints = []
    without_kv = needed - kv_budget_bytes
    if without_kv + estimate.kv_bytes_per_token * 4096 <= free:
        hints.append(f"a KV budget of {format_bytes(max(0, free - without_kv) * 0.9)} or less would fit")
    if estimate.quantization not in ("int4",) and "int4" not in estimate.quantization.split("+"):
        hints.append("a 4-bit model (a Q4_K_M GGUF file, or --quant int4) needs about a quarter of float32's bytes")
    raise ModelTooLargeError(
        f"{name} needs about {format_bytes(needed)} ({format_bytes(estimate.weight_bytes)} of weights, "
        f"{format_bytes(kv_budget_bytes)} of KV cache, {format_bytes(estimate.runtime_bytes)} of runtime) but only "
        f"{format_bytes(free)} of {where} is free" + (f": {'; '.join(hints)}" if hints else "")
    )


def engine_copy_bytes(shape: ModelShape, options: ResolvedOptions) -> int:
    """The engine's copies of a float32 model on a CPU under an automatic dtype, as the weight-format measurement
    leaves them where bfloat16 wins at every batch size (AVX-512 with bfloat16, measured): bfloat16 copies of the
    decoder's linears, and the LM head prepacked in float32 plus its bfloat16 copy. Where float32 also wins some batch
    sizes, its prepacked linears stay too (4 bytes a weight more). Models held as stored get no copies."""
    if options.device != "cpu" or options.dtype != torch.float32 or options.quantization != "none":
        return 0
    linear, other = shape.quantizable_parameters, shape.parameters - shape.quantizable_parameters
    if not options.dtype_auto:
        return int(4 * (linear + other))  # an explicit float32: prepacked float32 copies of the linears and head
    return int(2 * linear + 6 * other)


# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# what glibc's own adjustment settles at once a block of its maximum has been freed (every load frees several): blocks
# from 32 MiB are mapped on their own, and up to 64 MiB free at the heap's top is kept for the next allocation
_SETTLED_MMAP_THRESHOLD, _SETTLED_TRIM_THRESHOLD = 32 << 20, 64 << 20
_LOADING_THRESHOLD = 1 << 30


@contextlib.contextmanager
def heap_reused_while_loading() -> Iterator[None]:
    """While a model loads, freed blocks stay in the heap for the next ones, instead of each big temporary being
    mapped fresh and unmapped when freed. Every fresh page costs a fault on first touch, and in a virtual machine
    that cost is large: the largest head's row norms took 0.47 s in 4 KiB faults, and 0.03 s with the blocks
    reused. On leaving, what is free goes back to the OS (the estimate counts only what the model holds), and the
    thresholds are left where glibc's own adjustment would have put them."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _LOADING_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, _LOADING_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_TRIM_THRESHOLD, _SETTLED_TRIM_THRESHOLD)
            libc.mallopt(_M_MMAP_THRESHOLD, _SETTLED_MMAP_THRESHOLD)
            libc.malloc_trim(0)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # musl and others: their allocators are theirs
        return None


def release_freed_memory() -> None:
    """Hand the heap memory freed by the load's temporaries back to the OS (glibc keeps it otherwise: a 0.5B model's
    resident memory measured 220 MB higher without this)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def free_memory_bytes(device: str) -> int:
    """Memory available for weights and KV cache on the device (RAM for cpu and mps): the machine's, or less where
    this process's cgroup (a container, a systemd slice, a 16 GiB memory cgroup) allows less."""
    if device == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    machine = _machine_available()  # 0: unknown
    headroom = cgroup_headroom()
    if headroom is None:
        return machine
    # a cgroup at its limit has 1 byte free, not 0: 0 means "unknown" to the memory check, which would then pass
    return max(1, min(machine, headroom) if machine else headroom)


def _machine_available() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def cgroup_headroom() -> int | None:
    """What this process's memory cgroup and those above it still let it take (the tightest limit less what is in
    use, page cache counted as reclaimable), or None where none limits it (no cgroup, or no memory limit)."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v2: "0::/path"; v1: "4:memory:/path"
        _id, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            return _tightest(CGROUP_ROOT, path, "memory.max", "memory.current", "file")
        if "memory" in controllers.split(","):
            return _tightest(CGROUP_ROOT / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", "cache")
    return None


def _tightest(root: Path, path: str, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    folder, tightest = root / path.strip("/"), None
    while True:
        with contextlib.suppress(OSError, ValueError):
            limit = (folder / limit_file).read_text().strip()
            if limit != "max" and int(limit) < NO_LIMIT:
                usage = int((folder / usage_file).read_text())
                stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines() if " " in line)
                room = int(limit) - usage + int(stat.get(cache_key, 0))
                tightest = room if tightest is None else min(tightest, room)
        if folder == root or root not in folder.parents:
            return tightest
        folder = folder.parent
