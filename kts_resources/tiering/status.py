"""What ``kts status`` prints and ``kts sync`` totals: one row per partition in the broker's log dirs,
its numbers (both tiers' offsets, bytes, segments and copy lag, open lost ranges, damaged remote
segments: :func:`partition_numbers.partition_numbers`, which the assets' metadata reports too) and
this broker's replica role. Neither Dagster nor PySpark is imported."""

from __future__ import annotations

from kts_resources import settings
from kts_resources.kafka.errors import KafkaFormatError, os_error_line
from kts_resources.tiering.leadership import broker_replicas
from kts_resources.tiering.partition_numbers import partition_numbers
from kts_resources.tiering.batch_plans import partition_views
from kts_resources.tiering.tiers import log_dir_partitions

STATUS_FIELDS = (
    "topic", "partition", "log_start_offset", "local_log_start_offset", "high_watermark", "log_end_offset",
    "remote_log_start_offset", "remote_log_end_offset", "local_bytes", "remote_bytes", "local_segments",
    "remote_segments", "copy_lag_bytes", "copy_lag_segments", "lost_ranges", "damaged_remote_segments", "replica",
)


def status_rows_and_lost(store, unreadable: dict[str, str] | None = None) -> list[tuple[dict, list]]:
    """Each status row with its open lost ranges (LostOffsetRange), for `kts sync`'s alarm lines.
    A partition dir or segment that cannot be read (a symbolic link loop, no permission) is that
    partition's one line in ``unreadable``, and every other partition is still listed (without
    ``unreadable``, it raises)."""
    try:  # who leads, from the broker's KRaft metadata log (none: "-", every replica copies)
        role = broker_replicas(settings.log_dirs(), settings.metadata_log_dir()).role
    except (KafkaFormatError, ValueError) as e:
        if unreadable is None:
            raise
        unreadable["metadata log"] = str(e)
        role = lambda tp: "unknown"  # noqa: E731
    # Keyed by position: a partition in two log dirs is two rows, as the broker's dirs hold them.
    located = dict(enumerate(log_dir_partitions(settings.log_dirs())))
    rows = []
    # The store's rows a chunk of partitions per query: four reads a partition were most of a
    # `kts status` (and of the end of a `kts sync`) at a broker's size.
    for index, view in partition_views(located, store, alarms=True):
        partition, key = located[index].partition, located[index].key
        try:
            if isinstance(view, Exception):
                raise view
            numbers = partition_numbers(view)
        except ConnectionError:
            raise  # the store is down: not this partition's problem
        except OSError as e:
            if unreadable is None:
                raise
            unreadable.setdefault(key, os_error_line(e))
            continue
        except KafkaFormatError as e:  # a log dir's corrupt checkpoint: one line (file, position) for all its partitions
            if unreadable is None:
                raise
            if str(e) not in unreadable.values():
                unreadable[key] = str(e)
            continue
        row = {"topic": partition.topic, "partition": partition.partition, **numbers.as_dict(),
               "replica": role(partition.topic_partition)}
        rows.append(({name: row[name] for name in STATUS_FIELDS}, list(numbers.lost_ranges)))
    return rows
