"""The data-loss alarm persists: the rule that finds offsets deleted locally before they reached the
remote tier, the store that keeps each lost range until a person acknowledges it (who, when, why,
in the event log), and the reported case end to end — the broker's size retention deletes segments
kts never copied, and every later `kts sync` exits non-zero naming the range, `kts status` lists it,
until `kts ack-loss` accepts it."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import uuid

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.lost_ranges import lost_offset_ranges, uncovered
from kts_resources.metadata.store import EventKind, RemoteLogMetadataStore, RemoteResourceNotFoundError
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition

# -- the rule -------------------------------------------------------------------------------------


def test_a_hole_between_the_remote_end_and_the_local_log_start_is_lost():
    """The reported case: remote 0..17939, the broker's retention moved the local start to 27480."""
    assert lost_offset_ranges(remote=[(0, 17939)], local_log_start_offset=27480, first_observed_offset=0) == [(17940, 27479)]


def test_a_gap_between_finished_remote_segments_below_the_local_log_is_lost():
    remote = [(0, 99), (200, 299), (300, 399)]
    assert lost_offset_ranges(remote=remote, local_log_start_offset=400, first_observed_offset=0) == [(100, 199)]


def test_a_gap_between_remote_segments_still_held_locally_is_not_lost():
    """A segment being re-copied, say: its offsets are still on the local disk."""
    assert lost_offset_ranges(remote=[(0, 99), (200, 299)], local_log_start_offset=100, first_observed_offset=0) == []


def test_data_gone_before_kts_first_looked_is_not_lost():
    assert lost_offset_ranges(remote=[(500, 599)], local_log_start_offset=600, first_observed_offset=500) == []
    # Nothing observed and nothing copied: kts cannot know what the broker had.
    assert lost_offset_ranges(remote=[], local_log_start_offset=600, first_observed_offset=None) == []


def test_data_below_a_log_start_offset_kts_recorded_is_not_lost():
    """DeleteRecords or remote retention raised the partition's log start offset in the store."""
    assert lost_offset_ranges(remote=[(300, 399)], local_log_start_offset=400, first_observed_offset=0,
                              recorded_log_start_offset=300) == []


def test_nothing_copied_since_the_first_observation_loses_what_left_the_disk():
    assert lost_offset_ranges(remote=[], local_log_start_offset=250, first_observed_offset=100) == [(100, 249)]


def test_ranges_already_recorded_are_not_found_again_and_only_the_new_part_is():
    """The hole grew after it was recorded: only the new offsets make a new range."""
    assert lost_offset_ranges(remote=[(0, 99)], local_log_start_offset=300, first_observed_offset=0,
                              known_lost=[(100, 199)]) == [(200, 299)]


def test_uncovered_subtracts_overlapping_ranges():
    assert uncovered(0, 20, [(5, 7), (6, 9), (15, 30)]) == [(0, 4), (10, 14)]
    assert uncovered(0, 9, [(0, 9)]) == []


# -- the store ------------------------------------------------------------------------------------


@pytest.fixture
def tip(metadata_store: RemoteLogMetadataStore) -> TopicIdPartition:
    topic_id = uuid.uuid4()
    metadata_store.ensure_topic("orders", topic_id)
    return TopicIdPartition(topic_id, TopicPartition("orders", 0))


def test_a_lost_range_is_recorded_once_and_stays_open(metadata_store, tip):
    assert metadata_store.record_lost_range(tip, 17940, 27479, "copy pass")
    assert not metadata_store.record_lost_range(tip, 17940, 27479, "copy pass")
    [lost] = metadata_store.lost_ranges(tip)
    assert (lost.start_offset, lost.end_offset, lost.how_found, lost.acknowledged) == (17940, 27479, "copy pass", False)
    assert lost.offsets == 9540
    detected = [e for e in metadata_store.events(tip) if e.kind == EventKind.LOST_RANGE_DETECTED]
    assert [e.details for e in detected] == [{"start_offset": 17940, "end_offset": 27479, "how_found": "copy pass"}]


def test_an_acknowledged_range_leaves_the_open_list_but_keeps_who_when_and_why(metadata_store, tip):
    metadata_store.record_lost_range(tip, 100, 199, "copy pass")
    metadata_store.record_lost_range(tip, 500, 599, "copy pass")
    acked = metadata_store.acknowledge_lost_range(tip, 100, 199, by="alice", reason="retention misconfigured")
    assert (acked.acknowledged_by, acked.reason) == ("alice", "retention misconfigured") and acked.acknowledged_at is not None
    assert [str(r) for r in metadata_store.lost_ranges(tip)] == ["500..599"]
    every = metadata_store.lost_ranges(tip, include_acknowledged=True)
    assert [(str(r), r.acknowledged) for r in every] == [("100..199", True), ("500..599", False)]
    # Acknowledging again changes nothing, recording it again does not reopen it.
    assert metadata_store.acknowledge_lost_range(tip, 100, 199, by="bob") == acked
    assert not metadata_store.record_lost_range(tip, 100, 199, "copy pass")
    acks = [e for e in metadata_store.events(tip) if e.kind == EventKind.LOST_RANGE_ACKNOWLEDGED]
    assert [e.details for e in acks] == [{"start_offset": 100, "end_offset": 199, "by": "alice", "reason": "retention misconfigured"}]


def test_acknowledging_an_unknown_range_names_the_open_ones(metadata_store, tip):
    metadata_store.record_lost_range(tip, 100, 199, "copy pass")
    with pytest.raises(RemoteResourceNotFoundError, match=r"no lost range 100\.\.150 \(open ones: 100\.\.199\)"):
        metadata_store.acknowledge_lost_range(tip, 100, 150, by="alice")


def test_a_bad_range_is_refused(metadata_store, tip):
    with pytest.raises(ValueError):
        metadata_store.record_lost_range(tip, 10, 9, "copy pass")


def test_the_first_observed_offset_is_kept_from_the_first_observation(metadata_store, tip):
    assert metadata_store.first_observed_offset(tip) is None
    assert metadata_store.observe_first_offset(tip, 42) == 42
    assert metadata_store.observe_first_offset(tip, 900) == 42
    assert metadata_store.first_observed_offset(tip) == 42
    assert [e.details for e in metadata_store.events(tip) if e.kind == EventKind.FIRST_OFFSET_OBSERVED] == [{"offset": 42}]


# -- the reported case, end to end ----------------------------------------------------------------

CONFIG = dict(seed=7, topics=("orders",), partitions=1, segment_bytes=48 * 1024)


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_a_segment_the_broker_deleted_before_it_was_copied_alarms_on_every_sync_until_acknowledged(tmp_path, pg_url, metadata_store):
    log_dir, dagster_home, remote = tmp_path / "logs", tmp_path / "dagster", tmp_path / "remote"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home)}

    def kts(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, capture_output=True, text=True, timeout=600)

    simulate(log_dir, SimulationConfig(total_bytes=300 * 1024, **CONFIG))
    first = kts("sync")
    assert first.returncode == 0, first.stderr[-3000:]
    [tip] = metadata_store.partitions()
    finished = metadata_store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
    remote_end = max(md.end_offset for md in finished)

    # More data, then the broker's size retention (not tiering-aware) deletes the oldest segments,
    # copied or not, and advances its log-start-offset-checkpoint: kts never saw the newest of them.
    summary = simulate(log_dir, SimulationConfig(total_bytes=300 * 1024, retention_bytes=100 * 1024, **CONFIG))
    assert summary.segments_deleted > 0
    [partition] = LogDir(log_dir).partitions()
    local_start = partition.segments()[0].base_offset
    assert LogDir(log_dir).log_start_offset(partition.topic_partition) == local_start
    assert local_start > remote_end + 1, "the retention must have deleted segments kts never copied"
    lost = f"{remote_end + 1}..{local_start - 1}"
    alarm = f"orders-0: offsets {lost} were deleted from the local log before they were copied to the remote tier"

    for _ in range(2):  # the alarm does not go quiet after it fired once
        again = kts("sync")
        assert again.returncode == 1, again.stderr[-3000:]
        assert [line for line in again.stderr.splitlines() if line.startswith(f"kts: {alarm}")] != []
        assert f"--range {lost}" in again.stderr

    status = kts("status", "--json")
    assert status.returncode == 0, status.stderr
    [row] = json.loads(status.stdout)
    assert row["lost_ranges"] == [[remote_end + 1, local_start - 1]]
    table = kts("status")
    assert table.returncode == 0 and "lost_ranges" in table.stdout.splitlines()[0] and lost in table.stdout

    wrong = kts("ack-loss", "orders", "0", "--range", f"{remote_end + 1}..{local_start}")
    assert wrong.returncode == 1 and f"open ones: {lost}" in wrong.stderr
    ack = kts("ack-loss", "orders", "0", "--range", lost, "--reason", "retention.bytes too small; accepted")
    assert ack.returncode == 0, ack.stderr
    assert f"lost range {lost} acknowledged by {getpass.getuser()}" in ack.stdout

    status = kts("status", "--json")
    assert json.loads(status.stdout)[0]["lost_ranges"] == []
    after = kts("sync")
    assert after.returncode == 0, after.stderr[-3000:]
    [kept] = metadata_store.lost_ranges(tip, include_acknowledged=True)
    assert (str(kept), kept.acknowledged_by, kept.reason) == (lost, getpass.getuser(), "retention.bytes too small; accepted")
    kinds = [e.kind for e in metadata_store.events(tip)]
    assert kinds.count(EventKind.LOST_RANGE_DETECTED) == 1 and kinds.count(EventKind.LOST_RANGE_ACKNOWLEDGED) == 1


# -- one range, one cause (issue 34, finding 10) --------------------------------------------------


@pytest.mark.parametrize("owned", [True, False], ids=["owned log dir", "broker-owned log dir"])
def test_a_lost_range_has_one_cause_wherever_it_is_reported(tmp_path, metadata_store, owned):
    """The data-loss check (its verdict, which `kts sync` repeats for a failed check) and `kts sync`'s
    and `kts status`'s alarm line (``describe``) word one range the same, owned log dir or not:
    kts cannot know who deleted the files, so neither names a culprit."""
    from kts_assets.checks import _no_uncopied_segment_lost
    from kts_resources.kafka.simulator.broker_log import BrokerLogDir
    from kts_resources.kafka.records import NewRecord, build_batch
    from kts_resources.tiering.lost_ranges import describe
    from kts_resources.tiering.tiers import locate_partitions, topic_id_partition

    logs = tmp_path / "logs"
    with BrokerLogDir(logs) as broker:
        log = broker.partition("orders", 0)
        log.append(build_batch([NewRecord(1, None, b"x")], base_offset=0), leader_epoch=0)
        broker.checkpoint()
        metadata_store.ensure_topic("orders", broker.topic_id("orders"))
    located, _ = locate_partitions([logs], ["orders-0"], owned_log_dirs=[logs] if owned else [])
    loc = located["orders-0"]
    tip = topic_id_partition(loc.partition, metadata_store)
    metadata_store.record_lost_range(tip, 100, 199, "copy pass")
    [lost] = metadata_store.lost_ranges(tip)

    ok, _metadata, verdict = _no_uncopied_segment_lost(loc, metadata_store)
    line = describe(lost)
    assert not ok and verdict == line
    assert line.startswith("offsets 100..199 were deleted from the local log before they were copied to the remote tier (")
    assert "by kts" not in line and "by the broker" not in line


@pytest.mark.parametrize("copy_disabled", [False, True], ids=["copying", "remote.log.copy.disable"])
def test_the_broker_deleting_uncopied_segments_is_loss_only_while_kts_copies(tmp_path, metadata_store, copy_disabled):
    """With remote.log.copy.disable=true nothing is copied and the broker's local retention keeps the
    topic's retention.* (KIP-950): what it deletes is expired, so the data-loss check records
    nothing; while copying is on, the same deletion is a lost range."""
    from kts_assets.checks import _no_uncopied_segment_lost
    from kts_resources.kafka.simulator.broker_log import BrokerLogDir
    from kts_resources.kafka.records import NewRecord, build_batch
    from kts_resources.tiering.tiers import locate_partitions, topic_id_partition

    logs = tmp_path / "logs"
    with BrokerLogDir(logs) as broker:
        log = broker.partition("orders", 0)
        log.append(build_batch([NewRecord(1, None, b"x")] * 3, base_offset=0), leader_epoch=0)
        log.roll()
        log.append(build_batch([NewRecord(2, None, b"y")] * 3, base_offset=0), leader_epoch=0)
        log.update_high_watermark(6)
        broker.checkpoint()
        metadata_store.ensure_topic("orders", broker.topic_id("orders"))
    located, _ = locate_partitions([logs], ["orders-0"])
    tip = topic_id_partition(located["orders-0"].partition, metadata_store)
    metadata_store.observe_first_offset(tip, 0)  # kts looked while the first segment was there
    if copy_disabled:
        metadata_store.set_topic_config("orders", "remote.log.copy.disable", "true")
    for path in (logs / "orders-0").glob(f"{0:020d}.*"):  # the broker's retention
        path.unlink()
    located, _ = locate_partitions([logs], ["orders-0"])

    ok, metadata, _verdict = _no_uncopied_segment_lost(located["orders-0"], metadata_store)

    assert ok == copy_disabled
    assert [(r.start_offset, r.end_offset) for r in metadata_store.lost_ranges(tip)] == ([] if copy_disabled else [(0, 2)])
