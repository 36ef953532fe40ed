"""The benchmark's table, ratios (engine ÷ baseline) and JSON record."""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = [
    ("system", "system", "{}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50", "{:.2f}s"),
    ("ttft_p99_s", "TTFT p99", "{:.2f}s"),
    ("itl_p50_s", "ITL p50", "{:.0f}ms"),
    ("itl_p99_s", "ITL p99", "{:.0f}ms"),
    ("e2e_p50_s", "E2E p50", "{:.2f}s"),
    ("e2e_p99_s", "E2E p99", "{:.2f}s"),
]


def _cell(key: str, fmt: str, row: dict) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key.startswith("itl"):
        value *= 1000
    return fmt.format(value)


def table(rows: list[dict]) -> str:
    """A Markdown table of the systems' summaries."""
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "| " + " | ".join("---" for _ in COLUMNS) + " |"
    lines = [head, rule]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['system']} | skipped: {row['skipped']} |" + " |" * (len(COLUMNS) - 2))
            continue
        lines.append("| " + " | ".join(_cell(key, fmt, row) for key, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def ratios(rows: list[dict], engine: str = "engine") -> dict[str, dict[str, float]]:
    """Reference ÷ other for throughput; other ÷ reference for latencies (so > 1 means the reference is better).
    The reference is the engine on the first path benchmarked."""
    base = next((r for r in rows if r["system"] == engine and not r.get("skipped")), None)
    if base is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row is base or row.get("skipped"):
            continue
        entry = {}
        if row.get("tokens_per_s") and base.get("tokens_per_s"):
            entry["throughput_x"] = base["tokens_per_s"] / row["tokens_per_s"]
        for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s"):
            if row.get(key) and base.get(key):
                entry[key.removesuffix("_s") + "_better_x"] = row[key] / base[key]
        out[row["system"]] = entry
    return out


def engine_details(row: dict) -> str:
    keys = [
        ("peak_pages_used", "peak pages", "{}"),
        ("pages_total", "of", "{}"),
        ("kv_waste", "KV waste", "{:.1%}"),
        ("preemptions", "preemptions", "{}"),
        ("prefix_hit_rate", "prefix hits", "{:.0%}"),
        ("prefill_tokens", "prefill tokens", "{}"),
        ("prefill_step_time_share", "time in prefill steps", "{:.0%}"),
        ("overhead_share", "engine overhead", "{:.1%}"),
        ("prefill_stall_max_s", "longest prefill stall", "{:.2f}s"),
        ("mean_batch", "mean batch", "{:.1f}"),
        ("ui_thread_busy", "UI thread busy", "{:.0%}"),
        ("typing_latency_p50_ms", "typing latency p50", "{:.0f} ms"),
        ("typing_latency_p99_ms", "p99", "{:.0f} ms"),
    ]
    parts = [f"{title} {fmt.format(row[key])}" for key, title, fmt in keys if row.get(key) is not None]
    if row.get("draft_tokens"):
        drafted, accepted = row["draft_tokens"], row.get("accepted_draft_tokens", 0)
        parts.append(f"drafts accepted {accepted} of {drafted} ({accepted / drafted:.0%})")
    return f"{row['system']}: " + ", ".join(parts)


def write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1, default=str))
