"""The remote tier as a local (or mounted) directory: the default, and what tests and benchmarks use.

Objects become visible atomically (temporary name, fsync, rename, fsync the directory), so a crash
leaves the old state or the new one. Every path is walked one directory at a time with O_NOFOLLOW
from an open descriptor of the root, so no symbolic link — planted before or swapped in during an
operation — can lead a read, write or delete out of the root.

Broker data is private (a broker keeps it 0600 in 0700 dirs), so is the tier: directories are
created 0700 and objects 0600, exactly, whatever the umask or the source file's mode, unless
``dir_mode``/``file_mode`` say otherwise (``file:///path?dir_mode=0750&file_mode=0640``).
Directories that already exist keep their mode.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from kts_resources.kafka.crc import crc32c

from kts_resources.remote_storage.base import (
    ObjectInfo,
    RangeReader,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
    StoredObject,
    UploadSource,
)
from kts_resources.private_dirs import make_dirs
from kts_resources.remote_storage.keys import ObjectKeys, check_object_key

# Temporary files are hidden (leading dot) and carry this suffix: never listed as objects, and
# removed by abort_incomplete_uploads or by deleting the segment they belong to.
TMP_SUFFIX = ".kts-tmp"

WRITEBACK_WINDOW = 64 * 1024 * 1024
# A file is copied in large chunks, read into one buffer per copying thread (FileSource; never
# mapped, so a truncation underneath cannot SIGBUS): each preadv(), crc32c() and write() call frees
# the GIL for its whole chunk, and the fewer the calls, the less the copy waits to get the GIL back
# from the thread verifying the next segment.
FILE_COPY_CHUNK_SIZE = WRITEBACK_WINDOW
_FADVISE = hasattr(os, "posix_fadvise")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

DEFAULT_DIR_MODE = 0o700
DEFAULT_FILE_MODE = 0o600


def _is_tmp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


class FileSystemRemoteStorage(RemoteStorageManager):
    """Objects as files under ``root`` (``root/<key>``), keys laid out by ``ObjectKeys(prefix)``."""

    def __init__(
        self,
        root: str | os.PathLike,
        prefix: str = "",
        *,
        chunk_size: int = FILE_COPY_CHUNK_SIZE,
        dir_mode: int = DEFAULT_DIR_MODE,
        file_mode: int = DEFAULT_FILE_MODE,
    ):
        # absolute() rather than resolve(): the configured root may itself be a link (a mount
        # point); what must never be followed are links found *inside* it.
        self.root = Path(root).expanduser().absolute()
        self.keys = ObjectKeys(prefix)
        if chunk_size < 4096:
            raise ValueError(f"copy chunk size {chunk_size} is too small")
        self.chunk_size = chunk_size
        # kts itself must still list, write and read what it creates.
        if not 0 <= dir_mode <= 0o777 or dir_mode & 0o700 != 0o700:
            raise ValueError(f"dir_mode {dir_mode:#o}: expected an octal mode from 0700 to 0777 (the owner needs rwx)")
        if not 0 <= file_mode <= 0o777 or file_mode & 0o600 != 0o600:
            raise ValueError(f"file_mode {file_mode:#o}: expected an octal mode from 0600 to 0777 (the owner needs rw)")
        self.dir_mode = dir_mode
        self.file_mode = file_mode

    def __repr__(self) -> str:
        return f"FileSystemRemoteStorage({self.location(self.keys.root)!r})"

    def location(self, key: str = "") -> str:
        return (self.root / key).as_uri() if key else self.root.as_uri()

    # --- directories, walked without following links ---

    @contextmanager
    def _directory(self, parts: list[str], create: bool) -> Iterator[int]:
        if create:
            make_dirs(self.root, self.dir_mode)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                child = _open_subdirectory(fd, part, self.dir_mode if create else None)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _open_file(self, key: str) -> Iterator[int]:
        fd = self._open_file_fd(key)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_file_fd(self, key: str) -> int:
        *parts, name = check_object_key(key).split("/")
        with self._directory(parts, create=False) as dfd:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RemoteResourceNotFoundError(f"{self.location(key)}: not a regular file")
        return fd

    def _error(self, key: str, e: OSError) -> RemoteStorageError:
        where = self.location(key)
        if isinstance(e, FileNotFoundError):
            return RemoteResourceNotFoundError(f"{where}: no such object")
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return RemoteStorageError(f"{where}: a symbolic link or file is in the way; the remote tier never follows links")
        return RemoteStorageError(f"{where}: {e.strerror or e}")

    # --- the backend primitives ---

    def _put_object(self, key: str, source: UploadSource) -> StoredObject:
        *parts, name = check_object_key(key).split("/")
        try:
            with self._directory(parts, create=True) as dfd:
                tmp = f".{name}.{secrets.token_hex(8)}{TMP_SUFFIX}"
                fd = os.open(tmp, _CREATE_FLAGS, self.file_mode, dir_fd=dfd)
                published = False
                try:
                    os.fchmod(fd, self.file_mode)  # open()'s mode is masked by the umask
                    crc, size = self._copy_into(fd, source)
                    source.finish(size)
                    source.check_crc32c(crc, self.location(key))
                    os.fsync(fd)
                    # Cheap and sound: the CRC covers exactly the bytes handed to write(); the
                    # file's size says the file system kept all of them.
                    on_disk = os.fstat(fd).st_size
                    if on_disk != size:
                        raise RemoteStorageError(f"{self.location(key)}: wrote {size} bytes, the file has {on_disk}")
                    os.close(fd)
                    fd = -1
                    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    published = True
                    os.fsync(dfd)  # the rename itself survives a power loss
                finally:
                    if fd >= 0:
                        os.close(fd)
                    if not published:
                        try:
                            os.unlink(tmp, dir_fd=dfd)
                        except OSError:
                            pass  # abort_incomplete_uploads will find it
        except RemoteStorageError:
            raise
        except OSError as e:
            raise self._error(key, e) from e
        return StoredObject(key, size, crc)

    def _copy_into(self, fd: int, source: UploadSource) -> tuple[int, int]:
        """One pass: read a chunk, CRC it, write it. Returns (crc, bytes)."""
        crc = size = flushed = 0
        with closing(source.chunks(self.chunk_size)) as chunks:  # unmaps at once on failure too
            for chunk in chunks:
                crc = crc32c(chunk, crc)
                n = len(chunk)
                written = 0
                while written < n:
                    written += os.write(fd, chunk[written:])
                size += n
                if size - flushed >= WRITEBACK_WINDOW and _FADVISE:
                    # Start writing back what is written while the next window is copied, so the
                    # closing fsync has little left to wait for, and keep the copy from pushing
                    # the broker's segments out of the page cache.
                    os.posix_fadvise(fd, flushed, size - flushed, os.POSIX_FADV_DONTNEED)
                    flushed = size
        return crc, size

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        try:
            with self._open_file(key) as fd:
                size = os.fstat(fd).st_size
                stop = size if end is None else min(end + 1, size)
                return _pread_exactly(fd, start, stop - start) if start < stop else b""
        except OSError as e:
            raise self._error(key, e) from e

    def _open_range(self, key: str, start: int, end: int | None) -> RangeReader:
        try:
            fd = self._open_file_fd(key)
            size = os.fstat(fd).st_size
        except OSError as e:
            raise self._error(key, e) from e
        stop = size if end is None else min(end + 1, size)
        return _PreadReader(fd, start, max(start, stop))

    def _get_object(self, key: str) -> bytes:
        try:
            with self._open_file(key) as fd:
                return _pread_exactly(fd, 0, os.fstat(fd).st_size)
        except OSError as e:
            raise self._error(key, e) from e

    def _delete_objects(self, keys: list[str]) -> dict[str, str]:
        # One pass per directory (a partition's objects share one): one listing, which says which
        # of the names are there (only those are unlinked) and finds leftovers; one fsync.
        by_directory: dict[tuple[str, ...], set[str]] = defaultdict(set)
        for key in keys:
            *parts, name = check_object_key(key).split("/")
            by_directory[tuple(parts)].add(name)
        failed: dict[str, str] = {}
        for parts, names in by_directory.items():
            where = "/".join(parts) + "/"
            try:
                with self._directory(list(parts), create=False) as dfd:
                    # Leftovers of an interrupted upload of these keys go with them.
                    present, leftovers = [], []
                    for n in os.listdir(dfd):
                        if n in names:
                            present.append(n)
                        elif _is_tmp(n) and n[1:].rsplit(".", 2)[0] in names:
                            leftovers.append(n)
                    removed = False
                    for name in [*sorted(present), *leftovers]:
                        try:
                            os.unlink(name, dir_fd=dfd)
                            removed = True
                        except FileNotFoundError:
                            pass
                        except OSError as e:
                            if name in names:  # a leftover that stays is the scrub's to find
                                failed[where + name] = e.strerror or str(e)
                    if removed:
                        os.fsync(dfd)
            except FileNotFoundError:
                continue  # the whole directory is gone: so are the objects
            except OSError as e:
                raise self._error(where, e) from e
        return failed

    def _walk(self, top: str) -> Iterator[tuple[str, str, int]]:
        """(directory key prefix, file name, dir fd) for every entry under the directory ``top``."""
        parts = [p for p in top.split("/") if p]
        try:
            with self._directory(parts, create=False) as dfd:
                base = "".join(p + "/" for p in parts)
                # fwalk never descends into a linked directory; linked files are skipped below.
                for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=dfd, follow_symlinks=False):
                    dirnames.sort()
                    rel = "" if dirpath == "." else dirpath[2:] + "/"
                    for name in sorted(filenames):
                        yield base + rel, name, dirfd
        except FileNotFoundError:
            return
        except OSError as e:
            raise self._error(top, e) from e

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._list_prefix(prefix)
        for directory, name, dirfd in self._walk(full.rpartition("/")[0]):
            key = directory + name
            if _is_tmp(name) or not key.startswith(full):
                continue
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                check_object_key(key)
            except (FileNotFoundError, ValueError):
                continue  # deleted meanwhile, or a name kts never writes
            if stat.S_ISREG(st.st_mode):
                yield ObjectInfo(key, st.st_size, st.st_mtime, f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}")

    def abort_incomplete_uploads(self, older_than_s: float) -> int:
        """Remove temporary files of interrupted uploads (a crash mid-copy) older than ``older_than_s``."""
        cutoff = time.time() - older_than_s
        removed = 0
        for _directory, name, dirfd in self._walk(self.keys.prefix):
            if not _is_tmp(name):
                continue
            try:
                if os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mtime <= cutoff:
                    os.unlink(name, dir_fd=dirfd)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed

    def check_access(self) -> None:
        """The root exists (or can be made) and takes a new file."""
        try:
            with self._directory([], create=True) as dfd:
                probe = f".access-check.{secrets.token_hex(8)}{TMP_SUFFIX}"
                os.close(os.open(probe, _CREATE_FLAGS, 0o600, dir_fd=dfd))
                os.unlink(probe, dir_fd=dfd)
        except OSError as e:
            raise RemoteStorageError(f"{self.location()}: the remote tier is not writable: {e.strerror or e}") from e


def _open_subdirectory(fd: int, name: str, create_mode: int | None) -> int:
    """The directory ``name`` in ``fd``, opened; created with ``create_mode`` when missing and a
    mode is given."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if create_mode is None:
            raise
    try:
        os.mkdir(name, create_mode, dir_fd=fd)
    except FileExistsError:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)  # a concurrent copy made it first
    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    os.fchmod(child, create_mode)  # mkdir's mode is masked by the umask
    os.fsync(fd)  # the new directory's entry survives a power loss
    return child


def _pread_exactly(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes from ``offset`` (fewer if the file ends first): one read into a fresh bytes
    object in the common case, no zero-filled buffer and no copy."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break  # the file shrank meanwhile: return what is there
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _PreadReader(RangeReader):
    """Bytes [start, stop) of an open file, read with pread (no shared file position)."""

    def __init__(self, fd: int, start: int, stop: int):
        super().__init__()
        self._fd = fd
        self._pos = start
        self._stop = stop

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = min(len(buffer), self._stop - self._pos)
        if n <= 0:
            return 0
        got = os.preadv(self._fd, [memoryview(buffer)[:n]], self._pos)
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()
