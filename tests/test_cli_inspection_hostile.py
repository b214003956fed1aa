"""The inspection commands (``segments``, ``dump``, ``index rebuild|verify``, ``simulate``) on real
broker data and on hostile input: a real Kafka 3.7.1 log dir inspects clean, the KRaft metadata log
is inspected but never tiered, memory stays bounded on huge files, a segment truncated while read
gives one line and no signal, and every usage mistake is one line with no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kts_resources.kafka.indexes import rebuild_segment_indexes
from kts_resources.kafka.logdir import discover_partitions
from kts_resources.kafka.records import NewRecord, build_batch, build_control_batch
from tests.conftest import REPO_ROOT, shared_dir

T0 = 1_760_000_000_000


def kts(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT, **kwargs)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command (no traceback, no split line)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def segment(base_offset: int, batches: int = 40) -> bytes:
    out = bytearray()
    offset = base_offset
    for i in range(batches):
        records = [NewRecord(T0 + offset + j, b"k%d" % (offset + j), b"v" * 80) for j in range(3)]
        out += build_batch(records, base_offset=offset)
        offset += 3
    return bytes(out)


@pytest.fixture
def closed_segment(tmp_path: Path) -> Path:
    pdir = tmp_path / "orders-0"
    pdir.mkdir()
    log = pdir / f"{0:020d}.log"
    log.write_bytes(segment(0))
    (pdir / f"{1000:020d}.log").write_bytes(b"")
    rebuild_segment_indexes(log, index_interval_bytes=256)
    return log


# --- a real broker's log dir --------------------------------------------------------------------


REAL_BROKER = shared_dir() / "fixtures" / "real_broker" / "kafka-3.7.1-logs"


def real_partitions() -> list[Path]:
    if not REAL_BROKER.is_dir():
        pytest.fail(f"real broker fixture not found at {REAL_BROKER}; set KTS_SHARED_DIR to the shared/ directory")
    return sorted(p for p in REAL_BROKER.iterdir() if p.is_dir())


def test_every_index_a_kafka_3_7_1_broker_wrote_verifies_clean():
    logs = sorted(REAL_BROKER.glob("*/*.log"))
    assert len(logs) >= 9
    for log in logs:
        result = kts("index", "verify", log)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().endswith("indexes ok")


@pytest.mark.parametrize("partition_dir", real_partitions(), ids=lambda p: p.name)
def test_segments_and_dump_inspect_every_partition_of_a_real_broker(partition_dir: Path):
    result = kts("segments", "--json", partition_dir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for log in sorted(partition_dir.glob("*.log")):
        dumped = kts("dump", "--records", log)
        assert dumped.returncode == 0, dumped.stderr
        for index in (log.with_suffix(".index"), log.with_suffix(".timeindex")):
            assert kts("dump", index).returncode == 0


def test_a_rebuild_of_a_real_brokers_segment_verifies_clean(tmp_path: Path):
    """The cleaner-written index of __consumer_offsets-12 differs from a per-batch rebuild; both verify."""
    pdir = tmp_path / "__consumer_offsets-12"
    pdir.mkdir()
    for f in (REAL_BROKER / "__consumer_offsets-12").glob("*.log"):
        (pdir / f.name).write_bytes(f.read_bytes())
    for log in sorted(pdir.glob("*.log")):
        assert kts("index", "rebuild", log).returncode == 0
        result = kts("index", "verify", log)
        assert result.returncode == 0, result.stderr


# --- the KRaft metadata log ---------------------------------------------------------------------


@pytest.fixture
def metadata_log_dir(tmp_path: Path) -> Path:
    """A KRaft controller's log dir: ``__cluster_metadata-0`` with records and a control batch."""
    pdir = tmp_path / "__cluster_metadata-0"
    pdir.mkdir()
    data = build_batch([NewRecord(T0, None, b"\x01\x0c\x00metadata-record")], base_offset=0, partition_leader_epoch=1)
    data += build_control_batch(base_offset=1, commit=True, producer_id=-1, producer_epoch=-1, coordinator_epoch=0,
                                timestamp=T0 + 1, partition_leader_epoch=1)
    (pdir / f"{0:020d}.log").write_bytes(data)
    (pdir / "quorum-state").write_text('{"leaderId":1,"leaderEpoch":1,"votedId":-1,"appliedOffset":0,"currentVoters":[],"data_version":0}')
    return tmp_path


def test_segments_and_dump_inspect_the_kraft_metadata_log(metadata_log_dir: Path):
    pdir = metadata_log_dir / "__cluster_metadata-0"
    result = kts("segments", pdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:3] == ["0", "1", "2"]
    dumped = kts("dump", "--records", pdir / f"{0:020d}.log")
    assert dumped.returncode == 0, dumped.stderr
    assert "isControl: true" in dumped.stdout


def test_the_kraft_metadata_log_is_never_discovered_for_tiering(metadata_log_dir: Path):
    assert [p.topic_partition for p in discover_partitions(metadata_log_dir)] == []


# --- bounded memory -----------------------------------------------------------------------------


ADDRESS_SPACE_LIMIT = 3 * 2**30


def kts_limited(*args: str) -> subprocess.CompletedProcess:
    """``kts *args`` under a 3 GiB address-space limit. A small Python sets the limit and execs the
    command, rather than a ``preexec_fn``: that runs in a fork of this process, whose gRPC threads
    (the session's Spark Connect client) can abort the child between fork and exec."""
    wrapper = ("import os, resource, sys; "
               f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, {ADDRESS_SPACE_LIMIT})); "
               "os.execv(sys.executable, [sys.executable, '-m', 'kts_assets.cli', *sys.argv[1:]])")
    return subprocess.run([sys.executable, "-c", wrapper, *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)


def test_a_10_gib_sparse_index_under_a_3_gib_address_space_is_one_finding_at_once(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    started = time.monotonic()
    assert kts_limited("index", "verify", closed_segment).returncode == 0
    baseline = time.monotonic() - started  # the same check of the index as Kafka wrote it, on this machine now
    with open(index, "r+b") as f:
        f.truncate(10 * 2**30)  # sparse: no disk used
    started = time.monotonic()
    result = kts_limited("index", "verify", closed_segment)
    assert time.monotonic() - started < 5 * baseline  # at once: 10 GiB is never read
    assert result.returncode == 1
    line = one_line(result)
    assert str(index) in line and "larger than any index Kafka writes" in line


def test_an_index_with_more_entries_than_its_segment_has_batches_is_a_finding_not_a_full_read(closed_segment: Path):
    index = closed_segment.with_suffix(".index")
    # 1,000,000 increasing entries for a 40-batch segment.
    index.write_bytes(b"".join((i + 1).to_bytes(4, "big") + (i * 8).to_bytes(4, "big") for i in range(1_000_000)))
    result = kts("index", "verify", closed_segment)
    assert result.returncode == 1
    assert "more entries than the segment's 40 batches could need" in result.stderr


def test_a_segment_larger_than_any_kafka_writes_is_one_line_not_a_read(tmp_path: Path):
    pdir = tmp_path / "orders-0"
    pdir.mkdir()
    log = pdir / f"{0:020d}.log"
    with open(log, "wb") as f:
        f.truncate(3 * 2**30)
    result = kts_limited("dump", log)
    assert result.returncode == 1
    assert "larger than any Kafka writes" in one_line(result)


# --- a segment truncated while read -------------------------------------------------------------

_TRUNCATE_DURING_READ = textwrap.dedent("""
    import os, sys
    import kts_resources.kafka.files as files
    from kts_assets.cli.main import main

    path = sys.argv[1]
    real_open = open

    class Shrinking:
        # The first chunk arrives, then the broker truncates the log (a leader change).
        def __init__(self, f):
            self.f = f
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.f.close()
        def fileno(self):
            return self.f.fileno()
        def readinto(self, buffer):
            n = self.f.readinto(buffer)
            os.truncate(path, 100)
            return n

    files.open = lambda p, *a, **k: Shrinking(real_open(p, *a, **k))
    files._READ_CHUNK = 4096
    sys.exit(main(["dump", "--records", path]))
""")

_TRUNCATE_WHILE_DECODING = textwrap.dedent("""
    import os, sys
    import kts_resources.kafka.records as records
    from kts_assets.cli.main import main

    path = sys.argv[1]
    real_decode = records.decode_batch

    def decode_then_truncate(*args, **kwargs):
        # After the first batch is decoded, the broker truncates the log to nothing.
        out = real_decode(*args, **kwargs)
        os.truncate(path, 0)
        return out

    records.decode_batch = decode_then_truncate
    sys.exit(main(["dump", "--records", path]))
""")


def test_a_segment_truncated_while_dump_reads_it_is_one_line_and_no_signal(closed_segment: Path):
    result = subprocess.run([sys.executable, "-c", _TRUNCATE_DURING_READ, str(closed_segment)], capture_output=True,
                            text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 1, (result.returncode, result.stderr)
    line = one_line(result)
    assert str(closed_segment) in line and "shrank" in line


def test_a_segment_truncated_after_dump_read_it_never_raises_sigbus(closed_segment: Path):
    """A mapped segment truncated underneath raised SIGBUS on the next page touched (rc -7); the
    dump now works from the bytes it read, and the truncation is the broker's business."""
    result = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_DECODING, str(closed_segment)], capture_output=True,
                            text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.count("baseOffset:") == 40


# --- one clear line for each mistake ------------------------------------------------------------


def test_dump_of_an_index_with_an_odd_name_is_one_line(closed_segment: Path, tmp_path: Path):
    odd = tmp_path / "odd.index"
    odd.write_bytes(closed_segment.with_suffix(".index").read_bytes())
    result = kts("dump", odd)
    assert result.returncode == 2
    assert "not a .index file name" in one_line(result)


def test_index_rebuild_with_out_naming_a_file_is_one_line(closed_segment: Path, tmp_path: Path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        result = kts("index", "rebuild", closed_segment, "--out", out)
        assert result.returncode == 2
        assert "a directory is needed" in one_line(result)


def test_simulate_with_log_dir_naming_a_file_is_one_line(tmp_path: Path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = kts("simulate", "--log-dir", a_file, "--total-bytes", "1KiB")
    assert result.returncode == 2
    assert "a directory is needed" in one_line(result)
    assert a_file.read_text() == "x"


@pytest.mark.parametrize(("option", "value"), [
    ("--partitions", "99999999999"),
    ("--total-bytes", "9" * 5000),
    ("--templates-per-codec", "10000000"),
    ("--idempotent-producers", "99999999"),
    ("--high-watermark-lag-batches", "99999999999"),
])
def test_simulate_refuses_an_unbounded_count_at_once(tmp_path: Path, option: str, value: str):
    result = kts("simulate", "--log-dir", tmp_path / "logs", option, value)
    assert result.returncode == 2
    assert not (tmp_path / "logs").exists()  # at once: refused before anything is written
    assert "Traceback" not in result.stderr
    assert f"argument {option}" in result.stderr
    assert not (tmp_path / "logs").exists()


def test_index_rebuild_refuses_an_interval_no_topic_can_have(closed_segment: Path):
    result = kts("index", "rebuild", closed_segment, "--index-interval-bytes", "99999999999")
    assert result.returncode == 2
    assert "argument --index-interval-bytes" in result.stderr


def test_segments_of_a_file_says_it_is_not_a_directory(closed_segment: Path):
    result = kts("segments", closed_segment)
    assert result.returncode == 2
    assert one_line(result) == f"kts: {closed_segment}: not a directory"


def test_a_newline_in_a_directory_name_does_not_split_the_error_line(tmp_path: Path):
    weird = tmp_path / "orders\n-0"
    weird.mkdir()
    log = weird / f"{0:020d}.log"
    log.write_bytes(segment(0)[:-5])  # invalid bytes at the end: a finding naming the file
    for result in (kts("segments", weird / "missing"), kts("index", "verify", log), kts("dump", log)):
        assert result.returncode != 0
        lines = [line for line in result.stderr.splitlines() if "orders" in line]
        assert lines and all("orders\\n-0" in line for line in lines), result.stderr
        assert all(line.startswith("kts") for line in result.stderr.splitlines()), result.stderr
