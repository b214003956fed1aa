"""The remote tier: one interface (Kafka's RemoteStorageManager), a filesystem and an S3 backend.

``S3RemoteStorage`` is imported on first use so that importing this package does not load boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kts_resources.remote_storage.base import (
    ChecksumMismatch,
    ObjectInfo,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
    SourceChangedError,
    StoredObject,
    custom_metadata_fields,
    segment_custom_metadata,
    stored_objects,
)
from kts_resources.remote_storage.factory import default_remote_uri, remote_storage_from_uri
from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage
from kts_resources.remote_storage.keys import ObjectKeys, ParsedObjectKey

if TYPE_CHECKING:
    from kts_resources.remote_storage.s3 import S3RemoteStorage

__all__ = [
    "ChecksumMismatch",
    "FileSystemRemoteStorage",
    "ObjectInfo",
    "ObjectKeys",
    "ParsedObjectKey",
    "RemoteResourceNotFoundError",
    "RemoteStorageError",
    "RemoteStorageManager",
    "S3RemoteStorage",
    "SourceChangedError",
    "StoredObject",
    "custom_metadata_fields",
    "default_remote_uri",
    "remote_storage_from_uri",
    "segment_custom_metadata",
    "stored_objects",
]


def __getattr__(name: str) -> Any:
    if name == "S3RemoteStorage":
        from kts_resources.remote_storage.s3 import S3RemoteStorage

        return S3RemoteStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
