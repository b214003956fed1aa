"""A size-bounded on-disk cache of remote chunks (the byte ranges a fetch reads with one GET),
under ``KTS_HOME/chunk-cache``, shared by every process on the machine.

Each chunk is one file named by a digest of (object key, position, length). Writes go to a
temporary name and are renamed into place, so a reader sees a whole chunk or none; a hit touches
the file's modification time, which is the recency eviction goes by: when the files pass
``max_bytes``, the least recently used go first. No lock is held across processes: a chunk another
process evicts between listing and reading is a miss, and two processes filling the same chunk
write the same bytes. A cached chunk is not trusted more than the tier: the reader CRC-checks its
batches as it does a fresh one, and drops a chunk that fails (``discard``).

Writing behind (``write_behind``, `kts serve`): ``put`` hands the chunk to a writer thread and
returns, so the fetch that read it does not wait for the disk (measured: most of a cold 1 MiB
remote fetch's time in the server). Until written, the chunk is served from memory; what waits to
be written is bounded (past it a chunk goes uncached), and a crash loses only chunks not written
yet: a write cut short leaves a temporary file no reader looks at, removed by a later eviction.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 1024 * 1024 * 1024
# Eviction looks at the directory after this many bytes were added since it last did.
_CHECK_EVERY_BYTES = 32 * 1024 * 1024
# A temporary file this old is a write a crash cut short (a live one takes milliseconds).
STALE_TMP_S = 600


class ChunkCache:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes <= 0:
            raise ValueError(f"chunk cache size {max_bytes} is not positive")
        self.directory = Path(directory)
        self._write_failed = False
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        self._added = 0
        self._lock = threading.Lock()
        # Writing behind: chunks waiting for the writer thread, by (key, position, length).
        self._pending: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._pending_bytes = 0
        self._behind_max = 0
        self._queued = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._closing = False

    def write_behind(self, max_pending_bytes: int) -> None:
        """From now on ``put`` leaves the write to a thread of the cache's own, holding at most
        ``max_pending_bytes`` of chunks not written yet (``close`` writes them and stops it)."""
        with self._lock:
            self._behind_max = max_pending_bytes
            self._closing = False
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_pending, name="kts-chunk-cache", daemon=True)
                self._writer.start()

    def close(self) -> None:
        """Write what waits to be written, then stop writing behind."""
        with self._lock:
            self._closing = True
            writer, self._writer = self._writer, None
            self._queued.notify_all()
        if writer is not None:
            writer.join()

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._queued.wait()
                if not self._pending:
                    return
                (key, position, length), data = next(iter(self._pending.items()))
            self._write(key, position, length, data)
            with self._lock:  # served from memory until now: the file is whole from here on
                if self._pending.pop((key, position, length), None) is not None:
                    self._pending_bytes -= length

    def _path(self, key: str, position: int, length: int) -> Path:
        digest = hashlib.sha256(f"{key}\0{position}\0{length}".encode()).hexdigest()
        return self.directory / digest[:2] / digest

    def get(self, key: str, position: int, length: int) -> bytes | None:
        if self._pending:
            with self._lock:
                data = self._pending.get((key, position, length))
            if data is not None:
                self.hits += 1
                return data
        path = self._path(key, position, length)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)  # recency for eviction
        except FileNotFoundError:
            self.misses += 1
            return None
        if len(data) != length:  # not ours to trust
            self.discard(key, position, length)
            self.misses += 1
            return None
        self.hits += 1
        return data

    def put(self, key: str, position: int, length: int, data: bytes) -> None:
        if len(data) != length or length > self.max_bytes:
            return
        if self._behind_max:
            with self._lock:
                if self._writer is not None and not self._closing:
                    if (key, position, length) not in self._pending and self._pending_bytes + length <= self._behind_max:
                        self._pending[(key, position, length)] = data
                        self._pending_bytes += length
                        self._queued.notify()
                    return  # queued, already queued, or past the bound: the read has its bytes either way
        self._write(key, position, length, data)

    def _write(self, key: str, position: int, length: int, data: bytes) -> None:
        path = self._path(key, position, length)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            # A full or read-only KTS_HOME: the read already has its bytes; only the cache goes without.
            tmp.unlink(missing_ok=True)
            if not self._write_failed:  # once: every later chunk would say the same
                self._write_failed = True
                log.warning("chunk cache %s: reading without caching (%s)", self.directory, e.strerror or e)
            return
        with self._lock:
            self._added += length
            check = self._added >= min(_CHECK_EVERY_BYTES, self.max_bytes // 4 or 1)
            if check:
                self._added = 0
        if check:
            self.evict()

    def discard(self, key: str, position: int, length: int) -> None:
        self._path(key, position, length).unlink(missing_ok=True)

    def size(self) -> int:
        return sum(size for _path, size, _mtime in self._files())

    def _files(self, stale_before: float | None = None) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every chunk; with ``stale_before``, temporary files older than it are removed."""
        out = []
        try:
            subdirs = list(os.scandir(self.directory))
        except FileNotFoundError:
            return out
        for sub in subdirs:
            if not sub.is_dir():
                continue
            try:
                entries = list(os.scandir(sub.path))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    if stale_before is not None and entry.name.endswith(".tmp"):
                        try:
                            if entry.stat().st_mtime < stale_before:
                                os.unlink(entry.path)
                        except FileNotFoundError:
                            pass
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # evicted by another process meanwhile
                out.append((Path(entry.path), st.st_size, st.st_mtime))
        return out

    def evict(self) -> int:
        """Remove least recently used chunks until the cache is within ``max_bytes``; returns how many.
        Temporary files of writes a crash cut short go too."""
        files = self._files(stale_before=time.time() - STALE_TMP_S)
        total = sum(size for _p, size, _m in files)
        removed = 0
        for path, size, _mtime in sorted(files, key=lambda f: f[2]):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed
