"""Counts as people read them: bytes with their unit, for the text entry beside a ``*_bytes``
metadata value, and a count with its noun in the right number ("1 segment", "2 segments")."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: int) -> str:
    """``1536`` → ``"1.5 KiB"``; below 1 KiB the exact count (``"512 B"``); negative is unknown."""
    if count < 0:
        return "unknown"
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            return f"{value:,.1f} {unit}"
    raise AssertionError("unreachable")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``counted(1, "segment")`` → ``"1 segment"``; any other count takes the plural (``noun`` + s
    unless given)."""
    return f"{count:,} {noun if count == 1 else (plural or noun + 's')}"
