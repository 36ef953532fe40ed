"""Recorded metrics out to files: CSV tables (steps, tokens, requests) and one JSON document."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from widgets.dashboard.data.series import EVENT_KINDS, STEP_COLUMNS, MetricsHistory, step_of

_INT_STEP_COLUMNS = set(STEP_COLUMNS) - {"start", "duration_s", "forward_s"}
REQUEST_COLUMNS = (
    "request_id",
    "tag",
    "prompt_tokens",
    "cached_prompt_tokens",
    "output_tokens",
    "ttft_s",
    "decode_tokens_per_s",
    "e2e_s",
    "queue_s",
    "preemptions",
    "finish_reason",
)


def step_rows(history: MetricsHistory) -> list[dict]:
    """One dict per step: its fields, time relative to the origin, and the requests admitted/finished/preempted."""
    origin = history.origin or 0.0
    table = history.steps
    columns = {name: table.column(name) for name in STEP_COLUMNS}
    events: dict[int, dict[str, list[str]]] = {}
    rows_of = step_of(columns["start"], history.events.column("time"))
    for row, kind, request in zip(
        rows_of, history.events.column("kind"), history.events.column("request"), strict=True
    ):
        per_kind = events.setdefault(int(row), {k: [] for k in EVENT_KINDS})
        per_kind[EVENT_KINDS[int(kind)]].append(history.request_ids[int(request)])
    rows = []
    for i in range(table.size):
        row: dict = {"t_s": round(float(columns["start"][i]) - origin, 6)}
        for name in STEP_COLUMNS:
            value = float(columns[name][i])
            row[name] = int(value) if name in _INT_STEP_COLUMNS else value
        for kind in EVENT_KINDS:
            row[kind] = events.get(i, {}).get(kind, [])
        rows.append(row)
    return rows


def token_rows(history: MetricsHistory) -> list[dict]:
    origin = history.origin or 0.0
    t = history.tokens
    return [
        {
            "t_s": round(float(time) - origin, 6),
            "request_id": history.request_ids[int(request)],
            "chat": history.chats[int(chat)],
            "index": int(index),
            "latency_s": float(latency),
            "drafted": bool(drafted),
        }
        for time, latency, index, chat, request, drafted in zip(
            t.column("time"),
            t.column("latency_s"),
            t.column("index"),
            t.column("chat"),
            t.column("request"),
            t.column("drafted"),
            strict=True,
        )
    ]


def request_rows(history: MetricsHistory) -> list[dict]:
    return [{name: stats.get(name) for name in REQUEST_COLUMNS} for stats in history.finished.values()]


def export_csv(history: MetricsHistory, path: str | Path) -> list[Path]:
    """Three CSV files next to `path`: NAME-steps.csv, NAME-tokens.csv, NAME-requests.csv; returns their paths."""
    path = Path(path)
    stem = path.name.removesuffix(".csv")
    written = []
    for kind, rows, fields in (
        ("steps", step_rows(history), ["t_s", *STEP_COLUMNS, *EVENT_KINDS]),
        ("tokens", token_rows(history), ["t_s", "request_id", "chat", "index", "latency_s", "drafted"]),
        ("requests", request_rows(history), list(REQUEST_COLUMNS)),
    ):
        target = path.with_name(f"{stem}-{kind}.csv")
        with target.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ";".join(v) if isinstance(v, list) else v for k, v in row.items()})
        written.append(target)
    return written


def export_json(history: MetricsHistory, path: str | Path) -> Path:
    """Everything recorded, in one JSON document (times in seconds from the first record)."""
    path = Path(path)
    document = {
        "origin_monotonic_s": history.origin,
        "steps": step_rows(history),
        "tokens": token_rows(history),
        "requests": request_rows(history),
        "annotations": [
            {"t_s": round(t - (history.origin or 0.0), 6), "text": text} for t, text in history.annotations
        ],
        "totals": history.totals.__dict__ if history.totals is not None else None,
    }
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path
