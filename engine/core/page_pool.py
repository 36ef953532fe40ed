"""The KV page allocator: free queue in LRU order, reference counts, and the prefix cache (chained page hashes)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

PageHash = bytes


def page_hash(parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
    """Identity of a full page: its tokens and, through the parent's hash, every token before it."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent or b"root")
    digest.update(b",".join(str(t).encode() for t in token_ids))
    return digest.digest()


def page_hashes(token_ids: Sequence[int], page_size: int, start_parent: PageHash | None = None) -> list[PageHash]:
    """Chained hashes of every full page of token_ids."""
    hashes: list[PageHash] = []
    parent = start_parent
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        parent = page_hash(parent, token_ids[start : start + page_size])
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class PrefixHit:
    """The leading full pages of a token sequence, hashed, and those of them already cached."""

    hashes: list[PageHash]  # every full page's hash (the last token excluded: it must be computed)
    pages: list[int]  # cached pages holding the longest run of leading hashes

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class PagePool:
    """Hands out page ids. A page with no references sits in the free queue; if it holds a hashed (full)
    page it stays findable for prefix reuse until it is evicted, oldest-freed first."""

    def __init__(self, num_pages: int, page_size: int, enable_caching: bool = True) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_pages
        self.hash_of: list[PageHash | None] = [None] * num_pages
        self.cached: dict[PageHash, int] = {}
        # insertion order = eviction order; O(1) removal when a cached page is reused
        self.free_queue: OrderedDict[int, None] = OrderedDict((p, None) for p in range(num_pages))
        self.evictions = 0
        #: references beyond the first, summed over pages (how many page slots sharing saves)
        self.extra_refs = 0
        #: per request, the hashes of its leading full pages published so far (the chain new pages extend)
        self._chains: dict[str, list[PageHash]] = {}

    # ---- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Pages that can be handed out now (cached-free pages included: they get evicted)."""
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self.free_queue)

    @property
    def num_cached_free(self) -> int:
        return sum(1 for p in self.free_queue if self.hash_of[p] is not None)

    # ---- prefix cache, per request ----------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> PrefixHit:
        """Which leading full pages of these tokens are cached. At least one token is always left to compute,
        to produce the next logits."""
        if not self.enable_caching:
            return PrefixHit([], [])
        ps = self.page_size
        hashes = page_hashes(token_ids[: (len(token_ids) - 1) // ps * ps], ps)
        return PrefixHit(hashes, self.lookup_prefix(hashes))

    def num_free_among(self, pages: Sequence[int]) -> int:
        """How many of these (cached) pages sit in the free queue: taking them leaves fewer pages free."""
        return sum(1 for page in pages if self.ref_counts[page] == 0)

    def admit(self, request_id: str, hit: PrefixHit, new_pages: int) -> list[int]:
        """A page table for a request: references on its cached prefix pages, then `new_pages` fresh ones."""
        self.acquire(hit.pages)
        self._chains[request_id] = hit.hashes[: hit.num_pages]
        return hit.pages + self.allocate(new_pages)

    def num_published(self, request_id: str) -> int:
        """Leading full pages of the request already findable (hits at admission included)."""
        return len(self._chains.get(request_id, ()))

    def publish(self, request_id: str, token_ids: Sequence[int], page_table: Sequence[int], computed: int) -> None:
        """Make the request's pages that are now full (their K/V written) findable by later requests."""
        if not self.enable_caching:
            return
        chain = self._chains.setdefault(request_id, [])
        ps = self.page_size
        for index in range(len(chain), computed // ps):
            parent = chain[index - 1] if index else None
            h = page_hash(parent, token_ids[index * ps : (index + 1) * ps])
            chain.append(h)
            self.register(page_table[index], h)

    def release_request(self, request_id: str, page_table: Sequence[int]) -> None:
        """A request gives back all its pages (finished, cancelled or preempted)."""
        self._chains.pop(request_id, None)
        if page_table:
            self.release(page_table)

    # ---- prefix cache, by hash ----------------------------------------------------------------
    def lookup_prefix(self, hashes: Sequence[PageHash]) -> list[int]:
        """Pages holding the longest cached run of leading hashes (not yet referenced by the caller)."""
        if not self.enable_caching:
            return []
        pages: list[int] = []
        for h in hashes:
            page = self.cached.get(h)
            if page is None:
                break
            pages.append(page)
        return pages

    def register(self, page: int, h: PageHash) -> None:
        """Mark a page full and findable. If another page already holds these tokens, keep that one."""
        if not self.enable_caching or self.hash_of[page] is not None:
            return
        if h in self.cached:
            return
        self.hash_of[page] = h
        self.cached[h] = page

    # ---- reference counting -----------------------------------------------------------------
    def acquire(self, pages: Sequence[int]) -> None:
        """Take a reference on cached pages found by lookup_prefix."""
        for page in pages:
            if self.ref_counts[page] == 0:
                del self.free_queue[page]
            else:
                self.extra_refs += 1
            self.ref_counts[page] += 1

    def allocate(self, count: int) -> list[int]:
        """Fresh pages, evicting the least recently freed cached pages if needed."""
        if count > len(self.free_queue):
            raise MemoryError(f"asked for {count} KV pages, {len(self.free_queue)} free")
        pages = []
        for _ in range(count):
            page, _ = self.free_queue.popitem(last=False)
            old = self.hash_of[page]
            if old is not None:
                del self.cached[old]
                self.hash_of[page] = None
                self.evictions += 1
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference per page. Pages are freed tail first, so a request's last (least shared)
        pages are evicted before its prefix."""
        for page in reversed(pages):
            count = self.ref_counts[page] - 1
            if count < 0:
                raise RuntimeError(f"KV page {page} released more often than acquired")
            if count > 0:
                self.extra_refs -= 1
            self.ref_counts[page] = count
            if count == 0:
                if self.hash_of[page] is None:
                    # an unhashed page has nothing to offer; hand it out before any cached page
                    self.free_queue[page] = None
                    self.free_queue.move_to_end(page, last=False)
                else:
                    self.free_queue[page] = None

    def reset_cache(self) -> None:
        """Forget every cached prefix (pages in use keep their contents)."""
        for h, page in list(self.cached.items()):
            if self.ref_counts[page] == 0:
                del self.cached[h]
                self.hash_of[page] = None

    def check_invariants(self) -> None:
        """Consistency of counts, queue and hash map (used by tests)."""
        for page in range(self.num_pages):
            in_queue = page in self.free_queue
            assert (self.ref_counts[page] == 0) == in_queue, f"page {page}: refs vs free queue"
            h = self.hash_of[page]
            if h is not None:
                assert self.cached.get(h) == page, f"page {page}: hash map out of sync"
        assert all(self.hash_of[p] == h for h, p in self.cached.items())
        assert self.extra_refs == sum(max(0, r - 1) for r in self.ref_counts), "shared reference count"
