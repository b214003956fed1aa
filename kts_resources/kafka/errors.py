"""Errors raised for bad bytes in Kafka files: each names the file and the byte position."""

from __future__ import annotations

import os

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {ord("\\"): "\\\\", 10: "\\n", 13: "\\r", 9: "\\t"}


def shown(path: str | os.PathLike) -> str:
    """A path as an error line shows it: control characters escaped (``\\n``, ``\\x1b``), so a
    newline in a directory name cannot split the one line a user reads, nor a name paint the terminal."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    return text.translate(_CONTROL) if any(ord(c) < 0x20 or c in "\x7f\\" for c in text) else text


def os_error_line(e: OSError) -> str:
    """``<path>: <what the system said>``, e.g. ``/mnt/ro/orders-0: read-only file system``; the
    message itself when kts formed it (no errno)."""
    if not e.strerror:
        return str(e)
    where = f"{shown(e.filename)}: " if isinstance(e.filename, (str, bytes, os.PathLike)) else ""
    return f"{where}{e.strerror.lower()}"


def error_line(e: BaseException) -> str:
    """An error as one line of a report: its message with every run of whitespace (the newlines
    of boto3's or psycopg2's messages) one space, or its type's name when it has no message."""
    return " ".join(str(e).split()) or type(e).__name__


class KafkaFormatError(Exception):
    """Bytes that do not follow Kafka's format, located by file and byte position."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, position: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.position = position

    def located(self, path: str | os.PathLike | None = None, position: int | None = None) -> "KafkaFormatError":
        """The same error with a file and/or position filled in where it was not known yet."""
        return type(self)(
            self.message,
            path=self.path if self.path is not None else path,
            position=self.position if self.position is not None else position,
        )

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(shown(self.path))
        if self.position is not None:
            where.append(f"byte {self.position}")
        return ": ".join([*where, self.message])


class CorruptRecordError(KafkaFormatError):
    """A record batch that fails its CRC or whose contents cannot be decoded."""


class CodecError(KafkaFormatError):
    """Compressed data that the batch's codec cannot decompress."""


class IndexFormatError(KafkaFormatError):
    """An .index, .timeindex or .txnindex file that is not a whole number of valid entries."""


class CheckpointError(KafkaFormatError):
    """A checkpoint, partition.metadata or producer snapshot file that is malformed."""


class FileChangedError(KafkaFormatError):
    """A file that shrank while kts read it (a broker truncates its log after a leader change)."""
