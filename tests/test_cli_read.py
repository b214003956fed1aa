"""``kts fetch``, ``kts offsets`` and ``kts broker-config`` as ARCHITECTURE.md's contract says:
JSON field names, records from both tiers, ListOffsets specs, and one clear stderr line with a
non-zero exit for bad input."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import read_records
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_storage.factory import remote_storage_from_uri
from .partition_steps import copy_each_partition


@pytest.fixture
def env(pg_url, tmp_path, metadata_store):
    """orders-0 copied to a file tier, its first segment then removed locally."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=3, topics=("orders",), partitions=1, total_bytes=160 * 1024,
                                       segment_bytes=32 * 1024, transactional_producers=0))
    remote = tmp_path / "remote"
    copy_each_partition(LogDir(log_dir), metadata_store, remote_storage_from_uri(remote.as_uri()))
    first = sorted((log_dir / "orders-0").glob("*.log"))[0]
    records = [r for _h, rs in read_records(first.read_bytes()) for r in rs]
    for f in (log_dir / "orders-0").glob(first.stem + ".*"):
        f.unlink()
    return {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
            "KTS_REMOTE_URI": remote.as_uri()}, records


def kts(env, *args):
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def test_fetch_json_returns_remote_records_with_the_contract_fields(env):
    env, produced = env
    result = kts(env, "fetch", "orders", "0", "--offset", "0", "--max-bytes", "4096", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"records", "next_offset", "throttled"} and out["throttled"] is False
    assert out["records"] and set(out["records"][0]) == {"offset", "timestamp", "key", "value", "headers"}
    for got, want in zip(out["records"], produced):
        assert (got["offset"], got["timestamp"]) == (want.offset, want.timestamp)
        assert got["value"] == (None if want.value is None else base64.b64encode(want.value).decode())
        assert got["headers"] == [[k, None if v is None else base64.b64encode(v).decode()] for k, v in want.headers]
    assert out["next_offset"] == out["records"][-1]["offset"] + 1


def test_fetch_as_text_says_where_the_batches_came_from(env):
    env, _ = env
    result = kts(env, "fetch", "orders", "0", "--offset", "3", "--max-bytes", "2048")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("offset: 3 ")
    assert "from the remote tier" in result.stdout.splitlines()[-1]


@pytest.mark.parametrize("flag, offset", [("--earliest", 0), ("--earliest-local", None), ("--latest", None)])
def test_offsets_json_answers_with_offset_and_leader_epoch(env, flag, offset):
    env, _ = env
    result = kts(env, "offsets", "orders", "0", flag, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"offset", "leader_epoch"}
    if offset is not None:
        assert out["offset"] == offset
    assert out["offset"] >= 0 and out["leader_epoch"] >= 0


def test_offsets_by_timestamp_after_every_record_is_minus_one(env):
    env, _ = env
    out = json.loads(kts(env, "offsets", "orders", "0", "--timestamp", str(2**62), "--json").stdout)
    assert out == {"offset": -1, "leader_epoch": -1}


@pytest.mark.parametrize("args, message", [
    (("fetch", "orders", "0", "--offset", "99999999"), "offset 99999999 is out of range"),
    (("fetch", "nosuch", "0", "--offset", "0"), "nosuch-0: the partition is in no log dir"),
    (("fetch", "bad/topic", "0", "--offset", "0"), "topic 'bad/topic'"),
    (("fetch", "orders", "0", "--offset", "-1"), "--offset"),
    (("fetch", "orders", "0", "--offset", "0", "--isolation", "dirty"), "--isolation"),
    (("offsets", "orders", "0"), "one of the arguments"),
    (("broker-config", "set", "remote.log.manager.fetch.max.bytes.per.second=-5"), "at least 1"),
    (("broker-config", "set", "no.such=1"), "expected KEY=VALUE"),
])
def test_bad_input_is_one_stderr_line_and_a_non_zero_exit(env, args, message):
    env, _ = env
    result = kts(env, *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_a_fetch_quota_set_in_the_store_throttles_remote_reads_of_every_process(env):
    env, _ = env
    # Hour-long quota windows: the second fetch still sees the first one's bytes however slowly a
    # busy machine starts the two processes (11 one-second windows forgot them under load).
    assert kts(env, "broker-config", "set", "remote.log.manager.fetch.max.bytes.per.second=1",
               "remote.log.manager.fetch.quota.window.size.seconds=3600").returncode == 0
    out = json.loads(kts(env, "broker-config", "get", "--json").stdout)
    assert out["remote.log.manager.fetch.max.bytes.per.second"] == {"value": 1, "source": "override"}
    first = json.loads(kts(env, "fetch", "orders", "0", "--offset", "0", "--json").stdout)
    assert first["records"] and not first["throttled"]
    second = json.loads(kts(env, "fetch", "orders", "0", "--offset", "0", "--json").stdout)
    assert second == {"records": [], "next_offset": 0, "throttled": True}
