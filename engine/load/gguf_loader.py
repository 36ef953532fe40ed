"""A GGUF file into a transformers model, tensor by tensor, never the whole model in float32: the model is built on the
meta device from the file's metadata, then each stored tensor becomes its module's weight in the format the load plan
gives it (weight_plan.py), and the file's pages it touched are dropped from this process before the next. The layers'
matrices start converting in a background thread (Prefetch) as soon as the header is read, while the loader imports
transformers' model code, checks memory and reads the tokenizer."""

from __future__ import annotations

import contextlib
import logging
import mmap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from engine.core import openmp
from engine.errors import ModelFormatError
from engine.load import gguf_blocks, native
from engine.load.gguf_header import GGUFHeader, TensorEntry
from engine.load.gguf_metadata import read_config
from engine.load.joined import JoinedBuffers, Slot
from engine.load.memory import release_freed_memory
from engine.load.options import ResolvedOptions
from engine.load.weight_plan import FLOAT32, INT4, INT8, FormatTally, LoadPlan, Mode, Role, TensorPlan, plan_load
from engine.model import fast_forward, int4pack, llama_family
from engine.model.quantized import (
    CHUNK_ROW_MULTIPLE,
    WEIGHT_MODULES,
    HalfLinear,
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    int4_groups_from_float,
    int8_rows_from_float,
)

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
CHUNK_VALUES = 1 << 24  # float32 values decoded at a time (64 MB): a 150k-row LM head is never whole in float32
PROGRESS_EVERY_S = 0.5
TRIM_AFTER_VALUES = 1 << 20
PREFETCH_FREE_FACTOR = 2  # converting ahead of the memory check only where twice the file's weights are free
PREFETCH_JOIN_S = 60.0  # one tensor's conversion: well under a second on two cores, for the largest models' rows


@dataclass
class GGUFModel:
    model: nn.Module
    plan: LoadPlan
    tally: FormatTally
    seconds: float


def matrix_kinds(header: GGUFHeader) -> set[GGMLQuantizationType]:
    return {t.kind for t in header.tensors if len(t.shape) >= 2 and t.name.endswith(".weight")}


def plan_for(header: GGUFHeader, options: ResolvedOptions) -> LoadPlan:
    float32_bytes = sum(4 * t.rows * t.shape[-1] for t in header.tensors if t.shape)
    return plan_load(options, matrix_kinds(header), float32_bytes)


def build_empty(config, dtype: torch.dtype) -> nn.Module:
    """The model on the meta device (parameters only: buffers such as rotary frequencies are real). A Llama-family
    model is built from the engine's own modules, without transformers' modeling code (llama_family.py); others are
    transformers'."""
    if llama_family.unsupported_reason(config) is None:
        return llama_family.LlamaFamilyForCausalLM(config)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
        except (ValueError, KeyError) as exc:
            raise ModelFormatError(f"transformers has no causal language model for this file: {exc}") from None


def load_gguf(
    header: GGUFHeader,
    options: ResolvedOptions,
    progress: Progress | None = None,
    config=None,
    model: nn.Module | None = None,
    prefetch: Prefetch | None = None,
) -> GGUFModel:
    """The file's model, filled tensor by tensor. config, model: the file's config and the model built empty from it
    in the plan's dtype (build_empty), when the caller has them already; prefetch: the conversions started for it."""
    started = time.perf_counter()
    plan = plan_for(header, options)
    config = config or read_config(header)
    model = model if model is not None else build_empty(config, plan.dtype)
    joined = prefetch.joined if prefetch else joined_for(header, options, plan)
    builder = _Builder(header, model, config, plan, options, prefetch.finish() if prefetch else {}, joined)
    builder.run(progress)
    model.eval()
    model.requires_grad_(False)
    if options.device != "cpu":
        model.to(options.device)  # the buffers built on the CPU (rotary frequencies); weights went there one by one
    release_freed_memory()
    seconds = time.perf_counter() - started
    log.info("read %s in %.1fs: %s", header.path.name, seconds, builder.tally.describe())
    return GGUFModel(model, plan, builder.tally, seconds)


def joined_for(header: GGUFHeader, options: ResolvedOptions, plan: LoadPlan) -> JoinedBuffers | None:
    """The file's joint buffers, where the lean forward joins matrices as stored on the CPU (transformers' forward
    would copy a part's strided scales on every call)."""
    if options.device != "cpu" or plan.mode is not Mode.AS_STORED:
        return None
    if header.architecture not in fast_forward.SUPPORTED_TYPES:
        return None
    quantization = options.quantization
    joined = JoinedBuffers(header, lambda entry: plan.tensor(entry.kind, entry.shape, Role.LINEAR, quantization))
    return joined if len(joined) else None


class Prefetch:
    """The file's layer matrices converted in a background thread from the moment the header is read, while the
    loader imports transformers, reads the config, checks memory and reads the tokenizer (Python, holding the GIL:
    one core); the C++ conversions release the GIL and use the other. The builder takes what is done once the model
    is built (finish) and converts the rest itself, the same way (weight_module) and into the same joint buffers
    (joined.py), so the result does not depend on how far this got.
    Only where converting ahead of the memory check is safe: on the CPU, with twice the file's weights free; a model
    refused by the check has its conversions dropped (cancel)."""

    def __init__(self, header: GGUFHeader, options: ResolvedOptions, plan: LoadPlan) -> None:
        """Starts converting; see start() for where that is wanted."""
        self.header, self.options, self.plan = header, options, plan
        self.done: dict[str, nn.Module] = {}
        self.joined = joined_for(header, options, plan)  # shared with the builder, which fills the rest
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gguf-prefetch", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, header: GGUFHeader, options: ResolvedOptions, free: int) -> Prefetch | None:
        """Started for this file, or None where it does not pay or is not safe. free: the memory free before it (the
        loader's memory check uses the same figure: what this converts is the model's own)."""
        if options.device != "cpu" or free < PREFETCH_FREE_FACTOR * header.weight_bytes:
            return None
        plan = plan_for(header, options)
        if plan.mode is not Mode.AS_STORED or not native.available():
            return None
        return cls(header, options, plan)

    def _wanted(self, entry: TensorEntry) -> TensorPlan | None:
        """A layer's matrix to convert ahead: a quantized format from the file's blocks (q and k rows of some
        architectures are reordered by the model's name map, which needs the model: those wait for the builder)."""
        if len(entry.shape) != 2 or not entry.name.startswith("blk.") or not entry.name.endswith(".weight"):
            return None
        if ".attn_q." in entry.name or ".attn_k." in entry.name:
            return None
        plan = self.plan.tensor(entry.kind, entry.shape, Role.LINEAR, self.options.quantization)
        return plan if plan.fmt in (INT4, INT8) else None

    def _run(self) -> None:
        openmp.limit_this_thread(1)  # one core: the loader's Python work holds the other
        self._convert()

    def _convert(self) -> None:
        try:
            with _mapped(self.header) as data:
                for entry in self.header.tensors:
                    if self._stop.is_set():
                        break
                    plan = self._wanted(entry)
                    if plan is None:
                        continue
                    into = self.joined.slot(entry.name) if self.joined is not None else None
                    rows = _stored_rows(data, entry)
                    self.done[entry.name] = weight_module(rows, entry.kind, plan, self.plan.mode, into=into)
                    _drop_pages(data, entry.offset, entry.nbytes)
        except Exception as exc:  # the builder converts what is missing and meets any error itself
            log.debug("converting %s ahead stopped: %s", self.header.path.name, exc)

    def finish(self) -> dict[str, nn.Module]:
        """Stop after the tensor in hand; what is converted, by GGUF tensor name."""
        self._stop.set()
        self._thread.join(timeout=PREFETCH_JOIN_S)
        if self._thread.is_alive():
            log.warning("converting %s ahead did not stop within %.0f s", self.header.path.name, PREFETCH_JOIN_S)
        log.info("%d matrices of %s were converted ahead of the build", len(self.done), self.header.path.name)
        return dict(self.done)

    def cancel(self) -> None:
        """Stop and let go of what was converted (the model will not be loaded, or has taken what it used)."""
        if self._thread.is_alive():
            self.finish()
        self.done.clear()


class _Builder:
    def __init__(
        self,
        header: GGUFHeader,
        model: nn.Module,
        config,
        plan: LoadPlan,
        options: ResolvedOptions,
        prefetched: dict[str, nn.Module] | None = None,
        joined: JoinedBuffers | None = None,
    ) -> None:
        self.header, self.model, self.config, self.plan, self.options = header, model, config, plan, options
        self.prefetched = prefetched or {}  # GGUF tensor name -> its linear, converted ahead (Prefetch)
        self.joined = joined  # where a matrix the lean forward joins is written (joined.py)
        self.device = torch.device(options.device)
        self.tally = FormatTally()
        self.head = model.get_output_embeddings()
        self.embedding = model.get_input_embeddings()
        self.tied = header.tensor("output.weight") is None and bool(getattr(config, "tie_word_embeddings", False))
        self.names, self.processor = _name_map(model, config, header)
        self.biases: dict[str, torch.Tensor] = {}  # linears' biases read before their weights

    # ---- the pass over the file -------------------------------------------------------------------------------
    def run(self, progress: Progress | None) -> None:
        with _mapped(self.header) as data:
            self._read_all(data, progress)
        self._finish()

    def _read_all(self, data: mmap.mmap, progress: Progress | None) -> None:
        last = 0.0
        for index, entry in enumerate(self.header.tensors):
            name = self.names.get(entry.name)
            if name is None:
                log.debug("%s: no place for tensor %s in the model; skipped", self.header.path.name, entry.name)
                continue
            if progress and time.perf_counter() - last > PROGRESS_EVERY_S:
                progress(f"reading {self.header.path.name}: tensor {index + 1} of {len(self.header.tensors)}")
                last = time.perf_counter()
            self._place(name, entry, _stored_rows(data, entry))
            _drop_pages(data, entry.offset, entry.nbytes)
            if entry.rows * entry.shape[-1] >= TRIM_AFTER_VALUES and not self._written_as_stored(entry):
                release_freed_memory()  # the decoding's temporaries, before they pile up in the heap

    def _place(self, name: str, entry: TensorEntry, raw: torch.Tensor) -> None:
        module_name, _, attr = name.rpartition(".")
        module = self.model.get_submodule(module_name)
        if attr == "weight" and module is self.embedding:
            self._embedding(entry, raw)
        elif attr == "weight" and module is self.head:
            self.model.set_output_embeddings(self._weight_module(entry, raw, Role.HEAD, None))
        elif attr == "weight" and isinstance(module, nn.Linear):
            bias = self.biases.pop(module_name, None)
            _set_module(self.model, module_name, self._weight_module(entry, raw, Role.LINEAR, bias))
        else:
            self._other(module_name, module, attr, entry, raw)

    def _written_as_stored(self, entry: TensorEntry) -> bool:
        """Whether the C++ decoders write this tensor straight into its int4/int8 format: no float32 temporaries for
        the heap to give back (a trim after each of a 3B model's 250 matrices took 0.2-0.3 s of its start)."""
        if not _native(entry.kind) or len(entry.shape) != 2:
            return False
        fmt = self._plan(entry, Role.LINEAR).fmt
        return fmt == INT8 or (fmt == INT4 and entry.kind in gguf_blocks.INT4_TYPES and int4pack.layout() is not None)

    # ---- weights ----------------------------------------------------------------------------------------------
    def _plan(self, entry: TensorEntry, role: Role) -> TensorPlan:
        return self.plan.tensor(entry.kind, entry.shape, role, self.options.quantization)

    def _rows(self, entry: TensorEntry, raw: torch.Tensor) -> torch.Tensor:
        """The stored rows in the model's order (Llama files permute the rows of q and k for llama.cpp's rotary)."""
        order = self._row_order(entry)
        return raw if order is None else raw[order]

    def _row_order(self, entry: TensorEntry) -> torch.Tensor | None:
        if self.processor is None or not (".attn_q." in entry.name or ".attn_k." in entry.name):
            return None
        index = np.arange(entry.rows, dtype=np.float32).reshape(entry.rows, 1)
        result = self.processor.process(weights=index, name=entry.name, tensor_key_mapping={}, parsed_parameters={})
        return torch.from_numpy(np.asarray(result.weights).reshape(-1).astype(np.int64))

    def _float(self, entry: TensorEntry, raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return decode(self._rows(entry, raw), entry.kind, dtype, self.device).view(entry.shape)

    def _weight_module(self, entry: TensorEntry, raw: torch.Tensor, role: Role, bias: torch.Tensor | None):
        plan = self._plan(entry, role)
        ahead = self.prefetched.pop(entry.name, None) if role is Role.LINEAR else None
        if ahead is not None and self._row_order(entry) is None:
            module = ahead
            module.bias = None if bias is None else bias.detach().float().contiguous()  # as the constructors hold it
        else:
            into = self.joined.slot(entry.name) if self.joined is not None and role is Role.LINEAR else None
            module = weight_module(self._rows(entry, raw), entry.kind, plan, self.plan.mode, bias, self.device, into)
        self.tally.add(plan, plan.nbytes(entry.rows, entry.shape[-1]))
        return module

    def _embedding(self, entry: TensorEntry, raw: torch.Tensor) -> None:
        scale = getattr(self.embedding, "embed_scale", None)
        if self.tied:  # the head is these same bytes: built once, as the head
            head = self._weight_module(entry, raw, Role.HEAD, None)
            self.model.set_output_embeddings(head)
            if isinstance(head, nn.Linear):
                self.embedding.weight = head.weight
            elif isinstance(head, Int4Linear) and int4pack.layout() is None:
                # rows cannot be read back from this torch's packing: the embedding keeps an int8 copy of its own
                self.model.set_input_embeddings(QuantizedEmbedding.from_float(head.dequantize(), INT8, scale))
            else:
                self.model.set_input_embeddings(QuantizedEmbedding(head, scale))
            return
        module = self._weight_module(entry, raw, Role.EMBEDDING, None)
        if isinstance(module, nn.Linear):
            self.embedding.weight = module.weight
        else:
            if isinstance(module, Int4Linear) and int4pack.layout() is None:
                module = Int8Linear(module.dequantize(), None)
            embedding = QuantizedEmbedding(module, scale)
            embedding.owned = module
            self.model.set_input_embeddings(embedding)

    # ---- norms, biases and the rest ---------------------------------------------------------------------------
    def _other(self, module_name: str, module: nn.Module, attr: str, entry: TensorEntry, raw: torch.Tensor) -> None:
        plan = self._plan(entry, Role.OTHER)
        values = self._float(entry, raw, torch.float32).cpu()
        if self.processor is not None:  # as transformers' GGUF loading does (Llama: q and k biases un-permuted too)
            result = self.processor.process(weights=values.numpy(), name=entry.name, tensor_key_mapping={},
                                            parsed_parameters={"tensors": {}})  # fmt: skip
            values = torch.from_numpy(np.ascontiguousarray(result.weights))
        values = values.to(self.device, getattr(torch, plan.fmt))
        self.tally.add(plan, values.numel() * values.element_size())
        if isinstance(module, WEIGHT_MODULES):
            module.bias = values.float()  # a weight module's bias is a float32 buffer
        elif isinstance(module, nn.Linear) and attr == "bias" and module.weight.is_meta:
            self.biases[module_name] = values  # its weight comes later and takes it
        else:
            setattr(module, attr, nn.Parameter(values, requires_grad=False))

    def _finish(self) -> None:
        if self.biases:
            raise ModelFormatError(f"{self.header.path.name} has biases without weights: {', '.join(self.biases)}")
        head = self.model.get_output_embeddings()
        if isinstance(head, nn.Linear) and head.weight.is_meta and not self.tied:
            raise ModelFormatError(f"{self.header.path.name} has no output.weight and its config does not tie it")
        missing = [name for name, p in [*self.model.named_parameters(), *self.model.named_buffers()] if p.is_meta]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise ModelFormatError(f"{self.header.path.name} lacks tensors the model needs: {shown}")


def _native(kind: GGMLQuantizationType) -> bool:
    """The C++ decoders take this type (and are built here)."""
    return kind in gguf_blocks.DECODED and native.available()


def decode(rows: torch.Tensor, kind: GGMLQuantizationType, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """Stored rows [R, bytes] -> [R, K] in `dtype` on `device`, a chunk of rows at a time (a 150k-row LM head is
    never whole in float32)."""
    count = rows.shape[0]
    columns = _columns(rows, kind)
    out = torch.empty(count, columns, dtype=dtype, device=device)
    step = max(1, CHUNK_VALUES // columns)
    on_device = torch.device(device).type != "cpu" and kind in gguf_blocks.DECODED
    decoder = native.dequantize if not on_device and _native(kind) else gguf_blocks.dequantize
    for start in range(0, count, step):
        chunk = rows[start : start + step]
        if on_device:  # a GPU decodes its own copy of the bytes: the torch decoders run there, many times faster
            chunk = chunk.to(device, non_blocking=False)
        out[start : start + step] = decoder(chunk, kind).to(dtype)
    return out


def _columns(rows: torch.Tensor, kind: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return rows.shape[1] // size * block


def _row_chunks(rows: torch.Tensor, columns: int):
    """Consecutive row slices of about CHUNK_VALUES values, each a multiple of CHUNK_ROW_MULTIPLE rows but the last."""
    step = max(CHUNK_ROW_MULTIPLE, CHUNK_VALUES // columns // CHUNK_ROW_MULTIPLE * CHUNK_ROW_MULTIPLE)
    for start in range(0, rows.shape[0], step):
        yield rows[start : start + step]


def _int8_rows(rows: torch.Tensor, kind: GGMLQuantizationType, columns: int, bias, into: Slot | None) -> Int8Linear:
    """Decode a chunk of rows to float32, requantize it per row into the preallocated module, next chunk."""
    if _native(kind):  # one pass a row, no float32 chunk
        if into is not None and into.fmt == INT8:  # into its rows of a joint buffer
            native.int8_rows_into(rows, kind, into.first, into.second)
            return Int8Linear.from_rows(into.first, into.second, bias)
        return Int8Linear.from_rows(*native.int8_rows(rows, kind), bias)
    q = torch.empty(rows.shape[0], columns, dtype=torch.int8)
    scale = torch.empty(rows.shape[0])
    start = 0
    for chunk in _row_chunks(rows, columns):
        q[start : start + chunk.shape[0]], scale[start : start + chunk.shape[0]] = int8_rows_from_float(
            gguf_blocks.dequantize(chunk, kind)
        )
        start += chunk.shape[0]
    return Int8Linear.from_rows(q, scale, bias)


def weight_module(
    rows: torch.Tensor,
    kind: GGMLQuantizationType,
    plan: TensorPlan,
    mode: Mode,
    bias: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    into: Slot | None = None,
) -> nn.Module:
    """A linear's module from its stored rows [out, bytes] (in the model's row order), in the plan's format: Q4 codes
    as stored in an Int4Linear, int8 rows, a 16-bit HalfLinear, or a plain nn.Linear (dense models, F32). into: its
    rows of a joint buffer (joined.py), where the C++ decoders write int4 and int8 ones."""
    columns = _columns(rows, kind)
    if plan.fmt == INT4:
        layout = int4pack.layout()
        if kind in gguf_blocks.INT4_TYPES and layout is not None and _native(kind):  # codes into torch's packing
            if into is not None and into.fmt == INT4:
                native.int4_pack_into(rows, kind, layout.block, layout.split, into.first, into.second)
                return Int4Linear.from_packed(into.first, into.second, rows.shape[0], columns, bias)
            packed, scales_and_zeros = native.int4_pack(rows, kind, layout.block, layout.split)
            return Int4Linear.from_packed(packed, scales_and_zeros, rows.shape[0], columns, bias)
        if kind in gguf_blocks.INT4_TYPES:  # the file's own codes
            chunks = (gguf_blocks.int4_groups(chunk, kind) for chunk in _row_chunks(rows, columns))
        else:
            chunks = (int4_groups_from_float(gguf_blocks.dequantize(c, kind)) for c in _row_chunks(rows, columns))
        return Int4Linear.from_row_chunks(rows.shape[0], columns, chunks, bias)
    if plan.fmt == INT8:
        return _int8_rows(rows, kind, columns, bias, into)
    dtype = getattr(torch, plan.fmt)
    weight = decode(rows, kind, dtype, device)
    if mode is Mode.AS_STORED and plan.fmt != FLOAT32:
        return HalfLinear(weight, bias, dtype)
    module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    module.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        module.bias = nn.Parameter(bias.to(device, dtype), requires_grad=False)
    return module


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _name_map(model: nn.Module, config, header: GGUFHeader):
    """GGUF tensor name -> the model's parameter name (gguf's own name table for the file's architecture, as
    transformers' GGUF loading uses it, built once), and transformers' tensor processor for the architecture (its
    Llama one un-permutes q and k rows) or None when it has none."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = next((key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == header.architecture), None)
    if arch is None:
        raise ModelFormatError(f"{header.path.name}: architecture {header.architecture!r} is unknown to gguf")
    table = gguf.get_tensor_name_map(arch, config.get_text_config().num_hidden_layers)
    processor_class = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)
    processor = processor_class(config=config.to_dict())
    names: dict[str, str] = {}
    for hf_name in model.state_dict():
        base, _, suffix = processor.preprocess_name(hf_name).rpartition(".")
        parts = base.split(".")
        for start in range(len(parts)):  # "model.layers.0.mlp.up_proj", then "layers.0.mlp.up_proj"...
            gguf_name = table.get_name(".".join(parts[start:]))
            if gguf_name is not None:
                names.setdefault(f"{gguf_name}.{suffix}", hf_name)
                break
    return names, (None if processor_class is TensorProcessor else processor)


@contextlib.contextmanager
def _mapped(header: GGUFHeader) -> Iterator[mmap.mmap]:
    """The file mapped read-only, for the builder and the conversions ahead (each its own mapping)."""
    with header.path.open("rb") as handle:
        data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield data
    finally:
        with contextlib.suppress(BufferError):  # a failed tensor's views still exist: the collector closes it
            data.close()


def _stored_rows(data: mmap.mmap, entry: TensorEntry) -> torch.Tensor:
    """A tensor's bytes in the mapping, as [rows, bytes per row] (no copy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only mapping: torch warns, and we never write to it
        raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8, count=entry.nbytes, offset=entry.offset))
    return raw.view(entry.rows, entry.row_bytes)


def _drop_pages(data: mmap.mmap, offset: int, length: int) -> None:
    """Tell the kernel this process is done with these pages of the file: they leave its resident memory (the page
    cache keeps them for the next load)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or length <= 0:
        return
    page = mmap.PAGESIZE
    start = offset // page * page
    with contextlib.suppress(OSError, ValueError):  # not supported here: the pages stay until the mapping closes
        data.madvise(advice, start, min(len(data), offset + length) - start)
