"""What the assets report beyond each partition's own metadata: who owns them, and a run's totals.

A ``MaterializeResult``'s metadata in a ranged (single-run backfill) step lands on every partition
of the range, so a run total written there would show on each partition's plot as if it were the
partition's own. Totals go to the run instead: its log and its tags (``kts/<name>``), which the
UI shows on the run and its runs list can filter by.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

OWNERS = ["team:kts"]
RUN_TOTAL_TAG_PREFIX = "kts/"


def record_run_totals(context: dg.AssetExecutionContext, totals: Mapping[str, int]) -> None:
    """``totals`` as the run's tags ``kts/<name>`` (not a log line too: every event is a write to
    the instance, and the step's own summary line already says them)."""
    context.instance.add_run_tags(context.run.run_id, {f"{RUN_TOTAL_TAG_PREFIX}{name}": str(value) for name, value in totals.items()})
