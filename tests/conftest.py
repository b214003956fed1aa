"""Fixtures shared by the test modules: where the project's shared files (../shared) live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Real servers the tests share: PostgreSQL (pg_url, metadata_store, pg_admin_url, …) and an S3 HTTP
# endpoint (s3_endpoint, s3_bucket, remote_storage, …), and a Spark Connect server (spark_connect_url).
pytest_plugins = ["tests.fixtures_postgres", "tests.fixtures_s3", "tests.fixtures_spark"]

REPO_ROOT = Path(__file__).resolve().parent.parent

# Commands run in their own process, as each test's subprocess always did: a standing CLI server
# per test's KTS_HOME would outlive the test. tests/test_cli_server.py turns it on where it tests it,
# and tests/test_sync_independent.py runs on kts's defaults (so in the server), stopping it after.
os.environ["KTS_CLI_SERVER"] = "off"


def shared_dir() -> Path:
    """``$KTS_SHARED_DIR`` if set, else ``shared/`` beside the repository (how CI clones them)."""
    configured = os.environ.get("KTS_SHARED_DIR")
    return Path(configured).resolve() if configured else REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def third_party_dir() -> Path:
    """The Kafka-format segment files other implementations wrote (fixtures/third_party)."""
    path = shared_dir() / "fixtures" / "third_party"
    if not path.is_dir():
        # Failing, not skipping: these files are part of what kts must read.
        pytest.fail(f"third-party fixtures not found at {path}; set KTS_SHARED_DIR to the shared/ directory")
    return path


# Test files that take minutes (Dagster runs in subprocesses, JVMs, daemons, SIGKILLs), longest
# first, from CI's --durations. They are collected first so that `make test`'s workers (pytest-xdist,
# --dist loadfile --no-loadscope-reorder) start them first and the run ends on short files; xdist's
# default order (files with the most tests first) left these to the end, one worker busy for minutes
# on them while the other idled.
LONG_FILES = (
    "test_sync_independent.py", "test_run_hygiene.py", "test_cli_server.py", "test_recover.py", "test_cli_sync.py", "test_lost_ranges.py",
    "test_bench_daemon_run_smoke.py", "test_recover_sync.py", "test_sync_outcome.py", "test_spark_connect.py",
    "test_bench_sync_smoke.py", "test_webserver.py", "test_spark_inventory.py", "test_assets.py", "test_scrub.py",
    "test_restore.py", "test_hostile_partitions.py", "test_pipeline_end_to_end.py", "test_retention_asset.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def materializations(result, asset: str) -> list:
    """The run's materialisations of ``asset`` (``asset_materializations_for_node`` goes by step,
    and one step, local_and_remote_segments, materialises two assets)."""
    import dagster as dg

    key = dg.AssetKey(asset)
    return [e.step_materialization_data.materialization for e in result.all_node_events
            if e.is_step_materialization and e.asset_key == key]
