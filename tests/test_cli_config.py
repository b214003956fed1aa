"""``kts config get/set/delete``: a topic's tiering configs under Kafka's names, validated as Kafka
validates them, stored in the metadata store (a real PostgreSQL), with one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kts_resources.kafka.simulate import SimulationConfig, simulate


@pytest.fixture
def env(pg_url, tmp_path):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=1, topics=("orders",), partitions=1, total_bytes=32 * 1024))
    return {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home")}


def kts(env, *args):
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def test_set_then_get_shows_overrides_and_kafka_defaults(env):
    assert kts(env, "config", "set", "orders", "local.retention.ms=3600000", "retention.ms=86400000").returncode == 0
    result = kts(env, "config", "get", "orders", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["configs"]["local.retention.ms"] == {"value": "3600000", "source": "override"}
    assert out["configs"]["retention.bytes"] == {"value": "-1", "source": "default"}
    assert out["configs"]["cleanup.policy"]["value"] == "delete"
    assert out["tiered"] is True and out["copy_enabled"] is True


def test_copy_disable_keeps_the_topic_tiered_but_stops_copying(env):
    assert kts(env, "config", "set", "orders", "remote.log.copy.disable=true").returncode == 0
    out = json.loads(kts(env, "config", "get", "orders", "--json").stdout)
    assert (out["tiered"], out["copy_enabled"]) == (True, False)


def test_delete_returns_a_key_to_its_default(env):
    kts(env, "config", "set", "orders", "local.retention.bytes=1000")
    result = kts(env, "config", "delete", "orders", "local.retention.bytes", "--json")
    assert json.loads(result.stdout)["configs"]["local.retention.bytes"] == {"value": "-2", "source": "default"}


@pytest.mark.parametrize("assignment, message", [
    ("local.retention.ms=999999999999", "local.retention.ms"),  # more than retention.ms (7 days)
    ("no.such.key=1", "no.such.key"),
    ("retention.ms=soon", "retention.ms"),
    ("cleanup.policy=compact", "cleanup.policy"),  # tiering on a compacted topic is refused
])
def test_invalid_configs_are_refused_in_one_line(env, assignment, message):
    result = kts(env, "config", "set", "orders", assignment)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kts: orders: ") and message in lines[0]


def test_an_unknown_topic_is_one_line(env):
    result = kts(env, "config", "get", "nosuch")
    assert result.returncode == 1 and result.stderr.startswith("kts: topic 'nosuch' is neither")


def test_an_unreachable_database_is_one_clear_line(env):
    result = kts({**env, "KTS_DATABASE_URL": "postgresql://kts@127.0.0.1:1/kts"}, "config", "get", "orders")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "unreachable" in result.stderr and "Traceback" not in result.stderr
