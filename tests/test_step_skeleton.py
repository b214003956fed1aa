"""The one skeleton the pipeline's steps (copy, retention_state, remote_log_index) run their
partitions with (kts_assets/assets/steps.py): each partition's work is done and reported as its
metadata, a failure is that partition's alone, and a step every partition of which failed fails."""

import logging

import dagster as dg
import pytest

from kts_assets.assets.steps import PartitionFailed, PartitionStep, for_each_partition

from .conftest import materializations

KEYS = ["orders-0", "orders-1", "orders-2"]
WHOLE_RANGE = {"dagster/asset_partition_range_start": KEYS[0], "dagster/asset_partition_range_end": KEYS[-1]}
STEP = PartitionStep("the test step", failed_key="test_failed", error_key="test_error",
                     unexpected=lambda e: PartitionFailed(f"test step failed: {type(e).__name__}: {e}", str(e)))


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def run(instance, do, *, step: PartitionStep = STEP, threads: int = 0, together=None) -> dg.ExecuteInProcessResult:
    """One run over every partition of a step whose work for a partition is ``do(key, its number)``,
    reported by each partition (``together``: None) or for all at once by ``together``."""
    @dg.asset(name="stepped", partitions_def=dg.StaticPartitionsDefinition(KEYS),
              backfill_policy=dg.BackfillPolicy.single_run())
    def stepped(context: dg.AssetExecutionContext) -> None:
        work = {key: int(key[-1]) for key in context.partition_keys}
        if together is not None:
            for_each_partition(context, step, work, do, report_together=together, threads=threads)
        else:
            for_each_partition(context, step, work, do, lambda key, number, result: {"done": result, step.failed_key: 0},
                               threads=threads)

    return dg.materialize([stepped], instance=instance, tags=WHOLE_RANGE, raise_on_error=False)


def metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    return {m.partition: {k: v.value for k, v in m.metadata.items()} for m in materializations(result, "stepped")}


def logged(instance, result: dg.ExecuteInProcessResult, level: int) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id) if e.level == level and not e.is_dagster_event]


def step_failure(result: dg.ExecuteInProcessResult) -> str:
    """The step's error, with what caused it."""
    [failure] = result.get_step_failure_events()
    return failure.step_failure_data.error.to_string()


@pytest.mark.parametrize("threads", [0, 2])
def test_each_partition_reports_its_own_outcome_and_a_failure_is_that_partitions_alone(instance, threads):
    def do(key: str, number: int) -> int:
        if number == 1:
            raise PartitionFailed("not built: the disk is gone", "the disk is gone", {"planned": 3})
        if number == 2:
            raise ValueError("no such segment")
        return number * 10

    result = run(instance, do, threads=threads)
    assert result.success
    assert metadata(result) == {
        "orders-0": {"done": 0, "test_failed": 0},
        "orders-1": {"planned": 3, "test_failed": 1, "test_error": "the disk is gone"},
        "orders-2": {"test_failed": 1, "test_error": "no such segment"},  # the step's own reading of it
    }
    assert sorted(logged(instance, result, logging.ERROR)) == [
        "orders-1: not built: the disk is gone", "orders-2: test step failed: ValueError: no such segment"]


@pytest.mark.parametrize("threads", [0, 2])
def test_a_step_can_report_its_done_partitions_together_once_all_are_done_and_failures_as_they_come(instance, threads):
    calls = []

    def do(key: str, number: int) -> int:
        if number == 1:
            raise PartitionFailed("not built: the disk is gone", "the disk is gone")
        return number * 10

    def together(done):
        calls.append(dict(done))
        for key, (number, result) in done.items():
            yield key, {"done": result, "number": number, "reported_with": len(done)}

    result = run(instance, do, threads=threads, together=together)
    assert result.success
    assert calls == [{"orders-0": (0, 0), "orders-2": (2, 20)}]  # once, with every partition done
    assert metadata(result) == {
        "orders-0": {"done": 0, "number": 0, "reported_with": 2},
        "orders-1": {"test_failed": 1, "test_error": "the disk is gone"},
        "orders-2": {"done": 20, "number": 2, "reported_with": 2},
    }


@pytest.mark.parametrize("threads", [0, 2])
def test_a_step_every_partition_of_which_failed_fails_so_that_it_is_retried(instance, threads):
    def do(key: str, number: int) -> int:
        raise PartitionFailed("the bucket is unreachable", "unreachable")

    result = run(instance, do, threads=threads)
    assert not result.success
    message = step_failure(result)
    assert "the test step failed for every partition of the run: " in message
    assert all(key in message for key in KEYS)
    assert all(md["test_failed"] == 1 for md in metadata(result).values())


def test_an_error_the_step_does_not_take_as_a_partitions_fails_the_step(instance):
    def do(key: str, number: int) -> int:
        if number == 1:
            raise RuntimeError("the store went away")
        return number

    result = run(instance, do, step=PartitionStep("the test step", failed_key="test_failed", error_key="test_error"))
    assert not result.success
    assert "the store went away" in step_failure(result)
    assert "orders-1" not in metadata(result)
