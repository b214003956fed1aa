"""Many partitions' views and retention plans from a few store queries: what a sensor tick over
thousands of partitions reads.

``partition_view`` and ``expiry.plan_partition`` read a partition's store rows on their own, a few
transactions a partition: at 4,000 partitions that is seconds of round trips. Here the rows of a
chunk of partitions come in one query each (``partition_states_of``, ``finished_segments_of``),
the topics' configs and the broker's once, and the plans are the same ``plan_partition`` over
views holding those rows. The chunk bounds the rows held at once (a partition may have many remote
segments); the log dir is still read a partition at a time (its listing, leader epochs, time
indexes), as the per-partition functions read it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

from kts_resources.remote_log import RemoteResourceNotFoundError, TopicIdPartition
from kts_resources.tiering.expiry import PartitionRetention, plan_partition
from kts_resources.tiering.partition_view import PartitionView, partition_view
from kts_resources.tiering.retention import RetentionConfig
from kts_resources.tiering.tiers import LocatedPartition

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore

# Partitions whose store rows are read in one query (and held at once): a sensor tick works
# through a few hundred partitions in its time budget, and rows read past it are wasted.
PARTITIONS_PER_QUERY = 250
K = TypeVar("K")  # how the caller names a located partition (its key, or its place in a listing)


def partition_views(located: Mapping[K, LocatedPartition], store: "RemoteLogMetadataStore", *,
                    chunk: int = PARTITIONS_PER_QUERY, alarms: bool = False) -> Iterator[tuple[K, PartitionView | Exception]]:
    """Each located partition's view, in ``located``'s order, with its store rows (state, finished
    segments; with ``alarms``, also its open lost ranges and damaged segments, which
    ``partition_numbers`` reports) read a chunk of partitions per query. The topic id is partition.metadata's, else the
    one the store recorded for the name (``tiers.topic_id_partition``); a view's ``tip`` is None
    when kts has never seen the topic. A partition.metadata that cannot be read is that key's
    exception, in place of its view."""
    topic_ids: dict[str, uuid.UUID] | None = None  # the store's, read once if a partition has no partition.metadata
    keys = list(located)
    for first in range(0, len(keys), chunk):
        tips: dict[K, TopicIdPartition | None | Exception] = {}
        for key in keys[first:first + chunk]:
            partition = located[key].partition
            try:
                metadata = partition.metadata()
            except Exception as e:  # noqa: BLE001 - this partition's outcome; the others go on
                tips[key] = e
                continue
            if metadata is not None:
                topic_id = metadata.topic_id
            else:
                topic_ids = store.topics() if topic_ids is None else topic_ids
                topic_id = topic_ids.get(partition.topic)
            tips[key] = None if topic_id is None else TopicIdPartition(topic_id, partition.topic_partition)
        known = [tip for tip in tips.values() if isinstance(tip, TopicIdPartition)]
        states = store.partition_states_of(known)
        finished = store.finished_segments_of(known)
        lost = store.lost_ranges_of(known) if alarms else {}
        damaged = store.damaged_counts_of(known) if alarms else {}
        for key, tip in tips.items():
            if isinstance(tip, Exception):
                yield key, tip
            elif tip is None:  # nothing of it can be remote: no store rows to read
                yield key, partition_view(located[key], None, topic_partition=located[key].partition.topic_partition)
            else:
                yield key, partition_view(located[key], store, tip=tip, state=states[tip], finished=finished[tip],
                                          lost_ranges=lost.get(tip), damaged_remote_segments=damaged.get(tip))


def retention_plans(located: Mapping[str, LocatedPartition], store: "RemoteLogMetadataStore", *, now_ms: int,
                    chunk: int = PARTITIONS_PER_QUERY) -> Iterator[tuple[str, PartitionRetention | None | Exception]]:
    """Each located partition's retention plan (``plan_partition``), in ``located``'s order: None
    when kts has never seen its topic (nothing remote to plan), its exception when planning failed."""
    topic_configs = store.all_topic_configs()
    broker = store.broker_configs()
    configs: dict[str, RetentionConfig] = {}
    for key, view in partition_views(located, store, chunk=chunk):
        if isinstance(view, Exception) or view.tip is None:
            yield key, None if not isinstance(view, Exception) else view
            continue
        topic = view.tip.topic
        try:
            if topic not in configs:
                if topic not in topic_configs:
                    raise RemoteResourceNotFoundError(f"topic {topic!r} is not known to the metadata store")
                configs[topic] = RetentionConfig.from_topic_config(topic_configs[topic], topic, broker)
            yield key, plan_partition(located[key], view.tip, store, now_ms=now_ms, view=view, config=configs[topic])
        except Exception as e:  # noqa: BLE001 - this partition's outcome; the others go on
            yield key, e
