"""Fixtures shared by the test modules: where the project's shared files (../shared) live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Real servers the tests share: PostgreSQL (pg_url, metadata_store, pg_admin_url, …) and an S3 HTTP
# endpoint (s3_endpoint, s3_bucket, remote_storage, …), and a Spark Connect server (spark_connect_url).
pytest_plugins = ["tests.fixtures_postgres", "tests.fixtures_s3", "tests.fixtures_spark"]

REPO_ROOT = Path(__file__).resolve().parent.parent


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
