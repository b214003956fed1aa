"""The topics `kts serve` leads: every partition the metadata store holds of a topic's current
incarnation (tiered partitions), and every partition of the log dirs. Read afresh for each
Metadata request, so a topic that appears (a new log dir entry, a first copy) is served at once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from kts_resources.tiering.tiers import log_dir_partitions

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore

ZERO_UUID = uuid.UUID(int=0)


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID = ZERO_UUID  # Kafka's zero UUID when no store or partition.metadata names one
    partitions: set[int] = field(default_factory=set)


def read_catalog(log_dirs: Sequence[Path], store: "RemoteLogMetadataStore | None") -> dict[str, Topic]:
    """Topic name → its id and partitions, from the store and the log dirs."""
    topics: dict[str, Topic] = {}
    if store is not None:
        current = store.topics()
        for name, topic_id in current.items():
            topics[name] = Topic(name, topic_id)
        for tip in store.partitions():
            topic = topics.get(tip.topic_partition.topic)
            if topic is not None and topic.topic_id == tip.topic_id:  # not an old incarnation's
                topic.partitions.add(tip.topic_partition.partition)
    for located in log_dir_partitions(log_dirs):
        tp = located.partition.topic_partition
        topic = topics.setdefault(tp.topic, Topic(tp.topic))
        topic.partitions.add(tp.partition)
        if topic.topic_id == ZERO_UUID:
            try:
                metadata = located.partition.metadata()
            except (OSError, ValueError):
                metadata = None  # unreadable: the topic is still served, by name
            if metadata is not None:
                topic.topic_id = metadata.topic_id
    return {name: topic for name, topic in topics.items() if topic.partitions}
