"""The segment roll sensor: which partitions a tick asks to copy, in how many runs, and its cursor.

Log dirs are either simulated (real segments, checkpoints written by the simulated broker) or
synthetic: empty files with Kafka's names plus the two offset checkpoints, which is all the sensor
reads — it never opens a segment file. Ticks go through ``build_sensor_context`` +
``evaluate_tick`` against a test instance holding the dynamic partitions.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import random
from pathlib import Path

import dagster as dg
import pytest

from kts_assets import batching
from kts_assets.partitions import topic_partitions
from kts_assets.sensors import roll as sensors_roll
from kts_assets.sensors.cursor import CURSOR_COMPRESS_ABOVE, decode_cursor, decode_cursor_maps, encode_cursor, sensor_state
from kts_assets.sensors.roll import LAG_BYTES, LAG_SEGMENTS, segment_base_offsets, segment_roll_sensor, survey_log_dirs
from kts_resources.kafka.checkpoints import write_offset_checkpoint
from kts_resources.kafka.logdir import LogDir, offset_file_name
from kts_resources.kafka.partition import parse_topic_partition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource

from .test_copier import _eligible

KiB = 1024


# --- helpers ---------------------------------------------------------------------------------------


def write_segments(log_dir: Path, key: str, bases: list[int]) -> None:
    """Empty segment files (.log, .index, .timeindex) at ``bases`` in ``log_dir/key``."""
    directory = log_dir / key
    directory.mkdir(parents=True, exist_ok=True)
    for base in bases:
        for suffix in (".log", ".index", ".timeindex"):
            (directory / offset_file_name(base, suffix)).touch()


def write_checkpoints(log_dir: Path, offsets: dict[str, tuple[int, int]]) -> None:
    """The replication-offset (HW) and recovery-point checkpoints: ``{key: (hw, recovery point)}``."""
    write_offset_checkpoint(log_dir / "replication-offset-checkpoint",
                            {parse_topic_partition(k): hw for k, (hw, _) in offsets.items()})
    write_offset_checkpoint(log_dir / "recovery-point-offset-checkpoint",
                            {parse_topic_partition(k): rp for k, (_, rp) in offsets.items()})


def synthetic_log_dir(root: Path, partitions: dict[str, tuple[list[int], int]]) -> Path:
    """``{key: (segment bases, committed offset)}`` → a log dir with HW = recovery point = that offset."""
    root.mkdir(parents=True, exist_ok=True)
    for key, (bases, _) in partitions.items():
        write_segments(root, key, bases)
    write_checkpoints(root, {k: (off, off) for k, (_, off) in partitions.items()})
    return root


# The metadata store the ticks read the highest copied offsets from (a fresh database per test).
_store: list[MetadataStoreResource] = []


def tick(instance: dg.DagsterInstance, *log_dirs: Path, cursor: str | None = None):
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"kafka_log_dirs": KafkaLogDirsResource(log_dirs=",".join(str(d) for d in log_dirs)),
                   "metadata_store": _store[-1]},
    )
    return segment_roll_sensor.evaluate_tick(context)


def requested_keys(instance: dg.DagsterInstance, result) -> list[str]:
    """Every partition key the tick's ranged run requests cover, in key order."""
    keys = instance.get_dynamic_partitions(topic_partitions.name)
    covered = []
    for request in result.run_requests:
        start = keys.index(request.tags[batching.PARTITION_RANGE_START_TAG])
        end = keys.index(request.tags[batching.PARTITION_RANGE_END_TAG])
        covered.extend(keys[start:end + 1])
    return covered


def requested_in(instance: dg.DagsterInstance, cursor: str | None) -> dict[str, int]:
    """The newest base offset the sensor's cursor records as requested, per partition (the state
    the short cursor names, kept in the instance)."""
    return decode_cursor(sensor_state(instance, sensors_roll.SENSOR_NAME, cursor))


def asked_for(result) -> int:
    return sum(int(r.tags["kts/partitions_requested"]) for r in result.run_requests)


@pytest.fixture
def instance(pg_url):
    _store.append(MetadataStoreResource(database_url=pg_url))
    with dg.instance_for_test() as instance:
        yield instance
    _store.pop()


def add_partitions(instance: dg.DagsterInstance, keys) -> None:
    instance.add_dynamic_partitions(topic_partitions.name, list(keys))


# --- eligibility -----------------------------------------------------------------------------------


def test_only_live_log_files_count_as_segments(tmp_path):
    write_segments(tmp_path, "t-0", [0, 50])
    for name in (offset_file_name(10, ".log.deleted"), offset_file_name(20, ".log.swap"),
                 offset_file_name(30, ".log.cleaned"), "leader-epoch-checkpoint", "x.log"):
        (tmp_path / "t-0" / name).touch()
    (tmp_path / "t-0" / offset_file_name(40, ".log")).mkdir()  # a directory is not a segment
    assert segment_base_offsets(tmp_path / "t-0") == [0, 50]


def test_the_survey_finds_the_newest_segment_the_copier_would_take_on_a_simulated_log_dir(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=3, topics=("orders", "page.views"), partitions=2,
                                        total_bytes=160 * KiB, segment_bytes=8 * KiB))
    partitions = LogDir(tmp_path).partitions()
    survey = survey_log_dirs([tmp_path], [p.topic_partition.dir_name for p in partitions])
    assert survey.checked == len(partitions) == 4
    for key, segments in _eligible(tmp_path).items():
        assert survey.eligible.get(key) == (segments[-1].base_offset if segments else None)
    assert len(survey.eligible) == 4  # 160 KiB over 8 KiB segments: every partition rolled


def test_segment_files_are_never_opened(tmp_path, instance, monkeypatch):
    synthetic_log_dir(tmp_path, {"t-0": ([0, 10, 20], 25)})
    add_partitions(instance, ["t-0"])
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        assert not str(file).endswith((".log", ".index", ".timeindex")), f"opened {file}"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    assert requested_keys(instance, tick(instance, tmp_path)) == ["t-0"]


def test_each_checkpoint_is_read_once_per_log_dir_per_tick(tmp_path, instance, monkeypatch):
    a = synthetic_log_dir(tmp_path / "a", {f"t-{p}": ([0, 10, 20], 25) for p in range(0, 30)})
    b = synthetic_log_dir(tmp_path / "b", {f"t-{p}": ([0, 10, 20], 25) for p in range(30, 60)})
    add_partitions(instance, [f"t-{p}" for p in range(60)])
    reads = []
    for name in ("high_watermarks", "recovery_points"):
        real = getattr(LogDir, name)
        monkeypatch.setattr(LogDir, name, lambda self, _real=real, _name=name: reads.append((_name, self.path)) or _real(self))
    result = tick(instance, a, b)
    assert asked_for(result) == 60
    assert sorted(reads) == sorted((n, d) for n in ("high_watermarks", "recovery_points") for d in (a, b))


# --- what a tick requests ----------------------------------------------------------------------------


def three_partitions(root: Path) -> Path:
    return synthetic_log_dir(root, {
        "orders-0": ([0, 100, 200], 250),  # segments 0 and 100 are eligible
        "orders-1": ([0], 40),  # only the active segment
        "orders-2": ([0, 100], 80),  # rolled, but the HW has not reached the roll
    })


def test_first_tick_requests_runs_for_partitions_with_eligible_segments(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    result = tick(instance, three_partitions(tmp_path))
    assert len(result.run_requests) == 1
    assert result.run_requests[0].tags[batching.PARTITION_RANGE_START_TAG] == "orders-0"
    assert result.run_requests[0].tags[batching.PARTITION_RANGE_END_TAG] == "orders-0"
    assert result.run_requests[0].tags["kts/trigger"] == "segment_roll"
    assert requested_in(instance, result.cursor) == {"orders-0": 100}


def test_second_tick_with_nothing_new_requests_nothing_and_says_how_many_were_checked(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    second = tick(instance, log_dir, cursor=first.cursor)
    assert second.run_requests == []
    assert "checked 3 of 3 known partitions" in second.skip_message
    assert requested_in(instance, second.cursor) == requested_in(instance, first.cursor)


def test_after_a_new_roll_only_that_partition_is_requested(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    # orders-2's HW passes its roll; orders-1 rolls but its HW stays in the old segment.
    write_segments(log_dir, "orders-1", [0, 60])
    write_checkpoints(log_dir, {"orders-0": (250, 250), "orders-1": (50, 50), "orders-2": (130, 130)})
    second = tick(instance, log_dir, cursor=first.cursor)
    assert requested_keys(instance, second) == ["orders-2"]
    assert requested_in(instance, second.cursor) == {"orders-0": 100, "orders-2": 0}
    # orders-0 rolls twice more and the broker checkpoints past both rolls.
    write_segments(log_dir, "orders-0", [0, 100, 200, 300, 400])
    write_checkpoints(log_dir, {"orders-0": (420, 410), "orders-1": (50, 50), "orders-2": (130, 130)})
    third = tick(instance, log_dir, cursor=second.cursor)
    assert requested_keys(instance, third) == ["orders-0"]
    assert requested_in(instance, third.cursor)["orders-0"] == 300


def test_a_recovery_point_behind_the_high_watermark_holds_the_segment_back(tmp_path, instance):
    add_partitions(instance, ["t-0"])
    write_segments(tmp_path, "t-0", [0, 100])
    write_checkpoints(tmp_path, {"t-0": (150, 90)})  # committed but not yet flushed
    assert tick(instance, tmp_path).run_requests == []
    write_checkpoints(tmp_path, {"t-0": (150, 100)})
    assert requested_keys(instance, tick(instance, tmp_path)) == ["t-0"]


def test_partitions_missing_from_the_checkpoints_are_not_requested(tmp_path, instance):
    add_partitions(instance, ["t-0", "t-1"])
    synthetic_log_dir(tmp_path, {"t-0": ([0, 10, 20], 25)})
    write_segments(tmp_path, "t-1", [0, 10, 20])  # a new partition the broker has not checkpointed
    result = tick(instance, tmp_path)
    assert requested_keys(instance, result) == ["t-0"]


def test_partitions_not_yet_added_are_ignored(tmp_path, instance):
    synthetic_log_dir(tmp_path, {f"t-{p}": ([0, 10, 20], 25) for p in range(4)})
    add_partitions(instance, ["t-1", "t-3"])
    result = tick(instance, tmp_path)
    assert requested_keys(instance, result) == ["t-1", "t-3"]  # one range over both known keys
    assert set(requested_in(instance, result.cursor)) == {"t-1", "t-3"}
    # Once discovery adds the others, they are requested, and only they.
    add_partitions(instance, ["t-0", "t-2"])
    later = tick(instance, tmp_path, cursor=result.cursor)
    assert asked_for(later) == 2
    assert set(requested_in(instance, later.cursor)) == {"t-0", "t-1", "t-2", "t-3"}


def test_no_known_partitions_is_an_idle_tick(tmp_path, instance):
    synthetic_log_dir(tmp_path, {"t-0": ([0, 10, 20], 25)})
    result = tick(instance, tmp_path)
    assert result.run_requests == []
    assert "checked 0 of 0 known partitions" in result.skip_message


def test_partitions_spread_over_two_log_dirs_are_all_requested(tmp_path, instance):
    a = synthetic_log_dir(tmp_path / "a", {"t-0": ([0, 10, 20], 25), "t-2": ([0, 10], 5)})
    b = synthetic_log_dir(tmp_path / "b", {"t-1": ([0, 10, 20], 15), "u-0": ([0, 7], 9)})
    add_partitions(instance, ["t-0", "t-1", "t-2", "u-0"])
    result = tick(instance, a, b)
    assert requested_in(instance, result.cursor) == {"t-0": 10, "t-1": 0, "u-0": 0}


# --- batching ------------------------------------------------------------------------------------------


def test_500_partitions_with_work_start_at_most_3_runs(tmp_path, instance):
    keys = [f"events-{p}" for p in range(500)]
    synthetic_log_dir(tmp_path, {k: ([0, 1000, 2000], 2500) for k in keys})
    add_partitions(instance, keys)
    result = tick(instance, tmp_path)
    assert len(result.run_requests) <= 3
    assert requested_keys(instance, result) == keys  # every partition once, none twice
    assert all(int(r.tags["kts/partitions_in_range"]) <= batching.MAX_PARTITIONS_PER_RUN for r in result.run_requests)


def test_scattered_work_shares_runs_with_idle_partitions_in_between(tmp_path, instance):
    keys = [f"t-{p}" for p in range(1000)]
    busy = set(keys[::7])
    synthetic_log_dir(tmp_path, {k: ([0, 10, 20] if k in busy else [0], 25) for k in keys})
    add_partitions(instance, keys)
    result = tick(instance, tmp_path)
    assert asked_for(result) == len(busy) == 143
    assert len(result.run_requests) == 5  # 1000 keys / 200 per run, not 143 runs
    assert busy <= set(requested_keys(instance, result))


def test_a_burst_beyond_the_run_cap_waits_for_the_next_tick(tmp_path, instance, monkeypatch):
    per_run, runs = 5, 2  # scaled down from MAX_PARTITIONS_PER_RUN and MAX_RUNS_PER_TICK
    monkeypatch.setattr(sensors_roll, "MAX_PARTITIONS_PER_RUN", per_run)
    monkeypatch.setattr(sensors_roll, "MAX_RUNS_PER_TICK", runs)
    keys = [f"t-{p}" for p in range(per_run * (runs + 1) - 2)]
    synthetic_log_dir(tmp_path, {k: ([0, 10, 20], 25) for k in keys})
    add_partitions(instance, keys)
    first = tick(instance, tmp_path)
    assert len(first.run_requests) == runs
    assert set(requested_in(instance, first.cursor)) == set(keys[:per_run * runs])
    assert "deferred" not in (first.skip_message or "")
    second = tick(instance, tmp_path, cursor=first.cursor)
    assert requested_keys(instance, second) == keys[per_run * runs:]
    assert tick(instance, tmp_path, cursor=second.cursor).run_requests == []


def test_a_ranged_request_runs_copy_job_once_over_every_partition_in_the_range(tmp_path, instance):
    seen: list[list[str]] = []

    @dg.asset(partitions_def=topic_partitions, backfill_policy=dg.BackfillPolicy.single_run())
    def local_segments(context) -> None:
        seen.append(list(context.partition_keys))

    @dg.asset(partitions_def=topic_partitions, backfill_policy=dg.BackfillPolicy.single_run(), deps=[local_segments])
    def remote_segments(context) -> None:
        seen.append(list(context.partition_keys))

    keys = [f"t-{p}" for p in range(6)]
    synthetic_log_dir(tmp_path, {k: ([0, 10, 20] if p % 2 == 0 else [0], 25) for p, k in enumerate(keys)})
    add_partitions(instance, keys)
    (request,) = tick(instance, tmp_path).run_requests
    stand_in = dg.define_asset_job("copy_job", selection=[local_segments, remote_segments])
    job = dg.Definitions(assets=[local_segments, remote_segments], jobs=[stand_in]).resolve_job_def("copy_job")
    assert job.execute_in_process(instance=instance, tags=dict(request.tags)).success
    assert seen == [keys[0:5], keys[0:5]]  # t-0 .. t-4: the busy t-0, t-2, t-4 and the idle keys between


def test_range_tags_are_the_ones_dagster_reads():
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    assert batching.PARTITION_RANGE_START_TAG == ASSET_PARTITION_RANGE_START_TAG
    assert batching.PARTITION_RANGE_END_TAG == ASSET_PARTITION_RANGE_END_TAG


# --- the cursor ------------------------------------------------------------------------------------------


def test_cursor_round_trips_small_and_plain():
    requested = {"orders-0": 100, "page.views-12": 0, "a-b-3": 2**63 - 1}
    cursor = encode_cursor(requested)
    assert json.loads(cursor)["requested"] == requested  # readable as it is when small
    assert decode_cursor(cursor) == requested
    assert decode_cursor(None) == {} and decode_cursor("") == {}


def test_cursor_for_10000_partitions_round_trips_compressed_and_small():
    rng = random.Random(1)  # random 9-digit offsets: the worst case for compression
    requested = {f"topic-{t:03d}-{p}": rng.randrange(10**8, 10**9) for t in range(100) for p in range(100)}
    cursor = encode_cursor(requested)
    assert "zlib" in json.loads(cursor)
    assert len(cursor) < 90_000  # the plain JSON map would be ~250 KB
    assert len(encode_cursor({"t-0": 1})) < CURSOR_COMPRESS_ABOVE
    assert decode_cursor(cursor) == requested


def test_the_tick_cursor_over_4000_partitions_is_short_and_round_trips_through_the_next_tick(tmp_path, instance, monkeypatch):
    monkeypatch.setattr(sensors_roll, "MAX_RUNS_PER_TICK", 20)  # every partition in the first tick
    keys = [f"t-{p}" for p in range(4000)]
    synthetic_log_dir(tmp_path, {k: ([0, 10], 15) for k in keys})
    add_partitions(instance, keys)
    first = tick(instance, tmp_path)
    assert len(first.cursor) < 100, first.cursor  # the state is kept in the instance; the cursor names it
    assert json.loads(first.cursor)["partitions"] == 4000
    assert "zlib" in json.loads(sensor_state(instance, sensors_roll.SENSOR_NAME, first.cursor))
    assert requested_in(instance, first.cursor) == {k: 0 for k in keys}
    second = tick(instance, tmp_path, cursor=first.cursor)
    assert second.run_requests == [] and len(second.cursor) < 100
    assert requested_in(instance, second.cursor) == requested_in(instance, first.cursor)


def test_a_cursor_that_carries_its_state_inline_is_read_and_rewritten_short(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    inline = encode_cursor({"orders-0": 100})  # as the sensor wrote cursors before keeping its state in the instance
    result = tick(instance, log_dir, cursor=inline)
    assert result.run_requests == []
    assert requested_in(instance, result.cursor) == {"orders-0": 100} and len(result.cursor) < 100


def test_a_cursor_naming_a_state_no_longer_kept_starts_over(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    result = tick(instance, three_partitions(tmp_path), cursor='{"v":3,"state":"0123456789abcdef"}')
    assert requested_keys(instance, result) == ["orders-0"]


def test_an_unreadable_cursor_starts_over_instead_of_failing_the_tick(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    result = tick(instance, three_partitions(tmp_path), cursor="not json")
    assert requested_keys(instance, result) == ["orders-0"]
    with pytest.raises(ValueError):
        decode_cursor('{"v": 99, "requested": {}}')


# --- end to end on a simulated broker ------------------------------------------------------------------


def test_a_simulated_broker_that_keeps_appending_gets_runs_for_exactly_the_partitions_that_rolled(tmp_path, instance):
    config = SimulationConfig(seed=5, topics=("orders", "clicks"), partitions=2, total_bytes=64 * KiB, segment_bytes=8 * KiB)
    simulate(tmp_path, config)
    keys = [p.topic_partition.dir_name for p in LogDir(tmp_path).partitions()]
    add_partitions(instance, keys)
    first = tick(instance, tmp_path)
    before = requested_in(instance, first.cursor)
    assert set(before) == set(keys)

    simulate(tmp_path, SimulationConfig(**{**config.__dict__, "seed": 6, "total_bytes": 24 * KiB}))
    after = survey_log_dirs([tmp_path], keys).eligible
    grown = [k for k in keys if after[k] != before[k]]
    assert grown  # 24 KiB more over 8 KiB segments rolls somewhere
    second = tick(instance, tmp_path, cursor=first.cursor)
    assert asked_for(second) == len(grown)
    assert requested_in(instance, second.cursor) == after


# --- copy lag as it happens ----------------------------------------------------------------------------


def lag_events(result) -> dict[str, tuple[int, int]]:
    """partition key → (copy_lag_segments, copy_lag_bytes) of the tick's observations."""
    out = {}
    for event in result.asset_events:
        assert isinstance(event, dg.AssetObservation) and event.asset_key == dg.AssetKey("remote_segments")
        out[event.partition] = (event.metadata["copy_lag_segments"].value, event.metadata["copy_lag_bytes"].value)
    return out


def test_copy_lag_is_observed_before_any_copy_and_agrees_with_the_tiers(tmp_path, instance):
    from kts_resources.tiering.partition_view import partition_tiers
    from kts_resources.tiering.tiers import log_dir_partitions

    simulate(tmp_path, SimulationConfig(seed=9, topics=("orders",), partitions=2, total_bytes=48 * KiB, segment_bytes=8 * KiB))
    keys = [p.topic_partition.dir_name for p in LogDir(tmp_path).partitions()]
    add_partitions(instance, keys)
    first = tick(instance, tmp_path)
    tiers = {loc.partition.topic_partition.dir_name: partition_tiers(loc, _store[-1].store())
             for loc in log_dir_partitions([tmp_path])}
    assert lag_events(first) == {k: (tiers[k].copy_lag_segments, tiers[k].copy_lag_bytes) for k in keys}
    assert all(segments > 0 and size > 0 for segments, size in lag_events(first).values())
    text = next(iter(first.asset_events)).metadata["copy_lag"].value
    assert " segment" in text and "KiB" in text  # a human-readable entry beside the bytes


def test_an_unchanged_copy_lag_is_not_observed_again(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    assert set(lag_events(first)) == {"orders-0", "orders-1", "orders-2"}
    assert tick(instance, log_dir, cursor=first.cursor).asset_events == []


def test_a_copy_lowers_the_lag_and_only_that_partition_is_observed_again(tmp_path, instance):
    from kts_resources.tiering.copier import copy_partition
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=9, topics=("orders",), partitions=2, total_bytes=48 * KiB, segment_bytes=8 * KiB))
    partitions = {p.topic_partition.dir_name: p for p in LogDir(log_dir).partitions()}
    add_partitions(instance, partitions)
    first = tick(instance, log_dir)
    store = _store[-1].store()
    result = copy_partition(partitions["orders-0"], LogDir(log_dir), store, remote_storage_from_uri((tmp_path / "remote").as_uri()))
    assert result.copied
    second = tick(instance, log_dir, cursor=first.cursor)
    assert set(lag_events(second)) == {"orders-0"}
    segments, size = lag_events(second)["orders-0"]
    assert segments == lag_events(first)["orders-0"][0] - len(result.copied)
    assert size == lag_events(first)["orders-0"][1] - result.copied_bytes


def test_lag_changed_for_many_partitions_is_reported_a_capped_number_per_tick(tmp_path, instance, monkeypatch):
    monkeypatch.setattr(sensors_roll, "MAX_LAG_OBSERVATIONS_PER_TICK", 2)
    keys = [f"t-{p}" for p in range(5)]
    synthetic_log_dir(tmp_path, {k: ([0, 10], 5) for k in keys})  # one closed segment each, none eligible
    add_partitions(instance, keys)
    seen: list[str] = []
    cursor = None
    for _ in range(3):
        result = tick(instance, tmp_path, cursor=cursor)
        assert len(result.asset_events) <= 2
        seen += list(lag_events(result))
        cursor = result.cursor
    assert sorted(seen) == keys  # each once, none lost to the cap
    assert tick(instance, tmp_path, cursor=cursor).asset_events == []


def test_an_unreachable_store_skips_the_lag_but_still_requests_copies(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    _store.append(MetadataStoreResource(database_url="postgresql://kts@127.0.0.1:1/nowhere?connect_timeout=1"))
    try:
        result = tick(instance, log_dir)
    finally:
        _store.pop()
    assert requested_keys(instance, result) == ["orders-0"] and result.asset_events == []
    later = tick(instance, log_dir, cursor=result.cursor)  # the store is back: the lag is reported then
    assert set(lag_events(later)) == {"orders-0", "orders-1", "orders-2"}


def test_a_cursor_of_the_first_version_is_still_read():
    assert decode_cursor('{"v":1,"requested":{"t-0":5}}') == {"t-0": 5}


# --- a failed copy is retried with backoff ------------------------------------------------------------


def copy_job_stand_in(fail: bool = False) -> dg.JobDefinition:
    """A ``copy_job`` whose one step copies nothing; with ``fail`` it raises, as a failed copy does."""

    @dg.asset(partitions_def=topic_partitions, backfill_policy=dg.BackfillPolicy.single_run())
    def remote_segments(context) -> None:
        if fail:
            raise RuntimeError("the remote tier refused the upload")

    return dg.Definitions(assets=[remote_segments], jobs=[dg.define_asset_job("copy_job", selection=[remote_segments])]
                          ).resolve_job_def("copy_job")


def run_copy(instance: dg.DagsterInstance, request: dg.RunRequest, *, fail: bool) -> dg.ExecuteInProcessResult:
    """Run the stand-in ``copy_job`` over the request's range, as the daemon would launch it,
    leaving its run (failed with ``fail``) in the instance."""
    return copy_job_stand_in(fail).execute_in_process(instance=instance, tags=dict(request.tags), raise_on_error=False)


def at(monkeypatch, ms: int) -> None:
    """The sensor's clock set to ``ms`` (epoch milliseconds)."""
    monkeypatch.setattr(sensors_roll, "now_ms", lambda: ms)


def test_a_partition_whose_copy_failed_is_requested_again_after_its_backoff_and_not_before(tmp_path, instance, monkeypatch):
    import time

    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    (request,) = first.run_requests
    assert not run_copy(instance, request, fail=True).success
    failed_at = int(time.time() * 1000)

    at(monkeypatch, failed_at)
    waiting = tick(instance, log_dir, cursor=first.cursor)
    assert waiting.run_requests == []
    assert "1 partition waits for a retry of a failed copy: orders-0 at " in waiting.skip_message
    assert "(retry 1)" in waiting.skip_message
    at(monkeypatch, failed_at + 30_000)  # half the first backoff: still waiting
    still = tick(instance, log_dir, cursor=waiting.cursor)
    assert still.run_requests == [] and "orders-0 at " in still.skip_message

    at(monkeypatch, failed_at + sensors_roll.retry_delay_ms(0) + 1000)
    retried = tick(instance, log_dir, cursor=still.cursor)
    assert requested_keys(instance, retried) == ["orders-0"]
    assert "retries" in json.loads(retried.cursor)

    # The retry fails too: the next one waits twice as long.
    assert not run_copy(instance, retried.run_requests[0], fail=True).success
    failed_again = int(time.time() * 1000)
    at(monkeypatch, failed_again + sensors_roll.retry_delay_ms(0) + 1000)
    again = tick(instance, log_dir, cursor=retried.cursor)
    assert again.run_requests == [] and "(retry 2)" in again.skip_message
    at(monkeypatch, failed_again + sensors_roll.retry_delay_ms(1) + 1000)
    assert requested_keys(instance, tick(instance, log_dir, cursor=again.cursor)) == ["orders-0"]


def test_the_backoff_doubles_from_a_minute_and_is_capped():
    assert [sensors_roll.retry_delay_ms(n) // 60_000 for n in range(8)] == [1, 2, 4, 8, 16, 32, 32, 32]
    assert sensors_roll.retry_delay_ms(10_000) == sensors_roll.MAX_RETRY_MS


def test_a_partition_of_a_run_that_succeeded_is_not_retried(tmp_path, instance, monkeypatch):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    assert run_copy(instance, first.run_requests[0], fail=False).success  # e.g. a follower's replica: nothing to copy here
    at(monkeypatch, sensors_roll.now_ms() + sensors_roll.MAX_RETRY_MS)
    later = tick(instance, log_dir, cursor=first.cursor)
    assert later.run_requests == [] and "for a retry of a failed copy:" not in later.skip_message


def test_only_the_partitions_a_failed_run_left_uncopied_wait_for_a_retry(tmp_path, instance, monkeypatch):
    from kts_resources.remote_storage.factory import remote_storage_from_uri
    from kts_resources.tiering.copier import copy_partition

    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=9, topics=("orders",), partitions=2, total_bytes=48 * KiB, segment_bytes=8 * KiB))
    partitions = {p.topic_partition.dir_name: p for p in LogDir(log_dir).partitions()}
    add_partitions(instance, sorted(partitions))
    first = tick(instance, log_dir)
    (request,) = first.run_requests
    # The run copied orders-0, then failed on orders-1.
    assert copy_partition(partitions["orders-0"], LogDir(log_dir), _store[-1].store(),
                          remote_storage_from_uri((tmp_path / "remote").as_uri())).copied
    assert not run_copy(instance, request, fail=True).success
    waiting = tick(instance, log_dir, cursor=first.cursor)
    assert "1 partition waits for a retry of a failed copy: orders-1 at " in waiting.skip_message
    assert "orders-0" not in waiting.skip_message.partition("waits for a retry")[2]
    at(monkeypatch, sensors_roll.now_ms() + sensors_roll.retry_delay_ms(0) + 1000)
    assert requested_keys(instance, tick(instance, log_dir, cursor=waiting.cursor)) == ["orders-1"]


def test_a_retry_that_comes_due_while_another_run_covers_the_partition_waits_for_that_run(tmp_path, instance, monkeypatch):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    first = tick(instance, log_dir)
    (request,) = first.run_requests
    assert not run_copy(instance, request, fail=True).success
    waiting = tick(instance, log_dir, cursor=first.cursor)
    # The reconcile schedule's run over it has not started yet when the retry comes due.
    instance.create_run_for_job(copy_job_stand_in(), tags=dict(request.tags), status=dg.DagsterRunStatus.NOT_STARTED)
    at(monkeypatch, sensors_roll.now_ms() + sensors_roll.retry_delay_ms(0) + 1000)
    covered = tick(instance, log_dir, cursor=waiting.cursor)
    assert covered.run_requests == [] and "its run still in flight" in covered.skip_message


# --- `kts sync` moves the stored cursor -----------------------------------------------------------------


@contextlib.contextmanager
def kts_code_location(instance: dg.DagsterInstance):
    """kts's Definitions loaded in this process as the code location ``kts`` (workspace.yaml's
    name), as the sensor daemon sees them: yields the workspace process context."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    origin = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="kts_assets.definitions"),
                                         location_name=sensors_roll.CODE_LOCATION_NAME)
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as context:
        yield context


def remote_roll_sensor(workspace):
    """The roll sensor as the daemon sees it in that workspace (a ``RemoteSensor``)."""
    return (workspace.create_request_context().get_code_location(sensors_roll.CODE_LOCATION_NAME)
            .get_repository("__repository__").get_sensor(segment_roll_sensor.name))


def stored_roll_cursor(workspace) -> str | None:
    """The roll sensor's cursor as the daemon reads it for the sensor of that workspace."""
    sensor = remote_roll_sensor(workspace)
    state = workspace.instance.get_instigator_state(sensor.get_remote_origin_id(), sensor.selector_id)
    return None if state is None else state.instigator_data.cursor


def test_advancing_the_cursor_creates_the_state_the_daemon_reads_then_merges_into_it(instance):
    with kts_code_location(instance) as workspace:
        assert stored_roll_cursor(workspace) is None
        sensors_roll.advance_roll_cursor(instance, {"orders-0": 100, "orders-1": 0})
        assert requested_in(instance, stored_roll_cursor(workspace)) == {"orders-0": 100, "orders-1": 0}
        lag = {LAG_SEGMENTS: {"orders-0": 1}, LAG_BYTES: {"orders-0": 10}}
        sensors_roll.advance_roll_cursor(instance, {})  # nothing copied: nothing written
        state = [s for s in instance.all_instigator_state() if s.instigator_name == segment_roll_sensor.name]
        assert len(state) == 1
        instance.update_instigator_state(state[0].with_data(state[0].instigator_data._replace(
            cursor=encode_cursor({"orders-0": 100, "orders-2": 7}, lag))))
        sensors_roll.advance_roll_cursor(instance, {"orders-0": 300})
        maps = decode_cursor_maps(sensor_state(instance, sensors_roll.SENSOR_NAME, stored_roll_cursor(workspace)))
        assert maps == {"requested": {"orders-0": 300, "orders-2": 7}, **lag}  # the lag left for the next tick
        assert len([s for s in instance.all_instigator_state() if s.instigator_name == segment_roll_sensor.name]) == 1


# --- the benchmark ---------------------------------------------------------------------------------------


def test_the_sensor_tick_bench_quick_runs_and_writes_json(tmp_path, pg_admin_url):
    import os
    import subprocess
    import sys

    out = tmp_path / "sensor_tick.json"
    script = Path(__file__).resolve().parent.parent / "bench" / "sensor_tick_bench.py"
    done = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KTS_DATABASE_URL": pg_admin_url})  # its database on the tests' server
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert [r["partitions"] for r in data["results"]] == [200, 1000]
    for result in data["results"]:
        assert {"scandir", "survey", "first_tick", "idle_tick", "retention_idle"} == result["seconds"].keys()
        assert {"survey", "first_tick", "idle_tick", "retention_idle"} == result["share_of_60s_budget"].keys()


# --- a pass the sensor did not request (`kts sync`) moves its cursor --------------------------------


def _stored_sensor_state(instance: dg.DagsterInstance, name: str, cursor: str | None):
    """A sensor's state as the daemon stores it after its first tick."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
    from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, InstigatorType, SensorInstigatorData
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="kts_assets.definitions"), location_name=sensors_roll.CODE_LOCATION_NAME)
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "__repository__"), name)
    return instance.add_instigator_state(
        InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING, SensorInstigatorData(cursor=cursor)))


def _cursor_of(instance: dg.DagsterInstance, state) -> str | None:
    return instance.get_instigator_state(state.instigator_origin_id, state.selector_id).instigator_data.cursor


def test_a_kts_sync_pass_moves_the_stored_cursor_so_the_next_tick_asks_for_nothing(tmp_path, instance):
    add_partitions(instance, ["orders-0", "orders-1", "orders-2"])
    log_dir = three_partitions(tmp_path)
    roll = _stored_sensor_state(instance, segment_roll_sensor.name, encode_cursor({}))
    other = _stored_sensor_state(instance, "partition_discovery_sensor", "untouched")
    eligible = survey_log_dirs([log_dir], ["orders-0", "orders-1", "orders-2"]).eligible

    assert sensors_roll.advance_roll_cursor(instance, eligible) == 1

    cursor = _cursor_of(instance, roll)
    assert requested_in(instance, cursor) == {"orders-0": 100}
    assert _cursor_of(instance, other) == "untouched"
    assert tick(instance, log_dir, cursor=cursor).run_requests == []
    assert sensors_roll.advance_roll_cursor(instance, eligible) == 0  # nothing new: nothing written


def test_without_a_stored_sensor_state_moving_the_cursor_adds_the_state_the_daemon_will_read(instance):
    assert sensors_roll.advance_roll_cursor(instance, {"orders-0": 100}) == 1
    assert sensors_roll.advance_roll_cursor(instance, {}) == 0
