"""A sensor tick's time budget for per-partition work.

Dagster gives a tick 60 s and kts's goal is 1 % of it. What a partition costs to plan or check
(its listing, a few small files, the plan itself: about a millisecond here, more on a loaded
machine or for a partition with many segments) decides how many fit, so a tick works through its
partitions until its budget is spent, and the ones left wait for the next tick; a fixed count
would either outlast the budget under load or leave time unused when idle.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()

# Seconds of per-partition work a tick spends at most (with its fixed costs the tick stays
# under 0.6 s, 1 % of the 60 s budget: bench/scale_bench.py).
WORK_BUDGET_S = 0.25
# Partitions a tick works through whatever the clock says: a slow moment still makes progress.
AT_LEAST = 20


def within_budget(items: Iterable[T], *, seconds: float = WORK_BUDGET_S, at_least: int = AT_LEAST) -> Iterator[T]:
    """``items`` (each one's work done by the caller before it asks for the next) until
    ``seconds`` have passed since the first was asked for; the first ``at_least`` always."""
    started = time.monotonic()
    taken = 0
    found = iter(items)
    while taken < at_least or time.monotonic() - started <= seconds:
        # The clock first, then the next item: one the tick has no time for is never asked for
        # (asking may read the next batch of partitions' rows).
        item = next(found, _END)
        if item is _END:
            return
        yield item
        taken += 1
