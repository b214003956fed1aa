"""The ``kts`` inspection commands as a user runs them: ``segments``, ``dump``, ``index rebuild``
and ``index verify`` — their JSON field names (ARCHITECTURE.md's contract), their exit codes, and
one clear stderr line (file and byte position, no traceback) for every kind of bad input."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kts_resources.kafka.codecs import GZIP, LZ4, NONE, SNAPPY, ZSTD
from kts_resources.kafka.indexes import rebuild_segment_indexes
from kts_resources.kafka.records import NewRecord, build_batch, build_control_batch

T0 = 1_760_000_000_000
BATCH_FIELDS = {"position", "size", "base_offset", "last_offset", "leader_epoch", "codec", "crc_ok",
                "is_control", "is_transactional", "max_timestamp", "record_count"}
SEGMENT_FIELDS = {"base_offset", "last_offset", "next_offset", "size_bytes", "batch_count", "record_count",
                  "max_timestamp", "leader_epochs", "active"}
RECORD_FIELDS = {"offset", "timestamp", "key", "value", "headers"}


def kts(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *map(str, args)], capture_output=True, text=True, timeout=120)


def _segment_bytes(base_offset: int, epoch: int, batches: int = 12) -> bytes:
    parts = []
    offset = base_offset
    codecs = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
    for i in range(batches):
        records = [NewRecord(T0 + offset + j, f"key-{offset + j}".encode(), b"value " * 40, (("trace", b"t"),)) for j in range(3)]
        parts.append(build_batch(records, base_offset=offset, codec=codecs[i % 5], partition_leader_epoch=epoch))
        offset += 3
    parts.append(build_control_batch(base_offset=offset, commit=False, producer_id=7, producer_epoch=0,
                                     coordinator_epoch=2, timestamp=T0 + offset, partition_leader_epoch=epoch))
    return b"".join(parts)


@pytest.fixture
def partition_dir(tmp_path: Path) -> Path:
    """orders-0 with a closed segment at 0 (epoch 0) and an active one at 37 (epoch 1), indexed."""
    d = tmp_path / "orders-0"
    d.mkdir()
    (d / "00000000000000000000.log").write_bytes(_segment_bytes(0, 0))
    (d / "00000000000000000037.log").write_bytes(_segment_bytes(37, 1, batches=4))
    for log in sorted(d.glob("*.log")):
        rebuild_segment_indexes(log, index_interval_bytes=256)
    return d


def test_segments_json_has_the_contract_fields_and_marks_the_last_segment_active(partition_dir):
    result = kts("segments", partition_dir, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["base_offset"] for r in rows] == [0, 37]
    assert all(SEGMENT_FIELDS <= r.keys() for r in rows)
    first, active = rows
    assert (first["last_offset"], first["next_offset"], first["batch_count"], first["record_count"]) == (36, 37, 13, 37)
    assert first["leader_epochs"] == [0] and active["leader_epochs"] == [1]
    assert (first["active"], active["active"]) == (False, True)
    assert first["size_bytes"] == (partition_dir / "00000000000000000000.log").stat().st_size
    assert first["max_timestamp"] == T0 + 36


def test_segments_table_reports_health(partition_dir):
    result = kts("segments", partition_dir)
    assert result.returncode == 0
    assert "base_offset" in result.stdout.splitlines()[0]
    assert result.stdout.count(" ok") == 2


def test_segments_reports_a_crc_failure_with_file_and_position_and_exits_1(partition_dir):
    log = partition_dir / "00000000000000000000.log"
    data = bytearray(log.read_bytes())
    data[200] ^= 0x01  # inside the first batch's records, which the CRC covers
    log.write_bytes(bytes(data))
    result = kts("segments", partition_dir, "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)[0]["health"] == "corrupt"
    assert result.stderr.strip() == f"kts: {log}: byte 0: batch fails its CRC"
    assert "Traceback" not in result.stderr


def test_dump_json_batches_and_records_use_the_contract_field_names(partition_dir):
    result = kts("dump", partition_dir / "00000000000000000000.log", "--records", "--json")
    assert result.returncode == 0, result.stderr
    dump = json.loads(result.stdout)
    batches = dump["batches"]
    assert len(batches) == 13 and all(BATCH_FIELDS <= b.keys() for b in batches)
    assert [b["codec"] for b in batches[:5]] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert all(b["crc_ok"] for b in batches)
    first_record = batches[0]["records"][0]
    assert RECORD_FIELDS <= first_record.keys()
    assert first_record["offset"] == 0 and first_record["timestamp"] == T0
    assert base64.b64decode(first_record["key"]) == b"key-0"
    assert first_record["headers"] == [["trace", base64.b64encode(b"t").decode()]]
    marker = batches[-1]
    assert marker["is_control"] and marker["is_transactional"]
    assert marker["records"][0]["control"] == {"type": "ABORT", "coordinator_epoch": 2}


def test_dump_text_reads_like_dump_log_segments(partition_dir):
    result = kts("dump", partition_dir / "00000000000000000000.log", "--records")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[1].startswith("baseOffset: 0 lastOffset: 2 count: 3")
    assert "compresscodec: none" in lines[1] and "isvalid: true" in lines[1]
    assert lines[2].startswith("| offset: 0 CreateTime: ")
    assert any("endTxnMarker: ABORT coordinatorEpoch: 2" in line for line in lines)


def test_dump_of_a_truncated_segment_reports_the_invalid_bytes_position(partition_dir):
    log = partition_dir / "00000000000000000000.log"
    data = log.read_bytes()
    log.write_bytes(data[:-10])
    result = kts("dump", log, "--json")
    assert result.returncode == 1
    dump = json.loads(result.stdout)
    position = dump["invalid_bytes"]["position"]
    assert len(dump["batches"]) == 12 and position == dump["valid_bytes"]
    assert result.stderr.startswith(f"kts: {log}: byte {position}: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_index_verify_passes_on_rebuilt_indexes_and_fails_on_a_damaged_one(partition_dir):
    log = partition_dir / "00000000000000000000.log"
    ok = kts("index", "verify", log)
    assert ok.returncode == 0, ok.stderr
    index = partition_dir / "00000000000000000000.index"
    data = bytearray(index.read_bytes())
    assert len(data) >= 16
    data[12:16] = (int.from_bytes(data[12:16], "big") + 1).to_bytes(4, "big")  # second entry points mid-batch
    index.write_bytes(bytes(data))
    bad = kts("index", "verify", log)
    assert bad.returncode == 1
    assert str(index) in bad.stderr and "byte 8" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_index_rebuild_restores_deleted_indexes_byte_for_byte(partition_dir, tmp_path):
    log = partition_dir / "00000000000000000000.log"
    original = {p.suffix: p.read_bytes() for p in partition_dir.glob("00000000000000000000.*index")}
    for suffix in original:
        (partition_dir / f"00000000000000000000{suffix}").unlink()
    result = kts("index", "rebuild", log, "--index-interval-bytes", "256")
    assert result.returncode == 0, result.stderr
    assert {p.suffix: p.read_bytes() for p in partition_dir.glob("00000000000000000000.*index")} == original
    out = tmp_path / "rebuilt"
    assert kts("index", "rebuild", log, "--out", out, "--index-interval-bytes", "256").returncode == 0
    assert (out / "00000000000000000000.index").read_bytes() == original[".index"]


def test_index_rebuild_refuses_a_corrupt_segment_and_writes_nothing(partition_dir, tmp_path):
    log = partition_dir / "00000000000000000000.log"
    data = bytearray(log.read_bytes())
    data[200] ^= 0x80
    log.write_bytes(bytes(data))
    out = tmp_path / "rebuilt"
    result = kts("index", "rebuild", log, "--out", out)
    assert result.returncode == 1
    assert result.stderr.startswith(f"kts: {log}: byte 0: ")
    assert not out.exists()


@pytest.mark.parametrize(
    "command, what", [(["segments"], "directory"), (["dump"], "file"), (["index", "verify"], "file"), (["index", "rebuild"], "file")]
)
def test_a_missing_path_is_one_line_and_exit_2(command, what, tmp_path):
    missing = tmp_path / "nope" / "00000000000000000000.log"
    result = kts(*command, missing)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"kts: {missing}: no such {what}"]


def test_a_segment_that_is_all_garbage_is_reported_not_raised(tmp_path):
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(b"\x00" * 100)
    result = kts("dump", log)
    assert result.returncode == 1
    assert result.stderr.startswith(f"kts: {log}: byte 0: 100 invalid bytes at the end")


@pytest.mark.parametrize("command", [["index", "verify"], ["index", "rebuild"]])
def test_index_commands_refuse_a_file_that_is_not_a_segment(command, partition_dir):
    not_a_segment = partition_dir / "00000000000000000000.index"
    result = kts(*command, not_a_segment)
    assert result.returncode == 2
    assert result.stderr.strip() == f"kts: {not_a_segment}: not a segment file (expected <20-digit base offset>.log)"


def test_segments_refuses_a_directory_that_is_not_a_partition(tmp_path):
    result = kts("segments", tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"kts: {tmp_path}: not a partition directory")
    assert len(result.stderr.strip().splitlines()) == 1


def test_segments_notes_files_it_skipped_without_failing(partition_dir):
    (partition_dir / "00000000000000000000.log.deleted").write_bytes(b"being deleted")
    (partition_dir / "garbage.log").write_bytes(b"?")
    result = kts("segments", partition_dir, "--json")
    assert result.returncode == 0
    assert [r["base_offset"] for r in json.loads(result.stdout)] == [0, 37]
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 2 and all(n.startswith("kts: note: ") and "skipped" in n for n in notes)


# --- accepted misuse (issue 34 finding 11) ----------------------------------------------------------


def _no_server_env(tmp_path: Path) -> dict:
    """An environment in which a command that got past its argument checks fails on an unreachable
    database (exit 1) instead of starting anything."""
    import os

    return {**os.environ, "KTS_DATABASE_URL": "postgresql://kts@127.0.0.1:1/kts", "KTS_HOME": str(tmp_path / "home"),
            "KTS_LOG_DIRS": str(tmp_path / "logs"), "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}


@pytest.mark.parametrize("to", ["", "   "])
def test_restore_to_an_empty_path_is_refused_not_the_current_directory(to, tmp_path):
    work = tmp_path / "cwd"
    work.mkdir()
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "restore", "orders", "0", "--to", to],
                            env=_no_server_env(tmp_path), cwd=work, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "--to" in result.stderr
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("port", ["-1", "0", "65536", "http"])
def test_ui_refuses_a_port_that_is_not_one(port, capsys):
    """Parsed only (never started): argparse's usage error, exit 2, naming --port."""
    from kts_assets.cli.main import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["ui", "--port", port])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err.strip().splitlines()[-1]


def test_status_with_a_corrupt_checkpoint_in_one_of_two_log_dirs_shows_the_other(tmp_path, pg_url):
    """The healthy log dir's partitions are printed; the corrupt file is one line with its position; exit 1."""
    import os

    from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

    simulate(tmp_path / "a", SimulationConfig(seed=1, topics=("orders",), partitions=1, total_bytes=16 * 1024))
    simulate(tmp_path / "b", SimulationConfig(seed=2, topics=("payments",), partitions=1, total_bytes=16 * 1024))
    corrupt = tmp_path / "b" / "replication-offset-checkpoint"
    corrupt.write_text("0\n1\npayments 0 not-a-number\n")
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_HOME": str(tmp_path / "home"),
           "KTS_LOG_DIRS": f"{tmp_path / 'a'},{tmp_path / 'b'}", "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "status", "--json"], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert [(r["topic"], r["partition"]) for r in json.loads(result.stdout)] == [("orders", 0)]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(corrupt) in lines[0] and "line 3" in lines[0], lines
    assert "Traceback" not in result.stderr
