"""Values read from settings.ini as untrusted input (a hand-edited file, an older or newer studio): each is parsed
and checked, and one that is not what it should be gives way to its default, with a log line saying so."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from PySide6.QtCore import QSettings

log = logging.getLogger(__name__)

Value = TypeVar("Value")
#: what a parse raises for a value that is not what it should be
BAD_VALUE = (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError)


def read_setting(qsettings: QSettings, key: str, default: Value, parse: Callable[[object], Value]) -> Value:
    """parse(the raw value) where the file holds one and it parses, else default (logged when it did not parse).
    QSettings gives strings for INI values, lists for comma-separated ones, and the types written for others."""
    raw = qsettings.value(key, None)
    if raw is None:
        return default
    try:
        return parse(raw)
    except BAD_VALUE as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        shown = repr(raw) if len(repr(raw)) <= 80 else repr(raw)[:77] + "..."
        log.warning("settings: %s = %s is not valid (%s); using %r", key, shown, reason, default)
        return default


def one_of(*allowed: str) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        if not isinstance(raw, str) or raw not in allowed:
            raise ValueError(f"not one of {', '.join(allowed)}")
        return raw

    return parse


def integer(low: int, high: int) -> Callable[[object], int]:
    def parse(raw: object) -> int:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise TypeError(f"not a whole number: {type(raw).__name__}")
        value = int(raw)
        if not low <= value <= high:
            raise ValueError(f"not from {low} to {high}")
        return value

    return parse


def number(low: float, high: float) -> Callable[[object], float]:
    def parse(raw: object) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise TypeError(f"not a number: {type(raw).__name__}")
        value = float(raw)
        if not low <= value <= high:  # NaN fails too
            raise ValueError(f"not from {low:g} to {high:g}")
        return value

    return parse


def flag(raw: object) -> bool:
    """ "true"/"false", as the studio writes them (QSettings reads a bool written as such back as a string)."""
    if raw in (True, "true"):
        return True
    if raw in (False, "false"):
        return False
    raise ValueError("not true or false")
