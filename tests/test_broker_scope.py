"""What kts's Dagster objects are named (kts_assets/broker_scope.py): plain names unless
KTS_DAGSTER_PER_BROKER is on, then the broker's, from meta.properties; a switch that cannot be
honoured is one line and a non-zero exit; the CLI server does not serve a client whose names
would differ from those it imported."""

from __future__ import annotations

import os

import pytest

from kts_assets.broker_scope import BrokerScope, BrokerScopeError, scope_from_environment
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .test_sync_outcome import kts

TINY = dict(seed=5, topics=("orders",), partitions=1, segment_bytes=48 * 1024, total_bytes=60 * 1024)


def test_a_brokers_scope_names_location_assets_partitions_and_pool_after_its_id_and_the_plain_scope_keeps_the_old_names():
    import dagster as dg

    plain, broker = BrokerScope(), BrokerScope(2)
    assert (plain.location_name, plain.partitions_def_name, plain.pool) == ("kts", "topic_partitions", "spark")
    assert plain.asset_key("local_segments") == dg.AssetKey("local_segments")
    assert (broker.location_name, broker.partitions_def_name, broker.pool) == ("kts-broker-2", "topic_partitions_broker_2",
                                                                               "spark_broker_2")
    assert broker.asset_key("local_segments") == dg.AssetKey(["broker_2", "local_segments"])


def test_the_code_location_name_kts_is_defined_once_and_the_repos_files_spell_it_the_same():
    """broker_scope.PLAIN_LOCATION is the name; workspace.yaml (`dagster dev`, `kts ui`) and
    pyproject's [tool.dagster] keep it as a literal, so they must agree with it."""
    import tomllib
    from pathlib import Path

    import yaml

    from kts_assets.broker_scope import PLAIN_LOCATION

    root = Path(__file__).resolve().parent.parent
    workspace = yaml.safe_load((root / "workspace.yaml").read_text())
    assert [entry["python_module"]["location_name"] for entry in workspace["load_from"]] == [PLAIN_LOCATION]
    assert tomllib.loads((root / "pyproject.toml").read_text())["tool"]["dagster"]["code_location_name"] == PLAIN_LOCATION


def test_the_plain_names_stay_for_a_log_dir_with_a_broker_id_until_the_switch_is_on(tmp_path, monkeypatch):
    simulate(tmp_path / "logs", SimulationConfig(node_id=7, **TINY))  # meta.properties: node.id=7
    monkeypatch.setenv("KTS_LOG_DIRS", str(tmp_path / "logs"))
    monkeypatch.delenv("KTS_DAGSTER_PER_BROKER", raising=False)
    assert scope_from_environment() == BrokerScope()

    monkeypatch.setenv("KTS_DAGSTER_PER_BROKER", "on")

    assert scope_from_environment() == BrokerScope(7)


def test_the_switch_on_without_a_broker_id_is_an_error_naming_the_log_dirs(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    monkeypatch.setenv("KTS_LOG_DIRS", str(tmp_path / "logs"))
    monkeypatch.setenv("KTS_DAGSTER_PER_BROKER", "on")
    with pytest.raises(BrokerScopeError, match=f"no meta.properties in {tmp_path / 'logs'} names a broker id"):
        scope_from_environment()
    (tmp_path / "logs" / "meta.properties").write_text("version=1\nnode.id=x\ncluster.id=c\n")
    with pytest.raises(BrokerScopeError, match="broker id cannot be read: .*meta.properties"):
        scope_from_environment()


@pytest.mark.parametrize("command", [("sync",), ("code-server", "--port", "1"), ("ui", "--port", "1")])
def test_a_switch_kts_cannot_honour_is_one_line_and_exit_1(tmp_path, command):
    (tmp_path / "logs").mkdir()
    env_on = {"KTS_HOME": str(tmp_path / "home"), "KTS_LOG_DIRS": str(tmp_path / "logs"), "KTS_DAGSTER_PER_BROKER": "on",
              "KTS_REMOTE_URI": (tmp_path / "remote").as_uri(), "DAGSTER_HOME": str(tmp_path)}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for value, says in (("on", "KTS_DAGSTER_PER_BROKER is on, but no meta.properties in"),
                        ("maybe", "KTS_DAGSTER_PER_BROKER='maybe': must be on or off")):
        result = kts({**os.environ, **env_on, "KTS_DAGSTER_PER_BROKER": value}, *command, timeout=300)
        assert result.returncode == 1, result.stderr[-2000:]
        [line] = result.stderr.splitlines()
        assert line.startswith(f"kts: {says}"), line


def test_the_cli_server_tells_clients_whose_dagster_names_would_differ(tmp_path, monkeypatch):
    from kts_assets.cli.server import code_fingerprint

    monkeypatch.delenv("KTS_DAGSTER_PER_BROKER", raising=False)
    monkeypatch.setenv("KTS_LOG_DIRS", str(tmp_path / "a"))
    plain_a = code_fingerprint()
    monkeypatch.setenv("KTS_LOG_DIRS", str(tmp_path / "b"))
    assert code_fingerprint() == plain_a  # plain names do not depend on the log dirs
    monkeypatch.setenv("KTS_DAGSTER_PER_BROKER", "on")
    broker_b = code_fingerprint()
    monkeypatch.setenv("KTS_LOG_DIRS", str(tmp_path / "a"))

    assert broker_b != plain_a and code_fingerprint() not in (plain_a, broker_b)
