"""Paged attention plugged into transformers' AttentionInterface: write new K/V by slot, attend over pages."""

from __future__ import annotations

import math
import mmap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTENTION_NAME = "studio_paged"


# below this a KV cache is zeroed at once: a few pages' faults are nothing, and the heap serves small ones better
LAZY_FROM_BYTES = 4 << 20


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor whose memory, on the CPU, is committed page by page as it is first written: anonymous memory
    the kernel maps zeroed on first touch. A KV cache is sized for the longest contexts, most of it is never used,
    and zeroing it at start faulted in every page: 0.1-0.9 s for a 3B model's 600 MB here (the first touch of memory
    costs most in a virtual machine), and its whole size resident while idle."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < LAZY_FROM_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    if hasattr(mmap, "MAP_PRIVATE"):  # private, as the heap's own big blocks: Python's default is shared memory
        memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (shmem, and slower to fault in)
    else:  # Windows: pagefile-backed, also zero until written
        memory = mmap.mmap(-1, nbytes)
    return torch.frombuffer(memory, dtype=dtype).view(shape)  # the tensor keeps the mapping alive


class PagedKVCache:
    """The page pool's tensors: per layer, keys and values laid out [kv_heads, pages, page_size, head_dim].

    Head-major pages make a gather of whole pages land directly in the [kv_heads * seqs, tokens, head_dim]
    shape that batched matmuls want, with no extra permute copy."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_pages = num_pages
        self.page_size = page_size
        shape = (num_layers, 2, num_kv_heads, num_pages, page_size, head_dim)
        self.storage = zeroed(shape, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.storage[index, 0], self.storage[index, 1]


@dataclass
class PrefillSlice:
    """A chunk of several query tokens of one sequence, at rows [q_start, q_start + q_len) of the packed batch."""

    q_start: int
    q_len: int
    context_len: int  # tokens attended to, this chunk included
    page_index: torch.Tensor | None  # pages to gather, or None when the chunk is the whole context


@dataclass
class StepContext:
    """Per-step attention metadata shared by every layer (built once by the runner)."""

    cache: PagedKVCache
    slot_mapping: torch.Tensor  # [N] slot of every packed token
    num_decode: int  # the first num_decode rows are single-token sequences
    decode_page_index: torch.Tensor | None  # [num_decode * max_pages] page ids, padded
    decode_context_lens: torch.Tensor | None  # [num_decode]
    decode_max_pages: int
    prefills: list[PrefillSlice]
    _memo: dict = field(default_factory=dict)

    def _cached(self, key: str, build) -> torch.Tensor:
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = build()
        return value

    def write_index(self) -> torch.Tensor:
        """Rows of every new key and value in the flat [2 * kv_heads * pages * page_size, dim] view of a layer."""

        def build() -> torch.Tensor:
            cache = self.cache
            rows_per_head = cache.num_pages * cache.page_size
            heads = torch.arange(2 * cache.num_kv_heads, device=self.slot_mapping.device)[:, None] * rows_per_head
            return (heads + self.slot_mapping[None, :]).reshape(-1)

        return self._cached("write", build)

    def decode_gather(
        self, layer_storage: torch.Tensor, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every decode row's pages, padded to the longest: two [kv_heads * d, len, dim], in
        `dtype` (the cache's when None).

        A dim-0 index_select over whole pages (rows of page_size * dim) copies with memcpy, two to three times
        faster than selecting along the page dimension of the [kv_heads, pages, ...] layout; the output
        buffer is allocated once per step and reused by every layer (they run one after another)."""
        assert self.decode_page_index is not None
        cache = self.cache
        heads2, ps, dim = 2 * cache.num_kv_heads, cache.page_size, cache.head_dim

        def index() -> torch.Tensor:
            heads = torch.arange(heads2, device=self.decode_page_index.device)[:, None] * cache.num_pages
            return (heads + self.decode_page_index[None, :]).reshape(-1)

        flat_index = self._cached("gather", index)
        buffer = self._cached(
            "gather_buffer",
            lambda: torch.empty(flat_index.numel(), ps * dim, dtype=layer_storage.dtype, device=layer_storage.device),
        )
        torch.index_select(layer_storage.view(heads2 * cache.num_pages, ps * dim), 0, flat_index, out=buffer)
        if dtype is not None and dtype != buffer.dtype:  # a 16-bit cache read as float32: one reused buffer too
            widened = self._cached(
                "gather_widened", lambda: torch.empty(buffer.shape, dtype=dtype, device=buffer.device)
            )
            buffer = widened.copy_(buffer)
        gathered = buffer.view(2, cache.num_kv_heads * self.num_decode, self.decode_max_pages * ps, dim)
        return gathered[0], gathered[1]

    def decode_mask(self, sliding_window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [kv_heads * num_decode, 1, max_len]: -inf on padding (and outside a sliding window)."""
        key = (sliding_window, dtype)
        mask = self._memo.get(key)
        if mask is None:
            assert self.decode_context_lens is not None
            length = self.decode_max_pages * self.cache.page_size
            positions = torch.arange(length, device=self.slot_mapping.device)
            lens = self.decode_context_lens[:, None]
            invalid = positions[None, :] >= lens
            if sliding_window:
                invalid |= positions[None, :] < lens - sliding_window
            mask = torch.zeros(invalid.shape, dtype=dtype, device=invalid.device).masked_fill_(invalid, float("-inf"))
            kv_heads = self.cache.num_kv_heads
            mask = mask.unsqueeze(0).expand(kv_heads, -1, -1).reshape(kv_heads * self.num_decode, 1, length)
            self._memo[key] = mask
        return mask


_local = threading.local()


@contextmanager
def step_context(context: StepContext) -> Iterator[None]:
    """Make the metadata visible to the attention layers of this thread's forward pass."""
    _local.context = context
    try:
        yield
    finally:
        _local.context = None


def current_context() -> StepContext:
    context = getattr(_local, "context", None)
    if context is None:
        raise RuntimeError("paged attention called outside an engine step")
    return context


def _decode_attention(
    ctx: StepContext, storage: torch.Tensor, query: torch.Tensor, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """The decode rows (the first ctx.num_decode) over their gathered pages, in one batched matmul."""
    d, heads, head_dim = ctx.num_decode, query.shape[1], query.shape[2]
    kv_heads = ctx.cache.num_kv_heads
    group = heads // kv_heads
    keys, values = ctx.decode_gather(storage, query.dtype)  # a 16-bit cache under float32 activations: widened
    # heads are grouped by kv head (head h uses kv head h // group), as in repeat_kv
    q = query[:d].reshape(d, kv_heads, group, head_dim).transpose(0, 1).reshape(kv_heads * d, group, head_dim)
    scores = torch.baddbmm(ctx.decode_mask(sliding_window, q.dtype), q, keys.transpose(1, 2), alpha=scale)
    attended = torch.bmm(torch.softmax(scores, dim=-1), values)  # [kv_heads * d, group, dim]
    return attended.view(kv_heads, d, group, head_dim).transpose(0, 1).reshape(d, heads, head_dim)


def _prefill_attention(
    ctx: StepContext,
    layer: int,
    chunk: PrefillSlice,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """One prefill chunk's queries over its context (the chunk itself, or its pages), with SDPA: [q_len, heads, dim]."""
    k_pages, v_pages = ctx.cache.layer(layer)
    kv_heads, head_dim = ctx.cache.num_kv_heads, ctx.cache.head_dim
    rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
    q = query[rows].transpose(0, 1).unsqueeze(0)
    if chunk.page_index is None:
        k = key[rows].transpose(0, 1).unsqueeze(0)
        v = value[rows].transpose(0, 1).unsqueeze(0)
        if k_pages.dtype != k.dtype:  # attend over what the cache holds, as later steps and the compiled step do
            k, v = k.to(k_pages.dtype), v.to(k_pages.dtype)
    else:
        k = k_pages.index_select(1, chunk.page_index).view(1, kv_heads, -1, head_dim)[:, :, : chunk.context_len]
        v = v_pages.index_select(1, chunk.page_index).view(1, kv_heads, -1, head_dim)[:, :, : chunk.context_len]
    if k.dtype != query.dtype:  # a 16-bit cache under float32 activations: attend in float32
        k, v = k.to(query.dtype), v.to(query.dtype)
    mask = None
    offset = chunk.context_len - chunk.q_len
    if offset or sliding_window:
        q_pos = torch.arange(offset, chunk.context_len, device=query.device)[:, None]
        k_pos = torch.arange(chunk.context_len, device=query.device)[None, :]
        mask = k_pos <= q_pos
        if sliding_window:
            mask &= k_pos > q_pos - sliding_window
    group = query.shape[1] // kv_heads
    attended = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=group > 1
    )
    return attended[0].transpose(0, 1)


def paged_attention(
    ctx: StepContext,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """query [N, heads, dim], key/value [N, kv_heads, dim] (rotary applied, any strides) -> [N, heads, dim].

    Writes the new keys/values into their slots, then decode rows attend over their gathered pages in one
    batched matmul and each prefill chunk over its own with SDPA."""
    head_dim = ctx.cache.head_dim
    # Keys and values of a layer are adjacent in storage ([2, kv_heads, pages, page_size, dim]): one
    # index_copy_ over dim 0 of its flat view writes both (dim 0 copies whole rows, the fast path).
    storage = ctx.cache.storage[layer]
    new_kv = torch.stack((key.transpose(0, 1), value.transpose(0, 1))).to(storage.dtype)
    storage.view(-1, head_dim).index_copy_(0, ctx.write_index(), new_kv.view(-1, head_dim))

    d = ctx.num_decode
    decoded = _decode_attention(ctx, storage, query, scale, sliding_window) if d else None
    if decoded is not None and d == query.shape[0]:
        return decoded
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if decoded is not None:
        out[:d] = decoded
    for chunk in ctx.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        out[rows] = _prefill_attention(ctx, layer, chunk, query, key, value, scale, sliding_window)
    return out


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [1, heads, N, dim], key/value [1, kv_heads, N, dim]
    -> output [1, N, heads, dim]."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = paged_attention(
        current_context(), module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1),
        value[0].transpose(0, 1), scale, sliding_window,
    )  # fmt: skip
    return out.unsqueeze(0), None


def _no_mask(*args, **kwargs) -> None:
    """The paged attention builds its own masks; transformers must not build a dense one."""
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
