"""A least-recently-used cache bounded by the bytes its entries hold, not by their number, and the process's resident
memory that measures them (a compiled grammar's cost is its lexer, which only the allocator sees)."""

from __future__ import annotations

import resource
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux), else None."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None


class ByteBoundedCache(Generic[Value]):
    """put(key, value, nbytes) keeps the value while the entries together hold at most capacity bytes, dropping the
    least recently used first; a value larger than the whole capacity is not kept. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[Value, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Value | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Value, nbytes: int) -> bool:
        """Whether the value was kept."""
        with self._lock:
            self._drop(key)
            if nbytes > self.capacity:
                return False
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.capacity:
                self._drop(next(iter(self._entries)))
            return True

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]
