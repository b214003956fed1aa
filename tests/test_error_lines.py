"""Failures of the environment, not of kts, are one clear line and a non-zero exit, never a
traceback, and leave nothing half-written (issue 34, finding 8): a bad KTS_LOG_LEVEL, a symbolic
link loop in a log dir (as a partition dir, or inside one), a read-only target of restore,
index rebuild or simulate."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kts_resources.kafka.logdir import LogDir, UnreadableSegmentError, discover
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from tests.conftest import REPO_ROOT


def kts(*args, env: dict | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env={**os.environ, **(env or {})})


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kts: "), result.stderr
    return lines[0]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Two topics of two partitions each, a few segments apiece."""
    path = tmp_path / "logs"
    simulate(path, SimulationConfig(seed=3, topics=("orders", "pay"), partitions=2, total_bytes=160 * 1024,
                                    segment_bytes=16 * 1024))
    return path


def self_link(path: Path) -> Path:
    """``path`` as a symbolic link to itself: every stat() through it fails with ELOOP."""
    os.symlink(path.name, path)
    return path


@contextlib.contextmanager
def read_only_dir(path: Path):
    """``path`` as a read-only tmpfs: the tests run as root, whom chmod does not stop."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,ro", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


# --- KTS_LOG_LEVEL ------------------------------------------------------------------------------


def test_a_bogus_log_level_is_one_usage_line_naming_the_variable_and_the_levels(log_dir: Path):
    result = kts("segments", log_dir / "orders-0", env={"KTS_LOG_LEVEL": "BOGUS"})
    assert result.returncode == 2
    line = one_line(result)
    assert "KTS_LOG_LEVEL='BOGUS'" in line and "DEBUG, INFO, WARNING, ERROR, CRITICAL" in line
    assert result.stdout == ""


def test_a_log_level_in_any_case_is_accepted(log_dir: Path):
    assert kts("segments", log_dir / "orders-0", env={"KTS_LOG_LEVEL": "warning"}).returncode == 0


# --- symbolic link loops ------------------------------------------------------------------------


def test_a_partition_dir_that_is_a_link_loop_is_still_discovered_and_its_siblings_too(log_dir: Path):
    # Dropped from discovery, its topic would look gone from the log dirs (and its remote data due
    # for deletion); discovered, reading it fails for it alone.
    self_link(log_dir / "orders-7")
    self_link(log_dir / "not-a-partition")
    found = discover(log_dir)
    assert [str(p.topic_partition) for p in found.partitions] == ["orders-0", "orders-1", "orders-7", "pay-0", "pay-1"]
    with pytest.raises(OSError, match="orders-7"):
        LogDir(log_dir).partition_dir(found.partitions[2].topic_partition).segments()


def test_a_link_loop_named_like_a_segment_makes_only_its_partition_unlistable(log_dir: Path):
    partition = LogDir(log_dir).partitions()[0]
    loop = self_link(partition.path / f"{99_999:020d}.log")
    self_link(partition.path / "stray")
    with pytest.raises(UnreadableSegmentError, match=str(loop)):
        partition.segments()
    skipped = {s.name: s.reason for s in partition.scan().skipped}
    assert "symbolic link" in skipped["stray"] and "symbolic link" in skipped[loop.name]
    assert LogDir(log_dir).partitions()[1].segments()


def test_segments_over_a_self_linked_segment_is_one_finding(log_dir: Path):
    loop = self_link(log_dir / "orders-0" / f"{99_999:020d}.log")
    result = kts("segments", log_dir / "orders-0")
    assert result.returncode == 1
    line = one_line(result)
    assert str(loop) in line and "symbolic link" in line
    rows = result.stdout.splitlines()
    assert rows[0].startswith("base_offset") and rows[1].split()[0] == "0"  # the readable segments still listed


def test_segments_over_a_self_linked_partition_dir_is_one_line_naming_the_loop(log_dir: Path):
    loop = self_link(log_dir / "orders-9")
    result = kts("segments", loop)
    assert result.returncode != 0
    line = one_line(result)
    assert str(loop) in line and "symbolic links" in line


def store_env(tmp_path: Path, log_dir: Path, pg_url: str) -> dict[str, str]:
    return {"KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
            "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}


def test_status_over_link_loops_lists_the_healthy_partitions_and_names_each_loop_once(tmp_path, log_dir, pg_url):
    dir_loop = self_link(log_dir / "orders-7")
    segment_loop = self_link(log_dir / "pay-1" / f"{99_999:020d}.log")

    result = kts("status", "--json", env=store_env(tmp_path, log_dir, pg_url))

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("kts: ") for line in lines), result.stderr
    assert str(dir_loop) in lines[0] and "symbolic links" in lines[0]
    assert str(segment_loop) in lines[1] and "symbolic link" in lines[1]
    import json

    assert [(r["topic"], r["partition"]) for r in json.loads(result.stdout)] == [("orders", 0), ("orders", 1), ("pay", 0)]


def test_fetch_beside_a_link_loop_reads_and_fetch_of_the_loop_is_one_line(tmp_path, log_dir, pg_url):
    loop = self_link(log_dir / "orders-7")
    self_link(log_dir / "orders-0" / "stray")  # no Kafka file: skipped, as any stray file is
    segment_loop = self_link(log_dir / "orders-1" / f"{99_999:020d}.log")
    env = store_env(tmp_path, log_dir, pg_url)

    healthy = kts("fetch", "orders", "0", "--offset", "0", "--json", env=env)
    assert healthy.returncode == 0, healthy.stderr
    assert '"offset":0' in healthy.stdout

    looped = kts("fetch", "orders", "7", "--offset", "0", env=env)
    assert looped.returncode == 1
    line = one_line(looped)
    assert str(loop) in line and "symbolic links" in line

    hidden = kts("fetch", "orders", "1", "--offset", "0", env=env)
    assert hidden.returncode == 1
    line = one_line(hidden)
    assert str(segment_loop) in line and "symbolic link" in line


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_sync_beside_link_loops_tiers_every_healthy_partition_and_names_each_loop(tmp_path, log_dir, pg_url):
    import json

    from .test_sync_outcome import kts as kts_in, sync_env

    dir_loop = self_link(log_dir / "orders-7")
    segment_loop = self_link(log_dir / "pay-1" / f"{99_999:020d}.log")
    self_link(log_dir / "orders-0" / "stray")
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)

    result = kts_in(env, "sync")

    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    failed = [line for line in result.stderr.splitlines() if line.startswith(("kts: orders-7", "kts: pay-1", f"kts: {dir_loop}"))]
    assert any(str(dir_loop) in line for line in failed) and any(str(segment_loop) in line for line in failed), result.stderr
    status = kts_in(env, "status", "--json")
    assert status.returncode == 1
    rows = {(r["topic"], r["partition"]): r for r in json.loads(status.stdout)}
    assert set(rows) == {("orders", 0), ("orders", 1), ("pay", 0)}
    for row in rows.values():
        assert row["remote_segments"] > 0 and row["copy_lag_segments"] == 0, row


def test_the_roll_survey_and_the_index_check_pass_over_link_loops(log_dir: Path):
    from kts_assets.sensors.roll import survey_log_dirs
    from kts_resources.maintenance.local_indexes import index_problems

    self_link(log_dir / "orders-7")
    self_link(log_dir / "pay-1" / f"{99_999:020d}.log")
    closed = LogDir(log_dir).partitions()[0].segments()[0]
    closed.offset_index.unlink()
    self_link(closed.offset_index)

    survey = survey_log_dirs([log_dir], ["orders-0", "orders-1", "orders-7", "pay-0", "pay-1"])
    assert sorted(survey.directories) == ["orders-0", "orders-1", "pay-0"]
    (problem,) = index_problems(closed)
    assert str(closed.offset_index) in problem and "cannot be read" in problem


# --- read-only targets --------------------------------------------------------------------------


def test_index_rebuild_into_a_read_only_dir_is_one_line_naming_it(log_dir: Path, tmp_path: Path):
    segment = LogDir(log_dir).partitions()[0].segments()[0].log
    with read_only_dir(tmp_path / "ro") as ro:
        result = kts("index", "rebuild", segment, "--out", ro)
        assert result.returncode == 1
        line = one_line(result)
        assert str(ro) in line and "read-only file system" in line
        assert not any(ro.iterdir())


def test_index_rebuild_beside_a_segment_on_a_read_only_fs_is_one_line_and_leaves_the_index(log_dir: Path, tmp_path: Path):
    import shutil

    source = LogDir(log_dir).partitions()[0].path
    staged = tmp_path / "staged"
    shutil.copytree(source, staged / source.name)
    subprocess.run(["mount", "--bind", str(staged), str(staged)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(staged)], check=True)
        segment = sorted((staged / source.name).glob("*.log"))[0]
        index = segment.with_suffix(".index")
        before = index.read_bytes()
        result = kts("index", "rebuild", segment)
        assert result.returncode == 1
        line = one_line(result)
        assert str(staged / source.name) in line and "read-only file system" in line
        assert index.read_bytes() == before
    finally:
        subprocess.run(["umount", str(staged)], check=True)


def test_simulate_into_a_read_only_dir_is_one_line_naming_it(tmp_path: Path):
    with read_only_dir(tmp_path / "ro") as ro:
        for target in (ro, ro / "logs"):
            result = kts("simulate", "--log-dir", target, "--total-bytes", "64KiB")
            assert result.returncode == 1
            line = one_line(result)
            assert str(ro) in line and "read-only file system" in line
        assert not any(ro.iterdir())


def test_restore_into_a_read_only_dir_is_one_line_naming_it(tmp_path: Path, log_dir: Path, metadata_store, pg_url):
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    from .partition_steps import copy_each_partition

    env = store_env(tmp_path, log_dir, pg_url)
    storage = remote_storage_from_uri(env["KTS_REMOTE_URI"])
    try:
        copied = copy_each_partition(LogDir(log_dir), metadata_store, storage)
    finally:
        storage.close()
    assert all(r.copied for r in copied)
    with read_only_dir(tmp_path / "ro") as ro:
        for target in (ro, ro / "logs"):
            result = kts("restore", "orders", "0", "--to", target, env=env)
            assert result.returncode == 1
            line = one_line(result)
            assert str(ro) in line and "read-only file system" in line
        assert not any(ro.iterdir())


# PostgreSQL killed mid-sync and a full KTS_HOME: tests/test_fault_harness.py (the same scenarios,
# with the same one-line, no-password and path checks).


# --- S3 going down mid-sync ---------------------------------------------------------------------


def sync_until_the_copy_starts(env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    """A ``kts sync`` child, its stderr read up to the line saying copy_job started: (the child,
    those lines)."""
    sync = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = []
    for line in sync.stderr:
        stderr.append(line)
        if "copy_job over" in line:
            break
    return sync, stderr


@pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)
def test_s3_down_mid_sync_names_each_partitions_own_objects(tmp_path, log_dir, pg_url, s3_bucket, s3_cutting_proxy):
    import re

    from .test_sync_outcome import sync_env

    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True, KTS_REMOTE_URI=f"s3://{s3_bucket}/tiered",
                   KTS_S3_ENDPOINT_URL=s3_cutting_proxy.url)
    sync, stderr = sync_until_the_copy_starts(env)
    s3_cutting_proxy.cut_after = s3_cutting_proxy.forwarded + 1  # down from the copy's first request on
    out, more = sync.communicate(timeout=900)
    output = "".join(stderr) + more + out

    assert sync.returncode == 1, output[-3000:]
    assert "Traceback" not in output and "Exceeded max_retries" not in output, output[-3000:]
    failed = {line.split(":")[1].strip(): line for line in more.splitlines() if re.match(r"kts: (orders|pay)-\d: ", line)}
    assert sorted(failed) == ["orders-0", "orders-1", "pay-0", "pay-1"], output[-3000:]
    for key, line in failed.items():
        named = re.findall(rf"s3://{s3_bucket}/\S+", line)
        assert named, line
        # Every object a partition's line names is that partition's: <prefix>/<topic>-<topic id>/<partition>/...
        topic, _, partition = key.rpartition("-")
        assert all(re.search(rf"/{topic}-[^/]+/{partition}/", n) for n in named), (key, line)


def test_a_check_that_cannot_reach_the_tier_fails_each_partition_with_its_own_objects(log_dir: Path):
    # With S3 down, a check's judge raised for the first partition it met, the step failed as a
    # whole, and kts sync gave that partition's object as every partition's cause.
    from kts_assets.checks import _Located
    from kts_resources.remote_log import RemoteStorageError
    from kts_resources.resources import KafkaLogDirsResource

    keys = ["orders-0", "orders-1", "pay-0"]
    located = _Located(KafkaLogDirsResource(log_dirs=str(log_dir)), keys)

    def judge(loc):
        raise RemoteStorageError(f"s3://bucket/tiered/{loc.key}/00000000000000000000.log: cannot reach the S3 endpoint")

    verdicts = located.verdicts(judge)

    assert sorted(verdicts) == keys
    for key, (passed, _metadata, description) in verdicts.items():
        assert not passed and f"s3://bucket/tiered/{key}/" in description, (key, description)
