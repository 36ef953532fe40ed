"""The benchmark's table, ratios (engine ÷ baseline) and JSON record."""

from __future__ import annotations

import json
import statistics
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
        for outcome in ("skipped", "failed"):
            if row.get(outcome):
                why = row[outcome].replace("|", "\\|")
                lines.append(f"| {row['system']} | {outcome}: {why} |" + " |" * (len(COLUMNS) - 2))
                break
        else:
            lines.append("| " + " | ".join(_cell(key, fmt, row) for key, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def _no_figures(row: dict) -> bool:
    return bool(row.get("skipped") or row.get("failed"))


def ratios(rows: list[dict], engine: str = "engine") -> dict[str, dict[str, float]]:
    """Reference ÷ other for throughput; other ÷ reference for latencies (so > 1 means the reference is better).
    The reference is the engine on the first path benchmarked."""
    base = next((r for r in rows if r["system"] == engine and not _no_figures(r)), None)
    if base is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row is base or _no_figures(row):
            continue
        entry = {}
        if row.get("tokens_per_s") and base.get("tokens_per_s"):
            entry["throughput_x"] = base["tokens_per_s"] / row["tokens_per_s"]
        for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s"):
            if row.get(key) and base.get(key):
                entry[key.removesuffix("_s") + "_better_x"] = row[key] / base[key]
        out[row["system"]] = entry
    return out


def with_paired_ratios(result: dict, reference: str) -> dict:
    """Adds `throughput_x_paired` to each system's ratios: the median over rounds of the reference's tok/s ÷ that
    system's in the same round. The rounds run each system in turn, so a round's two runs share the machine's
    speed of that minute; the ratio of the medians does not cancel a drift across rounds (this host's speed moved by
    up to 40 % between minutes), the median of the rounds' ratios does."""
    runs = result["tokens_per_s_runs"]
    base = runs.get(reference) or []
    for system, entry in result["ratios"].items():
        pairs = [b / x for b, x in zip(base, runs.get(system) or [], strict=False) if b and x]
        if len(pairs) > 1:
            entry["throughput_x_paired"] = float(statistics.median(pairs))
    return result


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


START_COLUMNS = [
    ("first_token_s", "first answer", "{:.1f}s"),
    ("ready_s", "ready", "{:.1f}s"),
    ("peak_resident_bytes", "peak RSS", None),
    ("resident_ready_bytes", "RSS ready", None),
    ("resident_after_runs_bytes", "RSS after runs", None),
    ("disk_written_start_bytes", "written (start)", None),
    ("disk_written_run_bytes", "written (runs)", None),
    ("cache_new_start_bytes", "new in cache", None),
]


def _gib(value: int) -> str:
    return f"{value / 1024**3:.2f} GiB" if value >= 1024**3 // 10 else f"{value / 1024**2:.0f} MiB"


def start_table(rows: list[dict]) -> str:
    """A Markdown table of every server start: times from the process start, memory and disk from /proc."""
    head = "| system | round | " + " | ".join(title for _, title, _ in START_COLUMNS) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---" for _ in START_COLUMNS) + " |"]
    for row in rows:
        cells = [row["system"], str(row.get("round", 1))]
        if row.get("failed"):
            peak = row.get("peak_resident_bytes")
            cells.append(f"failed: {row['failed']}")
            cells += ["-", _gib(peak) if peak else "-"] + ["-"] * (len(START_COLUMNS) - 3)
        else:
            for key, _, fmt in START_COLUMNS:
                value = row.get(key)
                cells.append("-" if value is None else fmt.format(value) if fmt else _gib(value))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def start_ratio_lines(per_round: list[dict[str, dict[str, float]]]) -> list[str]:
    """One line per round and peer: the studio's start figures over the peer's (> 1: the studio took more)."""
    lines = []
    for number, entries in enumerate(per_round, start=1):
        which = "first start" if number == 1 else f"start {number}"
        for system, entry in entries.items():
            parts = ", ".join(f"{key.removesuffix('_x').replace('_', ' ')} {x:.2f}x" for key, x in entry.items())
            lines.append(f"{which}, engine-server over {system}: {parts}")
    return lines


def write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1, default=str))
