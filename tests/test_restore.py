"""`kts restore`: a partition's log directory rebuilt from the remote tier alone — the seeds'
broker-rebuild case — on both tiers: segments, indexes, transaction indexes and producer snapshots
byte-identical to what the broker wrote, indexes that `kts index verify` accepts, the leader-epoch
checkpoint, partition.metadata and the log dir's checkpoints; from an offset; a damaged remote
object is one error naming it with nothing half-written under a final name; a target holding
segments is refused; an interrupted restore is finished by a rerun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kts_resources.kafka.checkpoints import read_offset_checkpoint, read_partition_metadata
from kts_resources.kafka.indexes import verify_segment_indexes
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_storage.base import stored_objects
from kts_resources.maintenance.restore import MARKER, PARTIAL, RestoreError, restore_partition
from .partition_steps import copy_each_partition

TOPIC = "orders"


@pytest.fixture
def copied(tmp_path, metadata_store, remote_storage):
    """A simulated partition (transactions, all codecs) with its closed segments copied."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=6, topics=(TOPIC,), partitions=1, total_bytes=200 * 1024, segment_bytes=24 * 1024))
    [result] = copy_each_partition(LogDir(root), metadata_store, remote_storage)
    assert result.stopped is None and len(result.copied) >= 4
    return root, result.copied


def _files(partition_dir: Path, suffixes=(".log", ".index", ".timeindex", ".txnindex", ".snapshot")) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(partition_dir.iterdir()) if p.suffix in suffixes}


def test_a_restored_partition_is_byte_identical_and_its_indexes_verify(copied, tmp_path, metadata_store, remote_storage):
    root, segments = copied
    original = root / f"{TOPIC}-0"
    result = restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored")
    restored = tmp_path / "restored" / f"{TOPIC}-0"
    assert result.partition_dir == restored and result.segments == len(segments)
    wanted = {name: data for name, data in _files(original).items()
              if int(name.split(".")[0]) <= segments[-1].end_offset + 1 and
              (not name.endswith(".snapshot") or int(name.split(".")[0]) in {md.end_offset + 1 for md in segments})
              and (name.endswith(".snapshot") or int(name.split(".")[0]) in {md.start_offset for md in segments})}
    assert _files(restored) == wanted
    for md in segments[:-1]:
        assert verify_segment_indexes(restored / f"{md.start_offset:020d}.log", closed=True) == []
    assert read_partition_metadata(restored / "partition.metadata").topic_id == read_partition_metadata(original / "partition.metadata").topic_id
    assert (restored / "leader-epoch-checkpoint").read_bytes().startswith(b"0\n")
    end = segments[-1].end_offset + 1
    for name in ("replication-offset-checkpoint", "recovery-point-offset-checkpoint"):
        assert {str(tp): o for tp, o in read_offset_checkpoint(tmp_path / "restored" / name).items()} == {f"{TOPIC}-0": end}
    assert not (restored / MARKER).exists() and not list(restored.glob(f"*{PARTIAL}"))
    # A second restore into the same dir is refused: nothing is overwritten.
    with pytest.raises(RestoreError, match="already holds segments"):
        restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored")


def test_restore_from_an_offset_starts_at_the_segment_holding_it(copied, tmp_path, metadata_store, remote_storage):
    _root, segments = copied
    target = segments[2]
    result = restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored", from_offset=target.start_offset + 1)
    restored = tmp_path / "restored" / f"{TOPIC}-0"
    assert sorted(p.name for p in restored.glob("*.log"))[0] == f"{target.start_offset:020d}.log"
    assert result.segments == len(segments) - 2 and result.log_start_offset == target.start_offset


def test_a_damaged_remote_object_is_named_and_nothing_half_written_stays(copied, tmp_path, metadata_store, remote_storage):
    _root, segments = copied
    victim = stored_objects(segments[1].custom_metadata)["log"]
    data = bytearray(remote_storage.fetch_object(victim.key))
    data[len(data) // 2] ^= 0x01
    remote_storage.put_object(victim.key, bytes(data))
    with pytest.raises(RestoreError, match=r"the remote object is damaged") as failed:
        restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored")
    assert remote_storage.location(victim.key) in str(failed.value)
    restored = tmp_path / "restored" / f"{TOPIC}-0"
    assert not (restored / f"{segments[1].start_offset:020d}.log").exists()
    assert not list(restored.glob(f"*{PARTIAL}"))
    assert (restored / MARKER).exists()  # the restore is unfinished, and says so to a rerun


def test_an_interrupted_restore_is_finished_by_a_rerun(copied, tmp_path, metadata_store, remote_storage):
    _root, segments = copied
    first = restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "whole")
    restored = tmp_path / "restored" / f"{TOPIC}-0"
    restored.mkdir(parents=True)
    (restored / MARKER).touch()
    # What a SIGKILL half-way leaves: some files whole, one partial, the marker.
    for name in sorted(p.name for p in first.partition_dir.glob("*.log"))[:2]:
        (restored / name).write_bytes((first.partition_dir / name).read_bytes())
    (restored / (sorted(p.name for p in first.partition_dir.glob("*.index"))[0] + PARTIAL)).write_bytes(b"\0" * 7)
    again = restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "restored")
    assert again.already_whole == 2
    assert _files(restored) == _files(first.partition_dir)
    assert not (restored / MARKER).exists()


def test_kts_restore_on_the_command_line(copied, tmp_path, pg_url, remote_storage):
    root, segments = copied
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_HOME": str(tmp_path / "home"), "KTS_LOG_DIRS": str(root),
           "KTS_REMOTE_URI": remote_storage.location("").rstrip("/") if remote_storage.location("").startswith("file:") else ""}
    if not env["KTS_REMOTE_URI"]:
        pytest.skip("the CLI path is the same for both tiers; the S3 endpoint's settings are tests/test_cli_read.py's")
    run = subprocess.run([sys.executable, "-m", "kts_assets.cli", "restore", TOPIC, "0", "--to", str(tmp_path / "cli"), "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["segments"] == len(segments) and summary["log_end_offset"] == segments[-1].end_offset + 1
    assert "segments" in run.stderr  # progress on stderr
    unknown = subprocess.run([sys.executable, "-m", "kts_assets.cli", "restore", "nope", "0", "--to", str(tmp_path / "x")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 1 and unknown.stderr.strip().count("\n") == 0 and "nope" in unknown.stderr
    refused = subprocess.run([sys.executable, "-m", "kts_assets.cli", "restore", TOPIC, "0", "--to", str(tmp_path / "cli")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "already holds segments" in refused.stderr


def test_nothing_remote_is_one_clear_error(tmp_path, metadata_store, remote_storage):
    with pytest.raises(RestoreError, match="not known"):
        restore_partition(metadata_store, remote_storage, "never-seen", 0, tmp_path / "restored")


def test_a_restore_sigkilled_half_way_is_converged_by_a_rerun(copied, tmp_path, pg_url, metadata_store, remote_storage):
    if not remote_storage.location("").startswith("file:"):
        pytest.skip("the driver names the tier by URI; the S3 path differs only below the read")
    root, segments = copied
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": remote_storage.location("")}
    target = tmp_path / "restored"
    killed = subprocess.run([sys.executable, "-m", "tests.tier_tools_driver", "restore", "5", TOPIC, "0", str(target)],
                            env=env, capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert killed.returncode == -9, killed.stderr
    partition_dir = target / f"{TOPIC}-0"
    assert (partition_dir / MARKER).exists()  # half-way, and it says so
    result = restore_partition(metadata_store, remote_storage, TOPIC, 0, target)
    assert result.already_whole >= 1
    whole = restore_partition(metadata_store, remote_storage, TOPIC, 0, tmp_path / "whole").partition_dir
    assert _files(partition_dir) == _files(whole) and not list(partition_dir.glob(f"*{PARTIAL}"))
