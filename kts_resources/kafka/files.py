"""File primitives shared by the format code: zero-copy reads and crash-safe replacement."""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def mapped(path: str | os.PathLike | BinaryIO) -> Iterator[memoryview]:
    """A read-only view of a whole file (a path, or a file already open) without copying it
    (segments can be a GiB)."""
    with open(path, "rb") if isinstance(path, (str, os.PathLike)) else nullcontext(path) as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                yield view
            finally:
                view.release()


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old file or the new one, never a mix.

    Kafka's sequence: ``<name>.tmp`` beside the target, flush + fsync, rename over the target,
    fsync the directory (so the rename itself survives a power loss). The fixed temporary name means
    a crash's leftover is simply overwritten next time; readers skip ``.tmp`` files.
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable; Windows cannot open a directory, and Kafka skips it there too."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
