"""The remote tier named by ``KTS_REMOTE_URI`` (ARCHITECTURE.md's environment contract)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

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
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment or not parts.path:
            raise ValueError(f"remote tier {uri!r}: expected file:///absolute/path")
        return FileSystemRemoteStorage(Path(unquote(parts.path)))
    if parts.scheme == "s3":
        from kts_resources.remote_storage.s3 import S3RemoteStorage  # boto3 only when S3 is used

        return S3RemoteStorage.from_uri(uri)
    raise ValueError(f"remote tier {uri!r}: expected file:///path or s3://bucket/prefix")
