"""A topic-partition: the one value type kts uses for "which partition", and Kafka's naming rules.

The directory name and the Dagster partition key are both ``<topic>-<partition>``; topic names
may contain ``-`` and ``.``, so the split is always on the LAST ``-``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Kafka's Topic.LEGAL_CHARS and MAX_NAME_LENGTH.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITION = 2**31 - 1  # a partition id is a Java int


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A partition of a topic; orders by topic, then partition number."""

    topic: str
    partition: int

    @property
    def dir_name(self) -> str:
        """``<topic>-<partition>``: the partition's directory under a log dir (and kts's partition key)."""
        return f"{self.topic}-{self.partition}"

    def __str__(self) -> str:
        return self.dir_name


class HasTopicPartition:
    """``topic`` and ``partition`` of a value that names its partition by a ``topic_partition``
    field (a partition directory, a partition with its topic id)."""

    __slots__ = ()
    topic_partition: TopicPartition

    @property
    def topic(self) -> str:
        return self.topic_partition.topic

    @property
    def partition(self) -> int:
        return self.topic_partition.partition


def topic_name_problem(topic: str) -> str | None:
    """Why ``topic`` is not a legal Kafka topic name, or None when it is."""
    if topic in (".", ".."):
        return f"topic name {topic!r} is not allowed"
    if not _LEGAL_TOPIC.fullmatch(topic):
        if not topic:
            return "topic name is empty"
        if len(topic) > MAX_TOPIC_NAME_LENGTH:
            return f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters"
        return f"topic name {topic!r} has characters outside [a-zA-Z0-9._-]"
    return None


def is_legal_topic_name(topic: str) -> bool:
    return topic_name_problem(topic) is None


def parse_topic_partition(name: str) -> TopicPartition:
    """``<legal topic>-<non-negative int>`` → TopicPartition; ValueError saying why otherwise.

    The partition must be written canonically (``t-1``, not ``t-01`` or ``t-+1``): Java's
    parseInt would accept those, but two names would then map to one partition.
    """
    topic, dash, number = name.rpartition("-")
    if not dash:
        raise ValueError(f"{name!r} is not <topic>-<partition>: no '-'")
    problem = topic_name_problem(topic)
    if problem is not None:
        raise ValueError(f"{name!r}: {problem}")
    if not number.isascii() or not number.isdigit():
        raise ValueError(f"{name!r}: partition {number!r} is not a non-negative integer")
    partition = int(number)
    if str(partition) != number:
        raise ValueError(f"{name!r}: partition {number!r} is not written canonically")
    if partition > MAX_PARTITION:
        raise ValueError(f"{name!r}: partition {number} does not fit an int32")
    return TopicPartition(topic, partition)
