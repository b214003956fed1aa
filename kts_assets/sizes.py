"""Byte counts as people read them, for the text entry beside a ``*_bytes`` metadata value."""

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
