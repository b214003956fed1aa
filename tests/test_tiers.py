"""A partition's two tiers (kts_resources.tiering.tiers): which segments may be copied, the log start
offset, and which partition dirs disagree about their topic's id — with offsets worked out by
hand; and `kts status` reads them without importing Dagster or PySpark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from kts_resources.kafka.checkpoints import PartitionMetadata, write_partition_metadata
from kts_resources.kafka.logdir import LogDir, SegmentFiles
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.tiers import (
    active_log_end_offset,
    copy_candidates,
    eligible_segment_count,
    log_start_offset,
    newest_eligible_base_offset,
    topic_id_disagreements,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _segments(*bases: int) -> list[SegmentFiles]:
    out = []
    for i, base in enumerate(bases):
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        p = Path(f"{base:020d}.log")
        out.append(SegmentFiles(base, p, p.with_suffix(".index"), p.with_suffix(".timeindex"), None, nxt is None, nxt))
    return out


# --- copy eligibility ----------------------------------------------------------------------------


def test_a_segment_is_eligible_once_its_successor_starts_at_or_below_min_of_high_watermark_and_recovery_point():
    bases = [0, 100, 200]  # 200 is active
    assert eligible_segment_count(bases, high_watermark=250, recovery_point=250) == 2
    assert eligible_segment_count(bases, high_watermark=200, recovery_point=900) == 2
    assert eligible_segment_count(bases, high_watermark=199, recovery_point=900) == 1
    assert eligible_segment_count(bases, high_watermark=900, recovery_point=150) == 1
    assert eligible_segment_count(bases, high_watermark=99, recovery_point=99) == 0
    assert eligible_segment_count(bases, high_watermark=-1, recovery_point=900) == 0  # unknown: nothing


def test_the_active_segment_is_never_eligible():
    assert eligible_segment_count([0], high_watermark=10**9, recovery_point=10**9) == 0
    assert eligible_segment_count([], high_watermark=5, recovery_point=5) == 0
    assert [s.base_offset for s in copy_candidates(_segments(0, 100), high_watermark=10**9, recovery_point=10**9,
                                                   log_start_offset=0, highest_copied_offset=-1)] == [0]


def test_the_newest_eligible_base_offset_is_the_last_eligible_segments():
    bases = [0, 100, 200]
    assert newest_eligible_base_offset(bases, high_watermark=250, recovery_point=250) == 100
    assert newest_eligible_base_offset(bases, high_watermark=199, recovery_point=900) == 0
    assert newest_eligible_base_offset(bases, high_watermark=99, recovery_point=99) is None


def test_candidates_are_the_eligible_segments_wholly_below_neither_the_highest_copied_nor_the_log_start_offset():
    segments = _segments(0, 100, 200, 300, 400)
    kw = dict(high_watermark=400, recovery_point=400)
    assert [s.base_offset for s in copy_candidates(segments, log_start_offset=0, highest_copied_offset=99, **kw)] == [100, 200, 300]
    assert [s.base_offset for s in copy_candidates(segments, log_start_offset=250, highest_copied_offset=-1, **kw)] == [200, 300]
    plan = copy_candidates(segments, high_watermark=1000, recovery_point=250, log_start_offset=0, highest_copied_offset=-1)
    assert [s.base_offset for s in plan] == [0, 100]  # 200's successor 300 > recovery point 250


# --- the log start offset ------------------------------------------------------------------------


def test_the_log_start_offset_is_the_oldest_data_in_either_tier_the_checkpoint_bounding_only_the_local_log():
    assert log_start_offset(checkpointed=None, local_log_start_offset=100) == 100
    assert log_start_offset(checkpointed=130, local_log_start_offset=100) == 130  # the broker's, nothing remote
    assert log_start_offset(checkpointed=None, local_log_start_offset=500, remote_log_start_offset=0) == 0
    assert log_start_offset(checkpointed=540, local_log_start_offset=500, remote_log_start_offset=0) == 0  # issue 34
    assert log_start_offset(checkpointed=None, local_log_start_offset=500, remote_log_start_offset=0, recorded=70) == 70
    assert log_start_offset(checkpointed=None, local_log_start_offset=-1, remote_log_start_offset=20) == 20
    assert log_start_offset(checkpointed=None, local_log_start_offset=-1) == -1  # no data anywhere


# --- topic ids -----------------------------------------------------------------------------------


def write_topic_id(log_dir: Path, key: str, topic_id: uuid.UUID) -> None:
    """Give one partition dir another topic id, as a dir left from an earlier incarnation has."""
    write_partition_metadata(log_dir / key / "partition.metadata", PartitionMetadata(0, topic_id))


def test_a_partition_dir_whose_topic_id_disagrees_with_its_siblings_is_named_with_both_ids(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=2, topics=("orders",), partitions=3, total_bytes=12 * 1024))
    partitions = {p.topic_partition: p for p in LogDir(tmp_path).partitions()}
    current = partitions[TopicPartition("orders", 0)].metadata().topic_id
    stale = uuid.uuid4()
    write_topic_id(tmp_path, "orders-2", stale)
    found = topic_id_disagreements(LogDir(tmp_path).partitions())
    assert list(found) == [tmp_path / "orders-2"]
    line = str(found[tmp_path / "orders-2"])
    assert str(tmp_path / "orders-2") in line and str(stale) in line and str(current) in line and "\n" not in line


def test_partition_dirs_that_agree_have_no_disagreement(tmp_path):
    simulate(tmp_path, SimulationConfig(seed=2, topics=("orders", "clicks"), partitions=2, total_bytes=12 * 1024))
    assert topic_id_disagreements(LogDir(tmp_path).partitions()) == {}


# --- kts status stays light ----------------------------------------------------------------------


def test_kts_status_imports_neither_dagster_nor_pyspark(tmp_path, pg_url):
    simulate(tmp_path / "logs", SimulationConfig(seed=4, topics=("orders",), partitions=2, total_bytes=32 * 1024))
    probe = ("import json, sys\nfrom kts_assets.cli.main import main\ncode = main(['status', '--json'])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark', 'dagster_pyspark'))\n"
             "print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)\n")
    env = {**os.environ, "KTS_HOME": str(tmp_path / "home"), "KTS_LOG_DIRS": str(tmp_path / "logs"), "KTS_DATABASE_URL": pg_url}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    found = json.loads(done.stderr.strip().splitlines()[-1])
    assert found == {"code": 0, "heavy": []}, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["topic"], r["partition"]) for r in rows] == [("orders", 0), ("orders", 1)]



def test_the_file_commands_start_without_the_metadata_stores_database_driver(tmp_path):
    # kts segments / dump / index read files only; the parser they are built with (which knows every
    # command) must not pull in SQLAlchemy or psycopg2, which cost most of a second at start-up.
    simulate(tmp_path / "logs", SimulationConfig(seed=4, topics=("orders",), partitions=1, total_bytes=32 * 1024))
    probe = ("import json, sys\nfrom kts_assets.cli.main import main\n"
             f"code = main(['segments', '--json', {str(tmp_path / 'logs' / 'orders-0')!r}])\n"
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'psycopg2', 'dagster', 'pyspark', 'boto3'})\n"
             "print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)\n")
    env = {**os.environ, "KTS_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"code": 0, "heavy": []}, done.stderr
    assert len(json.loads(done.stdout)) >= 1

def _active(tmp_path) -> list[SegmentFiles]:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=17, topics=("orders",), partitions=1, total_bytes=200 * 1024, segment_bytes=64 * 1024))
    [partition] = LogDir(root).partitions()
    return partition.segments()


def test_the_log_end_offset_reads_only_the_active_segments_tail_after_its_offset_index(tmp_path, monkeypatch):
    from kts_resources.kafka import segment
    from kts_resources.kafka.indexes import read_offset_index
    from kts_resources.kafka.segment import summarize_segment

    segments = _active(tmp_path)
    active = segments[-1]
    assert len(read_offset_index(active.offset_index, active.base_offset)) > 1  # the index has a tail to start from
    whole = summarize_segment(active.log, active.base_offset, active=True).next_offset

    def no_whole_scan(*args, **kwargs):
        raise AssertionError("the whole active segment was scanned")

    monkeypatch.setattr(segment, "summarize_segment", no_whole_scan)
    assert active_log_end_offset(segments) == whole


def test_an_offset_index_that_points_at_no_batch_means_the_whole_segment_is_scanned(tmp_path):
    from kts_resources.kafka.segment import summarize_segment

    segments = _active(tmp_path)
    active = segments[-1]
    whole = summarize_segment(active.log, active.base_offset, active=True).next_offset
    data = bytearray(active.offset_index.read_bytes())
    for position in (active.log.stat().st_size + 100, 7):  # past the end; inside the first batch
        data[-4:] = position.to_bytes(4, "big")  # the last entry's position
        active.offset_index.write_bytes(bytes(data))
        assert active_log_end_offset(segments) == whole, position
    active.offset_index.unlink()
    assert active_log_end_offset(segments) == whole
