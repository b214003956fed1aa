"""What a command changed, told to the Dagster instance `kts ui` shows: the partitions whose numbers
moved are reported again (runless observations of local_segments and remote_segments, and of
retention_state where its numbers moved), so the UI agrees with `kts status` the moment the
command ends, without waiting for the next run."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from kts_resources.kafka.partition import TopicPartition


def report_changed_partitions(store, partitions: Iterable[TopicPartition], changed_by: str, *, retention: bool = False) -> None:
    """Report ``partitions`` (as ``kts status`` computes them now) to the instance ``kts sync`` and
    ``kts ui`` share; ``retention``: their log start offset or delete lag moved too. The change
    stands either way: an instance that cannot be written is one warning line."""
    partitions = list(partitions)
    if not partitions:
        return
    try:
        from kts_assets.assets.reporting import report_partitions
        from kts_assets.instance import dagster_instance
        from kts_resources import settings
        from kts_resources.tiering.quotas import SystemClock

        instance = dagster_instance()
        report_partitions(instance.report_runless_asset_event, store, partitions, log_dirs=settings.log_dirs(),
                          owned_log_dirs=settings.owned_log_dirs(), changed_by=changed_by,
                          now_ms=SystemClock().now_ms() if retention else None)
    except Exception as e:  # noqa: BLE001 - what the command did is done; only the UI lags
        print(f"kts: warning: the Dagster UI was not told of the change ({type(e).__name__}: {e}); "
              "the next run's report brings it up to date", file=sys.stderr)
