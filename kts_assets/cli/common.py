"""What every command module of the ``kts`` command line shares: the exit statuses, the one-line
error (:class:`CommandError`), the argument types (sizes, durations, bounded numbers, offset ranges,
``KEY=VALUE`` pairs, existing files and directories) and the printing (JSON, tables, ``kts:`` lines).

Bad input gets one line on stderr naming the file and byte position, and a non-zero exit: 1 for
findings in the data, 2 for a command used wrongly. Only the standard library and kts's format
errors are imported here, so every command starts fast.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from kts_resources.kafka.errors import os_error_line, shown

EXIT_FINDINGS = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A problem worth one line on stderr, and the exit status to leave with."""

    def __init__(self, message: str, status: int = EXIT_FINDINGS):
        super().__init__(message)
        self.status = status


# --- small parsers --------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024, "m": 1000**2, "mb": 1000**2,
               "mi": 1024**2, "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gi": 1024**3, "gib": 1024**3,
               "t": 1000**4, "tb": 1000**4, "ti": 1024**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """``4096``, ``64KiB``, ``1.5GB``: a byte count."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 1GiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``500``/``500ms``, ``30s``, ``10m``, ``1h``, ``7d``: milliseconds."""
    m = re.match(r"^\s*(-?\d+)\s*(ms|s|m|min|h|d)?\s*$", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 500ms, 30s, 1h, 7d)")
    return int(m.group(1)) * _DURATION_UNITS[m.group(2) or "ms"]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


def print_table(rows: list[dict], columns: Sequence[str]) -> None:
    """Left-aligned text columns, as wide as their widest cell."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def report(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"kts: {line}", file=sys.stderr)


def _unreachable(p: Path) -> None:
    """A path whose stat() fails otherwise than by its absence (a symbolic link loop, a component
    that is no directory, no permission): one line saying so, not "no such file"."""
    try:
        p.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise CommandError(os_error_line(e)) from None


def existing_file(path: str) -> Path:
    p = Path(path)
    _unreachable(p)
    if not p.exists():
        raise CommandError(f"{shown(path)}: no such file", EXIT_USAGE)
    if not p.is_file():
        raise CommandError(f"{shown(path)}: {'a directory' if p.is_dir() else 'not a regular file'}, not a file", EXIT_USAGE)
    return p


def existing_dir(path: str) -> Path:
    p = Path(path)
    _unreachable(p)
    if not p.exists():
        raise CommandError(f"{shown(path)}: no such directory", EXIT_USAGE)
    if not p.is_dir():
        raise CommandError(f"{shown(path)}: not a directory", EXIT_USAGE)
    return p


def directory_to_write(path: str, option: str) -> Path:
    """A directory an option names for output: existing, or creatable (its nearest existing
    ancestor is a directory). Checked before any work so a file there is a usage error. An empty
    path is refused: it would quietly mean the current directory."""
    if not path.strip():
        raise CommandError(f"{option} {path!r}: an empty path; name the directory (. for the current one)", EXIT_USAGE)
    p = Path(path)
    for ancestor in (p, *p.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                what = "is a file" if ancestor == p else f"is under {shown(ancestor)}, which is not a directory"
                raise CommandError(f"{option} {shown(path)}: {what}; a directory is needed", EXIT_USAGE)
            break
    return p


def bounded(kind: Callable[[str], int | float], lo: float, hi: float) -> Callable[[str], int | float]:
    """An argparse type: ``kind``'s value, a usage error outside ``lo..hi`` (or for a number too
    long to convert), so a count never starts unbounded work."""
    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}{'...' if len(text) > 40 else ''}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value:g} is outside {lo:g}..{hi:g}" if isinstance(value, float)
                                             else f"{value} is outside {lo}..{hi}")
        return value
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def named_file(path: str, suffixes: Sequence[str]) -> Path:
    """An existing ``<20-digit offset><suffix>`` file whose suffix is one of ``suffixes``."""
    from kts_resources.kafka.logdir import parse_offset_file_name

    p = existing_file(path)
    try:
        _, suffix = parse_offset_file_name(p.name)
    except ValueError:
        suffix = None
    if suffix not in suffixes:
        raise CommandError(f"{shown(path)}: not a {'/'.join(suffixes)} file name (expected <20-digit offset>{p.suffix or suffixes[0]})", EXIT_USAGE)
    return p


def segment_file(path: str) -> Path:
    """An existing ``<20-digit base offset>.log`` file: the base offset comes from the name."""
    from kts_resources.kafka.logdir import LOG_SUFFIX, parse_offset_file_name

    p = existing_file(path)
    try:
        _, suffix = parse_offset_file_name(p.name)
    except ValueError:
        suffix = None
    if suffix != LOG_SUFFIX:
        raise CommandError(f"{shown(path)}: not a segment file (expected <20-digit base offset>.log)", EXIT_USAGE)
    return p


def offset_range(text: str) -> tuple[int, int]:
    """``A..B``: first and last offset, inclusive, 0 ≤ A ≤ B."""
    match = re.fullmatch(r"\s*(\d{1,19})\s*\.\.\s*(\d{1,19})\s*", text)
    if match is None or int(match[1]) > int(match[2]) or int(match[2]) > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{text[:64]!r} is not an offset range A..B with 0 ≤ A ≤ B")
    return int(match[1]), int(match[2])


def key_values(assignments: Sequence[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` arguments as (key, value), trimmed; a usage error for one without ``=`` or
    a key given twice (which value would win is not the user's to guess), before anything is set."""
    pairs: list[tuple[str, str]] = []
    for assignment in assignments:
        key, eq, value = assignment.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CommandError(f"{assignment!r}: expected key=value", EXIT_USAGE)
        if key in (k for k, _ in pairs):
            raise CommandError(f"{key} is given twice; give each key once (nothing was set)", EXIT_USAGE)
        pairs.append((key, value.strip()))
    return pairs


# Set by a finished `kts sync`: the process leaves without the interpreter's teardown (the Spark
# Connect client's channels, Dagster's threads, module finalisers: ~0.7 s of a no-op sync's ~7 s).
# Everything the pass wrote is committed by then, and stdout/stderr are flushed first.
_leave_without_teardown = [False]


def leave_without_teardown() -> None:
    """Ask :func:`kts_assets.cli.main.run_here` to end this process without the interpreter's teardown."""
    _leave_without_teardown[0] = True


def leaving_without_teardown() -> bool:
    return _leave_without_teardown[0]
