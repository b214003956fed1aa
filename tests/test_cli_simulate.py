"""``kts simulate`` as a user runs it: a log dir every other kts command reads cleanly, the same
bytes for the same seed, appending on a second run, and one-line errors for bad options."""

from __future__ import annotations

import json
from pathlib import Path

from kts_resources.kafka.checkpoints import read_offset_checkpoint
from kts_resources.kafka.logdir import discover_partitions

from .test_cli import kts

SMALL = ["--total-bytes", "600KiB", "--segment-bytes", "64KiB", "--partitions", "2", "--topics", "orders,page.views,user-events"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_simulate_writes_partitions_that_segments_and_index_verify_find_healthy(tmp_path):
    result = kts("simulate", "--log-dir", tmp_path, "--seed", "3", *SMALL, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["bytes_written"] >= 600 * 1024 and summary["segments_rolled"] > 0
    partitions = discover_partitions(tmp_path)
    assert sorted(p.topic_partition.dir_name for p in partitions) == [
        "orders-0", "orders-1", "page.views-0", "page.views-1", "user-events-0", "user-events-1"]
    for partition in partitions:
        segments = kts("segments", partition.path, "--json")
        assert segments.returncode == 0, segments.stderr
        rows = json.loads(segments.stdout)
        assert len(rows) > 1 and [r["active"] for r in rows] == [False] * (len(rows) - 1) + [True]
        for row in rows:
            assert kts("index", "verify", row["path"]).returncode == 0


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert kts("simulate", "--log-dir", a, "--seed", "11", *SMALL).returncode == 0
    assert kts("simulate", "--log-dir", b, "--seed", "11", *SMALL).returncode == 0
    assert _tree(a) == _tree(b)


def test_a_second_run_keeps_appending_and_advances_the_checkpoints(tmp_path):
    assert kts("simulate", "--log-dir", tmp_path, "--seed", "5", *SMALL).returncode == 0
    before = read_offset_checkpoint(tmp_path / "replication-offset-checkpoint")
    assert kts("simulate", "--log-dir", tmp_path, "--seed", "5", *SMALL).returncode == 0
    after = read_offset_checkpoint(tmp_path / "replication-offset-checkpoint")
    assert before.keys() == after.keys()
    assert all(after[tp] > before[tp] for tp in before)


def test_retention_options_delete_the_oldest_segments(tmp_path):
    result = kts("simulate", "--log-dir", tmp_path, "--seed", "2", *SMALL, "--retention-bytes", "32KiB", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["segments_deleted"] > 0
    log_start = read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint")
    assert any(offset > 0 for offset in log_start.values())


def test_a_bad_option_is_one_line_and_exit_2(tmp_path):
    result = kts("simulate", "--log-dir", tmp_path, "--topics", "../escape")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("kts: simulate: topics: ")
    bad_size = kts("simulate", "--log-dir", tmp_path, "--total-bytes", "lots")
    assert bad_size.returncode == 2 and "not a size" in bad_size.stderr


def test_dump_reads_the_other_files_of_a_partition_like_dump_log_segments(tmp_path):
    assert kts("simulate", "--log-dir", tmp_path, "--seed", "3", *SMALL).returncode == 0
    partition = tmp_path / "orders-0"
    snapshot = sorted(partition.glob("*.snapshot"))[0]
    for path, fields in [
        (partition / "00000000000000000000.index", {"offset", "position"}),
        (partition / "00000000000000000000.timeindex", {"timestamp", "offset"}),
        (snapshot, {"producer_id", "producer_epoch", "last_sequence", "last_offset", "current_txn_first_offset"}),
    ]:
        result = kts("dump", path, "--json")
        assert result.returncode == 0, result.stderr
        entries = json.loads(result.stdout)["entries"]
        assert entries and all(fields <= e.keys() for e in entries)
    damaged = tmp_path / "00000000000000000000.index"
    damaged.write_bytes((partition / "00000000000000000000.index").read_bytes()[:-3])
    result = kts("dump", damaged)
    assert result.returncode == 1 and result.stderr.startswith(f"kts: {damaged}: byte ")
