"""The remote log metadata store (KIP-405's RemoteLogMetadataManager) on PostgreSQL.

- ``store.RemoteLogMetadataStore``: the operations (segments, partitions, topics, events, locks);
- ``topic_config.TopicConfig``: topic configs under Kafka's names and Kafka's validation rules;
- ``database``: the URL (``KTS_DATABASE_URL`` or the embedded server), engine, retries, migrations;
- ``embedded``: the embedded PostgreSQL under ``KTS_HOME`` when no URL is configured;
- ``models`` + ``migrations/``: the tables (``models.quota_samples`` is the KIP-956 quota table).

No Dagster here: the Dagster resource wraps this package, not the other way round.
"""

from __future__ import annotations

from kts_resources.metadata.database import (
    MetadataStoreMisconfigured,
    MetadataStoreUnavailable,
    create_engine,
    database_url,
    migrate,
)
from kts_resources.metadata.store import (
    DuplicateRemoteLogSegmentIdError,
    Event,
    EventKind,
    PartitionLock,
    PartitionLockLost,
    PartitionLockTimeout,
    PartitionState,
    RemoteLogMetadataStore,
    RemoteResourceNotFoundError,
    StaleTopicIdError,
)
from kts_resources.metadata.topic_config import InvalidTopicConfig, TopicConfig, tiering_enabled

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
