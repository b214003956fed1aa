"""File primitives shared by the format code: zero-copy reads and crash-safe replacement."""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import FileChangedError, KafkaFormatError

# segment.bytes and segment.index.bytes are Java ints: no file a broker writes is larger.
MAX_KAFKA_FILE_BYTES = 2**31 - 1
_READ_CHUNK = 8 * 1024 * 1024


_allocator_tuned = False


def keep_large_buffers_in_the_heap() -> None:
    """Let glibc serve multi-MiB buffers from its heap and keep them there once freed.

    By default an allocation over the (dynamic) mmap threshold gets fresh pages from the kernel
    and gives them back when freed, so a reader that keeps two or three 8 MiB chunks alive (one in
    use, one prefetched) page-faults its way through every chunk: measured here, reading cached
    segment bytes in 8 MiB chunks ran at 5.6 GB/s with three chunks alive and 2.3 GB/s with twenty,
    against 9.5 GB/s with one, and 11 GB/s in every case with these settings. The cost: up to
    256 MiB freed stays with the process for reuse. glibc only; elsewhere nothing changes.
    Idempotent; kts's reading processes call it (TieredLogReader)."""
    global _allocator_tuned
    if _allocator_tuned:
        return
    _allocator_tuned = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        libc.mallopt(m_mmap_threshold, 64 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 256 * 1024 * 1024)
    except (OSError, AttributeError):
        pass  # not glibc: its own allocator's defaults stand


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


def read_whole(path: str | os.PathLike, *, what: str, limit: int = MAX_KAFKA_FILE_BYTES) -> memoryview:
    """A file's bytes, read (not mapped) in chunks, for readers a concurrent truncate may meet.

    A mapped file truncated underneath raises SIGBUS on the next touch, which no Python code can
    catch; a read just comes back short, which is reported as :class:`FileChangedError`. A file
    larger than ``limit`` is refused before anything is allocated.
    """
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise KafkaFormatError(
                f"{what} is {size:,} bytes, larger than any Kafka writes ({limit:,}: segment.bytes and "
                "segment.index.bytes are 32-bit ints); not read", path=path)
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got : got + _READ_CHUNK])
            if not n:
                now = os.fstat(f.fileno()).st_size
                raise FileChangedError(
                    f"{what} shrank from {size:,} to {now:,} bytes while being read (truncated underneath, "
                    "as a broker truncates its log after a leader change); read it again", path=path, position=got)
            got += n
    return view


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


def file_tree(path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """(relative name, size, modification time ns) of each file under ``path``, sorted; [] when
    absent: a cheap look at whether anything under it changed (what a digest or a re-read needs)."""
    root_path = Path(path)
    out = []
    for root, _dirs, files in os.walk(root_path):
        for name in files:
            p = Path(root) / name
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((str(p.relative_to(root_path)), st.st_size, st.st_mtime_ns))
    return sorted(out)
