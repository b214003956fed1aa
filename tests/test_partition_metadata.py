"""A ranged step's per-partition metadata (``dagster_internals.add_partition_metadata``, what every
kts step reports each partition's numbers with): it lands on that partition's materialisation
only, as ``add_asset_metadata(partition_key=…)`` puts it, and a partition the step does not
materialise is refused — while the dynamic partitions are read once per step, not once per call
(at 4,000 partitions that was quadratic: bench/scale_bench.py)."""

import dagster as dg
import pytest

from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from kts_assets.dagster_internals import add_partition_metadata

PARTITIONS = dg.DynamicPartitionsDefinition(name="metadata_test_partitions")
KEYS = [f"orders-{i}" for i in range(6)]


class Reports(dg.Config):
    outside: str = ""  # a partition to report as well, though the run does not cover it


@dg.asset(partitions_def=PARTITIONS, backfill_policy=dg.BackfillPolicy.single_run())
def partition_numbers(context: dg.AssetExecutionContext, config: Reports) -> None:
    for key in context.partition_keys:
        add_partition_metadata(context, {"segments": int(key.rsplit("-", 1)[1]) * 10}, asset_key=None, partition_key=key)
    if config.outside:
        add_partition_metadata(context, {"segments": 0}, asset_key=None, partition_key=config.outside)


def _run(instance: dg.DagsterInstance, start: str, end: str, outside: str = "") -> dg.ExecuteInProcessResult:
    return dg.materialize([partition_numbers], instance=instance, raise_on_error=False,
                          tags={PARTITION_RANGE_START_TAG: start, PARTITION_RANGE_END_TAG: end},
                          run_config={"ops": {"partition_numbers": {"config": {"outside": outside}}}})


def _counted_reads(instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    read = type(instance).get_dynamic_partitions

    def counting(self, *args, **kwargs):
        reads[0] += 1
        return read(self, *args, **kwargs)

    monkeypatch.setattr(type(instance), "get_dynamic_partitions", counting)
    return reads


def test_each_partition_of_a_ranged_run_gets_its_own_numbers_with_one_read_of_the_partitions_per_step(monkeypatch):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(PARTITIONS.name, KEYS)
        reads = _counted_reads(instance, monkeypatch)
        result = _run(instance, "orders-1", "orders-4")
        assert result.success
        by_partition = {m.partition: m.metadata["segments"].value for m in result.asset_materializations_for_node("partition_numbers")}
        assert by_partition == {"orders-1": 10, "orders-2": 20, "orders-3": 30, "orders-4": 40}
        # Dagster's own reads per run (planning, the output) stay; the four reports add one, not four.
        reads_with_four = reads[0]
        reads[0] = 0
        assert _run(instance, "orders-0", "orders-5").success
        assert reads[0] == reads_with_four


def test_metadata_for_a_partition_outside_the_runs_range_fails_the_step_naming_it():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(PARTITIONS.name, KEYS)
        result = _run(instance, "orders-1", "orders-2", outside="orders-5")
        assert not result.success
        [failure] = [e for e in result.all_events if e.is_step_failure]
        assert "'orders-5', which this step does not materialise" in failure.step_failure_data.error.message
