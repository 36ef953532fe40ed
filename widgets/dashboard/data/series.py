"""Dashboard data without Qt: metrics snapshots accumulated into numpy columns, cut to a time window."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.core.metrics import MetricsSnapshot, PageMap, Totals

SnapshotSource = Callable[[int, int], MetricsSnapshot]

STEP_COLUMNS = (
    "step",
    "start",
    "duration_s",
    "forward_s",
    "prefill_tokens",
    "decode_tokens",
    "batch_size",
    "running",
    "waiting",
    "pages_used",
    "pages_cached_free",
    "pages_free",
    "pages_total",
    "kv_slots_used",
    "preemptions",
    "prefix_query_tokens",
    "prefix_hit_tokens",
    "prefill_stall_s",
)
TOKEN_COLUMNS = ("time", "latency_s", "index", "chat", "request", "drafted")  # drafted: 1.0 for an accepted draft
EVENT_COLUMNS = ("time", "kind", "request")
EVENT_KINDS = ("admitted", "finished", "preempted")

#: the longest window the dashboard offers; older records are dropped
RETENTION_S = 600.0


class ColumnTable:
    """Float columns that grow by doubling, so appending a poll's few new records never copies the history."""

    def __init__(self, names: Sequence[str], capacity: int = 1024) -> None:
        self.names = tuple(names)
        self._data = {name: np.empty(capacity) for name in self.names}
        self.size = 0

    def extend(self, rows: Sequence[Sequence[float]]) -> None:
        if not rows:
            return
        needed = self.size + len(rows)
        capacity = len(self._data[self.names[0]])
        if needed > capacity:
            capacity = max(needed, capacity * 2)
            for name, old in self._data.items():
                grown = np.empty(capacity)
                grown[: self.size] = old[: self.size]
                self._data[name] = grown
        block = np.asarray(rows, dtype=float).reshape(len(rows), len(self.names))
        for i, name in enumerate(self.names):
            self._data[name][self.size : needed] = block[:, i]
        self.size = needed

    def column(self, name: str) -> np.ndarray:
        return self._data[name][: self.size]

    def drop_first(self, count: int) -> None:
        count = min(count, self.size)
        if count <= 0:
            return
        for data in self._data.values():
            data[: self.size - count] = data[count : self.size]
        self.size -= count

    def clear(self) -> None:
        self.size = 0


@dataclass
class MemoryInfo:
    """What the numbers panel says about memory; the app fills it from the loaded model and the engine."""

    weight_bytes: int = 0
    kv_pool_bytes: int = 0
    label: str = ""
    kv_pages: int = 0  # pages in the engine's pool, shown until it publishes its own figures


@dataclass
class WindowView:
    """The records of one time window. Times are seconds relative to the window's end ("now"), so a live chart
    keeps a fixed axis from -window to 0 and only its data moves."""

    start: float  # -window
    end: float  # 0
    steps: dict[str, np.ndarray]
    tokens: dict[str, np.ndarray]
    events: dict[str, np.ndarray]
    chats: list[str]
    page_map: PageMap | None
    annotations: list[tuple[float, str]] = field(default_factory=list)
    since_origin: float = 0.0  # seconds from the first record to the window's end: bins align on it
    pages_now: tuple[int, int] | None = None  # (used, in the pool) of the engine read now; None: not known yet

    @property
    def num_steps(self) -> int:
        return len(self.steps["t"])

    @property
    def num_tokens(self) -> int:
        return len(self.tokens["t"])


class MetricsHistory:
    """Everything the dashboard has read: steps, tokens, step events and finished requests, from one or
    more snapshot sources in turn (the chat engine, an experiment's engines). Each source keeps its own
    cursors, so a poll copies only what is new."""

    def __init__(self, retention_s: float = RETENTION_S) -> None:
        self.retention_s = retention_s
        self.steps = ColumnTable(STEP_COLUMNS)
        self.tokens = ColumnTable(TOKEN_COLUMNS, capacity=4096)
        self.events = ColumnTable(EVENT_COLUMNS)
        self.chats: list[str] = []  # chat tags in order of first appearance
        self._chat_codes: dict[str, int] = {}
        self.request_ids: list[str] = []
        self._request_codes: dict[str, int] = {}
        self.finished: dict[str, dict] = {}  # request id -> RequestStats dict (with tag)
        self.page_map: PageMap | None = None
        self.totals: Totals | None = None
        self.annotations: list[tuple[float, str]] = []  # (monotonic time, text): experiment phases
        self.origin: float | None = None
        self._cursors: dict[Hashable, tuple[int, int]] = {}
        self._current: Hashable | None = None  # the source polled last
        self._current_steps = 0  # steps read from it: an earlier source's last step says nothing of its pool

    # ---- reading snapshots ---------------------------------------------------------------------
    def poll(self, source: SnapshotSource) -> bool:
        """Read what the source recorded since the last poll of it; True when anything changed."""
        since_step, since_token = self._cursors.get(source, (0, 0))
        snapshot = source(since_step, since_token)
        self._cursors[source] = (snapshot.next_step, snapshot.next_token)
        if source != self._current:
            self._current, self._current_steps = source, 0
        self._current_steps += len(snapshot.steps)
        return self.ingest(snapshot)

    def pages_now(self) -> tuple[int, int] | None:
        """(pages used, pages in the pool) of the engine read now: its last step, else its page map."""
        if self._current_steps and self.steps.size:
            return int(self.steps.column("pages_used")[-1]), int(self.steps.column("pages_total")[-1])
        if self.page_map is not None:
            used = len({page for _rid, table, _computed in self.page_map.tables for page in table})
            return used, self.page_map.num_pages
        return None

    def ingest(self, snapshot: MetricsSnapshot) -> bool:
        changed = bool(snapshot.steps or snapshot.tokens) or snapshot.page_map is not self.page_map
        self.totals = snapshot.totals
        if snapshot.page_map is not None and snapshot.page_map is not self.page_map:
            self.page_map = snapshot.page_map
            for tag in snapshot.page_map.tags.values():
                self.chat_code(tag)  # colours are handed out on first sight, so a chat keeps its colour
        if snapshot.steps:
            self._set_origin(snapshot.steps[0].start)
            self.steps.extend([[getattr(s, name) for name in STEP_COLUMNS] for s in snapshot.steps])
            events = [
                (s.start + s.duration_s, kind, self._request_code(rid))
                for s in snapshot.steps
                for kind, ids in enumerate((s.admitted, s.finished, s.preempted))
                for rid in ids
            ]
            self.events.extend(events)
        if snapshot.tokens:
            self._set_origin(snapshot.tokens[0].time)
            self.tokens.extend(
                [
                    (t.time, t.latency_s, t.index, self.chat_code(t.tag), self._request_code(t.request_id), t.drafted)
                    for t in snapshot.tokens
                ]
            )
        # the recorder hands over its whole (bounded) finished list; walk back only to the first one known
        for stats in reversed(snapshot.finished):
            rid = stats.get("request_id", "")
            if rid in self.finished:
                break
            self.finished[rid] = stats
        self._trim()
        return changed

    def forget_source(self, source: SnapshotSource) -> None:
        self._cursors.pop(source, None)

    def annotate(self, time: float, text: str) -> None:
        self._set_origin(time)
        self.annotations.append((time, text))

    def clear(self) -> None:
        """Forget the records (not the cursors: what was read is not read again)."""
        for table in (self.steps, self.tokens, self.events):
            table.clear()
        self.finished.clear()
        self.annotations.clear()
        self.origin = None

    # ---- windows -------------------------------------------------------------------------------
    def window(self, seconds: float, now: float) -> WindowView:
        """Records from the last `seconds` before `now` (monotonic), times relative to now."""
        lo = now - seconds
        steps = _slice(self.steps, "start", lo, now)
        tokens = _slice(self.tokens, "time", lo, now)
        events = _slice(self.events, "time", lo, now)
        notes = [(t - now, text) for t, text in self.annotations if lo <= t <= now]
        since_origin = now - self.origin if self.origin is not None else 0.0
        return WindowView(
            -seconds, 0.0, steps, tokens, events, list(self.chats), self.page_map, notes, since_origin, self.pages_now()
        )

    def latest_time(self) -> float | None:
        times = [table.column(c)[-1] for table, c in ((self.steps, "start"), (self.tokens, "time")) if table.size]
        return max(times) if times else None

    # ---- internals ---------------------------------------------------------------------------
    def _set_origin(self, time: float) -> None:
        if self.origin is None or time < self.origin:
            self.origin = time

    def chat_code(self, tag: str) -> int:
        code = self._chat_codes.get(tag)
        if code is None:
            code = self._chat_codes[tag] = len(self.chats)
            self.chats.append(tag)
        return code

    def _request_code(self, request_id: str) -> int:
        code = self._request_codes.get(request_id)
        if code is None:
            code = self._request_codes[request_id] = len(self.request_ids)
            self.request_ids.append(request_id)
        return code

    def _trim(self) -> None:
        latest = self.latest_time()
        if latest is None:
            return
        cutoff = latest - self.retention_s
        for table, column in ((self.steps, "start"), (self.tokens, "time"), (self.events, "time")):
            old = int(np.searchsorted(table.column(column), cutoff))
            # drop in batches: moving the columns down costs the whole table, so do it rarely
            if old > max(256, table.size // 4):
                table.drop_first(old)
        if len(self.finished) > 8192:
            for rid in list(self.finished)[: len(self.finished) - 4096]:
                del self.finished[rid]


def step_of(step_starts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Index of the step each event time belongs to. Events are stamped at their step's end, which is also
    (give or take rounding) the next step's start: the tolerance keeps them on their own step."""
    if not len(step_starts):
        return np.zeros(len(times), dtype=int)
    rows = np.searchsorted(step_starts, np.asarray(times) - 1e-9, side="right") - 1
    return np.clip(rows, 0, len(step_starts) - 1)


def _slice(table: ColumnTable, time_column: str, lo: float, now: float) -> dict[str, np.ndarray]:
    times = table.column(time_column)
    first = int(np.searchsorted(times, lo))
    columns = {name: table.column(name)[first:] for name in table.names}
    columns["t"] = times[first:] - now
    return columns
