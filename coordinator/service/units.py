"""Numbers as the dashboard shows them: durations and sizes with their units, and "unlimited"
instead of Flink's ``Integer.MAX_VALUE``. Pure."""

from __future__ import annotations

from events.wire.records import UNLIMITED_ATTEMPTS

UNLIMITED = UNLIMITED_ATTEMPTS
"""Flink's ``Integer.MAX_VALUE`` (2147483647): a count that never runs out."""

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))


def format_duration(ms: float) -> str:
    """``300 ms``, ``1.5 s``, ``10 min``, ``1 min 30 s``, ``2 h 5 min``, ``1 d 2 h``: the two largest
    units of a duration of a second or more (their first with a fraction when it is seconds)."""
    ms = round(ms)
    if abs(ms) < 1000:
        return f"{ms} ms"
    sign, rest = ("-" if ms < 0 else ""), abs(ms)
    for i, (unit, size) in enumerate(_UNITS):
        if rest < size:
            continue
        if unit == "s":
            return f"{sign}{rest / size:.3g} s" if rest < 10 * size else f"{sign}{rest // size} s"
        whole, left = divmod(rest, size)
        smaller, small = _UNITS[i + 1]
        part = left // small
        return f"{sign}{whole} {unit}" + (f" {part} {smaller}" if part else "")
    raise AssertionError("unreachable")  # pragma: no cover


def format_bytes(size: float) -> str:
    """``512 B``, ``12.3 KiB``, ``4.0 MiB``, ..."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{round(size)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_count(n: int) -> str:
    """``3``, ``1,000``; ``unlimited`` for :data:`UNLIMITED` or more."""
    return "unlimited" if n >= UNLIMITED else f"{n:,}"
