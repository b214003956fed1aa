"""The reconcile schedule and the batching it shares with the roll sensor.

The schedule asks for ``copy_job`` over every known partition, in a few ranged runs; the batching
helper turns "these keys need work" into the fewest key ranges under a per-run cap.
"""

from __future__ import annotations

import random

import dagster as dg
import pytest

from kts_assets import batching
from kts_assets.batching import batch_key_ranges
from kts_assets.partitions import topic_partitions
from kts_assets.schedules import RECONCILE_PARTITIONS_PER_RUN, reconcile_schedule


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def evaluate(instance: dg.DagsterInstance):
    return reconcile_schedule.evaluate_tick(dg.build_schedule_context(instance=instance))


# --- the reconcile schedule ----------------------------------------------------------------------


def test_the_schedule_batches_2000_partitions_into_a_few_runs_covering_each_once(instance):
    keys = [f"events-{p}" for p in range(2000)]
    instance.add_dynamic_partitions(topic_partitions.name, keys)
    requests = evaluate(instance).run_requests
    assert len(requests) == 2000 // RECONCILE_PARTITIONS_PER_RUN == 4
    covered = []
    for request in requests:
        start = keys.index(request.tags[batching.PARTITION_RANGE_START_TAG])
        end = keys.index(request.tags[batching.PARTITION_RANGE_END_TAG])
        covered.extend(keys[start:end + 1])
        assert request.tags["kts/trigger"] == "reconcile"
        assert request.partition_key is None  # a range, not one partition
    assert covered == keys
    assert len({r.run_key for r in requests}) == len(requests)


def test_the_schedule_skips_while_no_partition_is_known(instance):
    result = evaluate(instance)
    assert result.run_requests in (None, [])
    assert result.skip_message == "nothing to reconcile: no partitions known yet (the discovery sensor adds them)"


def test_the_schedule_is_hourly_and_targets_copy_job_by_name():
    assert reconcile_schedule.cron_schedule == "15 * * * *"
    assert reconcile_schedule.job_name == "copy_job"


# --- the shared batching helper ------------------------------------------------------------------------


KEYS = [f"t-{i}" for i in range(20)]


def test_adjacent_wanted_keys_share_one_range():
    (batch,) = batch_key_ranges(KEYS, ["t-3", "t-4", "t-5"], max_partitions_per_run=10)
    assert (batch.start, batch.end, batch.keys, batch.span) == ("t-3", "t-5", ("t-3", "t-4", "t-5"), 3)


def test_a_range_spans_idle_keys_rather_than_starting_another_run():
    (batch,) = batch_key_ranges(KEYS, ["t-0", "t-9"], max_partitions_per_run=10)
    assert (batch.start, batch.end, batch.keys, batch.span) == ("t-0", "t-9", ("t-0", "t-9"), 10)


def test_no_range_spans_more_than_the_cap():
    batches = batch_key_ranges(KEYS, ["t-0", "t-10"], max_partitions_per_run=10)
    assert [(b.start, b.end) for b in batches] == [("t-0", "t-0"), ("t-10", "t-10")]


def test_keys_not_in_the_definition_are_ignored_and_nothing_wanted_means_no_runs():
    assert batch_key_ranges(KEYS, ["nope-1"]) == []
    assert batch_key_ranges(KEYS, []) == []
    assert batch_key_ranges([], ["t-1"]) == []


def test_the_order_is_the_definitions_not_the_keys_sort_order():
    ordered = ["b-0", "a-0", "c-0"]  # dynamic partitions keep the order they were added in
    (batch,) = batch_key_ranges(ordered, ["c-0", "b-0"], max_partitions_per_run=3)
    assert (batch.start, batch.end, batch.keys) == ("b-0", "c-0", ("b-0", "c-0"))


def test_the_cap_must_be_positive():
    with pytest.raises(ValueError):
        batch_key_ranges(KEYS, ["t-1"], max_partitions_per_run=0)


@pytest.mark.parametrize("seed", range(20))
def test_batches_cover_every_wanted_key_once_within_the_cap_with_the_fewest_runs(seed):
    rng = random.Random(seed)
    keys = [f"k-{i}" for i in range(rng.randrange(1, 400))]
    wanted = set(rng.sample(keys, rng.randrange(0, len(keys) + 1)))
    cap = rng.randrange(1, 60)
    batches = batch_key_ranges(keys, wanted, max_partitions_per_run=cap)
    position = {k: i for i, k in enumerate(keys)}
    assert [k for b in batches for k in b.keys] == [k for k in keys if k in wanted]
    for batch in batches:
        assert batch.span == position[batch.end] - position[batch.start] + 1 <= cap
        assert batch.keys[0] == batch.start and batch.keys[-1] == batch.end
    # Fewest runs: a lower bound is how many disjoint windows of `cap` the wanted keys force.
    forced, covered_to = 0, -1
    for i in sorted(position[k] for k in wanted):
        if i > covered_to:
            forced, covered_to = forced + 1, i + cap - 1
    assert len(batches) == forced
