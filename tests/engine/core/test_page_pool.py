"""Page allocator: reference counts, free queue order, prefix hashes; invariants under random use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.page_pool import PagePool, page_hash, page_hashes


def test_allocate_and_release_return_every_page() -> None:
    pool = PagePool(8, 4)
    pages = pool.allocate(5)
    assert len(set(pages)) == 5 and pool.num_free == 3 and pool.num_used == 5
    pool.release(pages)
    assert pool.num_free == 8 and pool.num_used == 0
    pool.check_invariants()


def test_allocating_more_than_free_fails() -> None:
    pool = PagePool(2, 4)
    pool.allocate(2)
    with pytest.raises(MemoryError):
        pool.allocate(1)


def test_double_release_is_caught() -> None:
    pool = PagePool(2, 4)
    pages = pool.allocate(1)
    pool.release(pages)
    with pytest.raises(RuntimeError):
        pool.release(pages)


def test_hash_chain_depends_on_every_earlier_token() -> None:
    a = page_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = page_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2
    assert a[1] != b[1]  # same second page, different first page
    assert page_hashes([1, 2, 3, 4, 5, 6], 4) == a[:1]  # only full pages are hashed
    assert page_hash(None, [1, 2]) != page_hash(None, [12])


def test_cached_pages_survive_release_and_are_found_again() -> None:
    pool = PagePool(8, 4)
    pages = pool.allocate(2)
    hashes = page_hashes(list(range(8)), 4)
    for page, h in zip(pages, hashes, strict=True):
        pool.register(page, h)
    pool.release(pages)
    assert pool.num_cached_free == 2 and pool.num_free == 8
    found = pool.lookup_prefix(hashes)
    assert found == pages
    pool.acquire(found)
    assert pool.num_used == 2 and pool.ref_counts[pages[0]] == 1
    pool.acquire(found)  # a second sharer
    assert pool.ref_counts[pages[0]] == 2
    pool.check_invariants()


def test_unhashed_pages_are_reused_before_cached_ones_and_lru_order() -> None:
    pool = PagePool(4, 2)
    first = pool.allocate(2)
    pool.register(first[0], b"a" * 16)
    pool.register(first[1], b"b" * 16)
    pool.release(first)  # cached, tail page first in eviction order
    scratch = pool.allocate(2)
    pool.release(scratch)  # unhashed: go to the front
    taken = pool.allocate(2)
    assert sorted(taken) == sorted(scratch)
    assert pool.num_cached_free == 2
    pool.release(taken)
    evicting = pool.allocate(3)  # the two unhashed pages, then the least recently freed cached one
    assert first[1] in evicting and first[0] not in evicting
    assert pool.lookup_prefix([b"a" * 16]) == [first[0]]
    assert pool.evictions == 1
    pool.check_invariants()


def test_register_keeps_the_first_page_with_the_same_contents() -> None:
    pool = PagePool(4, 2)
    a, b = pool.allocate(2)
    pool.register(a, b"x" * 16)
    pool.register(b, b"x" * 16)
    assert pool.lookup_prefix([b"x" * 16]) == [a]
    assert pool.hash_of[b] is None


def test_caching_off_finds_nothing() -> None:
    pool = PagePool(4, 2, enable_caching=False)
    (a,) = pool.allocate(1)
    pool.register(a, b"x" * 16)
    assert pool.lookup_prefix([b"x" * 16]) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "share", "register"]), st.integers(0, 7)), max_size=80))
def test_invariants_under_random_operations(ops) -> None:
    pool = PagePool(12, 2)
    holders: list[list[int]] = []
    for op, n in ops:
        if op == "alloc" and pool.num_free:
            holders.append(pool.allocate(min(pool.num_free, n % 3 + 1)))
        elif op == "free" and holders:
            pool.release(holders.pop(n % len(holders)))
        elif op == "share" and holders:
            pages = holders[n % len(holders)]
            hashes = [bytes([p]) * 16 for p in pages]
            for page, h in zip(pages, hashes, strict=True):
                pool.register(page, h)
            found = pool.lookup_prefix(hashes)
            if found:
                pool.acquire(found)
                holders.append(found)
        elif op == "register" and holders:
            pages = holders[n % len(holders)]
            pool.register(pages[0], bytes([100 + n, pages[0]]) * 8)
        pool.check_invariants()
        assert pool.num_used == len({p for h in holders for p in h})
    for pages in holders:
        pool.release(pages)
    pool.check_invariants()
    assert pool.num_free == pool.num_pages
