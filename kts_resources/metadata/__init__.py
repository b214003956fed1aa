"""The remote log metadata store (KIP-405's RemoteLogMetadataManager) on PostgreSQL.

- ``store.RemoteLogMetadataStore``: the operations (segments, partitions, topics, events, locks);
- ``topic_config.TopicConfig``: topic configs under Kafka's names and Kafka's validation rules;
- ``database``: the URL (``KTS_DATABASE_URL`` or the embedded server), engine, retries, migrations;
- ``embedded``: the embedded PostgreSQL under ``KTS_HOME`` when no URL is configured;
- ``models`` + ``migrations/``: the tables (``models.quota_samples`` is the KIP-956 quota table).

No Dagster here: the Dagster resource wraps this package, not the other way round.
"""

from __future__ import annotations

import importlib

# Where each name lives. Resolved on first use (PEP 562), so a light module of this package
# (lineage, quota_config) can be imported without SQLAlchemy and the store: `kts fetch` and
# `kts offsets` build their parser from the reader, which needs those two, in milliseconds.
_HOME = {
    **dict.fromkeys(["MetadataStoreMisconfigured", "MetadataStoreUnavailable", "create_engine", "database_url",
                     "migrate"], "database"),
    **dict.fromkeys(["DuplicateRemoteLogSegmentIdError", "Event", "EventKind", "PartitionLock", "PartitionLockLost",
                     "PartitionLockTimeout", "PartitionState", "RemoteLogMetadataStore",
                     "RemoteResourceNotFoundError", "StaleTopicIdError"], "store"),
    **dict.fromkeys(["InvalidTopicConfig", "TopicConfig", "tiering_enabled"], "topic_config"),
}


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DuplicateRemoteLogSegmentIdError",
    "Event",
    "EventKind",
    "InvalidTopicConfig",
    "MetadataStoreMisconfigured",
    "MetadataStoreUnavailable",
    "PartitionLock",
    "PartitionLockLost",
    "PartitionLockTimeout",
    "PartitionState",
    "RemoteLogMetadataStore",
    "RemoteResourceNotFoundError",
    "StaleTopicIdError",
    "TopicConfig",
    "create_engine",
    "database_url",
    "migrate",
    "tiering_enabled",
]
