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


SIZE = "size"  # the metadata entry that says a partition's sizes in words, with their units


def size_first(metadata: dict[str, object]) -> dict[str, object]:
    """``metadata`` with its ``size`` entry first: the UI lists entries in the order given, and the
    words with units are what a person looks for before the byte counts the plots use."""
    if SIZE not in metadata:
        return metadata
    return {SIZE: metadata[SIZE], **{k: v for k, v in metadata.items() if k != SIZE}}
