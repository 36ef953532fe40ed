"""Entries remembered per key in a JSON file of the user cache (measured weight formats, passed fast-path checks),
each stamped with its time; a broken, missing or read-only file only means measuring or checking again."""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def now() -> float:
    return datetime.datetime.now(datetime.UTC).timestamp()


def _read(path: Path) -> dict:
    try:
        store = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return store if isinstance(store, dict) else {}


def recent(path: Path, key: str, stamp: str, keep_days: float, at: float) -> dict | None:
    """The entry for `key` if there is one whose `stamp` field is at most keep_days before `at`."""
    entry = _read(path).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        age_days = (at - float(entry.get(stamp, 0))) / 86400
    except (TypeError, ValueError):
        return None
    return entry if 0 <= age_days <= keep_days else None


def put(path: Path, key: str, entry: dict) -> None:
    """Keep `entry` under `key`, beside the file's other entries (a broken file is replaced)."""
    store = _read(path)
    store[key] = entry
    try:
        path.write_text(json.dumps(store, indent=1))
    except OSError:  # a read-only cache: measured or checked again next time, nothing lost
        log.debug("could not remember %s in %s", key, path)
