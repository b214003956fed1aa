"""``kts config get/set/delete``: a topic's tiering configs under Kafka's names, validated as Kafka
validates them, stored in the metadata store (a real PostgreSQL), with one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate


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
    # What kts does, not Kafka's default (false) beside "orders is tiered" (issue 31).
    assert out["configs"]["remote.storage.enable"] == {"value": "true", "source": "kts default"}
    text = kts(env, "config", "get", "orders").stdout
    assert any(line.split() == ["remote.storage.enable", "true", "kts", "default"] for line in text.splitlines()), text


def test_copy_disable_keeps_the_topic_tiered_but_stops_copying(env):
    assert kts(env, "config", "set", "orders", "remote.log.copy.disable=true").returncode == 0
    out = json.loads(kts(env, "config", "get", "orders", "--json").stdout)
    assert (out["tiered"], out["copy_enabled"]) == (True, False)


def test_delete_returns_a_key_to_its_default(env):
    kts(env, "config", "set", "orders", "local.retention.bytes=1000")
    result = kts(env, "config", "delete", "orders", "local.retention.bytes", "--json")
    assert json.loads(result.stdout)["configs"]["local.retention.bytes"] == {"value": "-2", "source": "default"}


@pytest.mark.parametrize("assignment, message", [
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


def test_local_retention_above_kafkas_default_retention_is_refused(env):
    """The test databases set log.retention.ms=-1; without it the topic's retention.ms is Kafka's 7 days."""
    assert kts(env, "broker-config", "delete", "log.retention.ms").returncode == 0
    result = kts(env, "config", "set", "orders", "local.retention.ms=999999999999")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "local.retention.ms" in result.stderr
    assert "604800000" in result.stderr


# --- issue 34 findings 10 and 11: repeated keys, broker-level retention, what get shows -------------


@pytest.mark.parametrize("command", [("config", "set", "orders"), ("broker-config", "set")])
def test_a_key_given_twice_in_one_set_is_refused_and_nothing_is_written(env, command):
    key = "retention.ms" if command[0] == "config" else "log.retention.ms"
    get = ("config", "get", "orders", "--json") if command[0] == "config" else ("broker-config", "get", "--json")
    before = json.loads(kts(env, *get).stdout)
    result = kts(env, *command, f"{key}=3600000", "retention.bytes=-1" if command[0] == "config" else "log.retention.bytes=-1",
                 f"{key}=7200000")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "twice" in lines[0], lines
    assert json.loads(kts(env, *get).stdout) == before


@pytest.mark.parametrize("assignments, key", [
    (("log.local.retention.ms=999999999999",), "log.local.retention.ms"),  # log.retention.ms: Kafka's 7 days
    (("log.retention.ms=3600000", "log.local.retention.ms=7200000"), "log.local.retention.ms"),
    (("log.retention.ms=3600000", "log.local.retention.ms=-1"), "log.local.retention.ms"),
    (("log.retention.bytes=1000", "log.local.retention.bytes=2000"), "log.local.retention.bytes"),
    (("log.retention.bytes=1000", "log.local.retention.bytes=-1"), "log.local.retention.bytes"),
])
def test_broker_local_retention_beyond_retention_is_refused_as_kafka_does(env, assignments, key):
    assert kts(env, "broker-config", "delete", "log.retention.ms").returncode == 0
    before = json.loads(kts(env, "broker-config", "get", "--json").stdout)
    result = kts(env, "broker-config", "set", *assignments)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"for configuration {key}:" in lines[0], lines
    assert json.loads(kts(env, "broker-config", "get", "--json").stdout) == before


@pytest.mark.parametrize("assignments", [
    ("log.retention.ms=7200000", "log.local.retention.ms=3600000"),
    ("log.retention.ms=-1", "log.local.retention.ms=-1"),
    ("log.retention.ms=3600000", "log.local.retention.ms=-2"),  # same as retention
    ("log.local.retention.bytes=5000",),  # log.retention.bytes: Kafka's -1, unlimited
])
def test_broker_local_retention_within_retention_is_accepted(env, assignments):
    result = kts(env, "broker-config", "set", *assignments)
    assert result.returncode == 0, result.stderr


def test_deleting_broker_retention_below_its_local_retention_is_refused(env):
    assert kts(env, "broker-config", "set", "log.retention.ms=-1", "log.local.retention.ms=864000000").returncode == 0
    result = kts(env, "broker-config", "delete", "log.retention.ms")  # back to 7 days: below the local 10
    assert result.returncode == 2 and "log.local.retention.ms" in result.stderr


def test_a_topic_is_validated_against_the_broker_level_retention_it_inherits(env):
    """Kafka validates a topic's configs merged over the broker's: log.retention.ms=1h is the
    retention.ms of a topic that sets none, so its local.retention.ms may not exceed it."""
    assert kts(env, "broker-config", "set", "log.retention.ms=3600000").returncode == 0
    refused = kts(env, "config", "set", "orders", "local.retention.ms=7200000")
    assert refused.returncode == 2 and "local.retention.ms" in refused.stderr and "3600000" in refused.stderr
    assert kts(env, "config", "set", "orders", "local.retention.ms=1800000").returncode == 0


def test_broker_config_get_shows_the_effective_values_and_their_source(env):
    assert kts(env, "broker-config", "delete", "log.retention.ms").returncode == 0
    rows = json.loads(kts(env, "broker-config", "get", "--json").stdout)
    assert rows["log.retention.ms"] == {"value": 604800000, "source": "default"}  # what retention applies
    assert rows["log.retention.bytes"] == {"value": -1, "source": "default"}
    assert rows["log.local.retention.ms"] == {"value": -2, "source": "default"}
    text = kts(env, "broker-config", "get").stdout
    line = next(line for line in text.splitlines() if line.startswith("log.retention.ms "))
    assert line.split()[:2] == ["log.retention.ms", "604800000"] and "Kafka's default" in line
    assert kts(env, "broker-config", "set", "log.retention.ms=3600000").returncode == 0
    rows = json.loads(kts(env, "broker-config", "get", "--json").stdout)
    assert rows["log.retention.ms"] == {"value": 3600000, "source": "override"}
