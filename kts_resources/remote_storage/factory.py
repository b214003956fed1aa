"""The remote tier named by ``KTS_REMOTE_URI`` (ARCHITECTURE.md's environment contract)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from kts_resources.remote_storage.base import RemoteStorageManager
from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage
from kts_resources.settings import kts_home

REMOTE_URI_ENV = "KTS_REMOTE_URI"


def default_remote_uri() -> str:
    """``$KTS_REMOTE_URI``, else the directory ``KTS_HOME/remote``."""
    return os.environ.get(REMOTE_URI_ENV) or (kts_home() / "remote").absolute().as_uri()


def remote_storage_from_uri(uri: str | None = None) -> RemoteStorageManager:
    """``file:///path`` → FileSystemRemoteStorage, ``s3://bucket/prefix`` → S3RemoteStorage (boto3,
    ``KTS_S3_ENDPOINT_URL`` for S3-compatible stores); None → ``default_remote_uri()``.
    Nothing is contacted yet: call ``check_access()`` for an early, clear error."""
    uri = uri or default_remote_uri()
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or parts.fragment or not parts.path:
            raise ValueError(f"remote tier {uri!r}: expected file:///absolute/path")
        try:
            return FileSystemRemoteStorage(Path(unquote(parts.path)), **_file_modes(uri, parts.query))
        except ValueError as e:
            raise ValueError(f"remote tier {uri!r}: {e}") from None
    if parts.scheme == "s3":
        from kts_resources.remote_storage.s3 import S3RemoteStorage  # boto3 only when S3 is used

        return S3RemoteStorage.from_uri(uri)
    raise ValueError(f"remote tier {uri!r}: expected file:///path or s3://bucket/prefix")


FILE_URI_MODES = ("dir_mode", "file_mode")


def _file_modes(uri: str, query: str) -> dict[str, int]:
    """``?dir_mode=0750&file_mode=0640`` (octal) of a ``file://`` URI; nothing else is accepted."""
    modes = {}
    try:
        fields = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"query {query!r}: expected dir_mode=0700&file_mode=0600") from None
    for name, value in fields:
        if name not in FILE_URI_MODES:
            raise ValueError(f"unknown parameter {name!r} (expected {' or '.join(FILE_URI_MODES)})")
        try:
            modes[name] = int(value, 8)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an octal mode such as 0700") from None
    return modes
