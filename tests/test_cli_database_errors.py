"""A metadata store kts cannot use — KTS_DATABASE_URL that is garbage, another dialect, a closed
port, a bad libpq string; a database at a revision kts does not know or with a ``topics`` table
kts did not make — is one line on stderr and a non-zero exit from the CLI, promptly, with no
traceback and never the password. A libpq key/value string naming a good server is accepted."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from tests.conftest import REPO_ROOT
from tests.fixtures_s3 import free_loopback_port

# Promptly: against the same command failing before any connection (a URL that is not one), run
# just before on the same machine; what it rules out is a 30 s connect hang or a Spark start.
PROMPTLY_RATIO = 4


@pytest.fixture(scope="module")
def log_dirs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    simulate(log_dir, SimulationConfig(seed=1, topics=("orders",), partitions=1, total_bytes=32 * 1024))
    return str(log_dir)


def kts_config_get(log_dirs, tmp_path, database_url: str, *args: str):
    """The command's result, and how long it took as a multiple of the baseline above."""
    def timed(url: str):
        env = {**os.environ, "KTS_DATABASE_URL": url, "KTS_LOG_DIRS": log_dirs, "KTS_HOME": str(tmp_path / "home")}
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "config", *(args or ("get", "orders"))], env=env,
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        return result, time.monotonic() - started

    _refused, baseline = timed("not a url at all")
    result, took = timed(database_url)
    return result, took / baseline


def assert_one_line_error(result, took: float, *words: str, secret: str | None = None) -> None:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kts: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]
    if secret:
        assert secret not in result.stderr + result.stdout
    assert took < PROMPTLY_RATIO


@pytest.mark.parametrize("url, words", [
    ("not a url at all", ["KTS_DATABASE_URL is not a database URL"]),
    ("postgresql://kts:s3cret-pw@127.0.0.1:notaport/kts", ["KTS_DATABASE_URL is not a database URL"]),
    ("mysql://kts:s3cret-pw@127.0.0.1/kts", ["needs PostgreSQL, not 'mysql'"]),
    ("sqlite:///kts.db", ["needs PostgreSQL, not 'sqlite'"]),
    ("host=127.0.0.1 port= = dbname", ["not a libpq connection string"]),
    ("host=127.0.0.1 port=99999 dbname=kts password=s3cret-pw", ["port '99999' is not a TCP port"]),
])
def test_an_unusable_database_url_is_one_line(log_dirs, tmp_path, url, words):
    result, took = kts_config_get(log_dirs, tmp_path, url)
    assert_one_line_error(result, took, *words, secret="s3cret-pw")


def test_a_closed_port_is_one_line_naming_the_server(log_dirs, tmp_path):
    port = free_loopback_port()
    result, took = kts_config_get(log_dirs, tmp_path, f"postgresql://kts:s3cret-pw@127.0.0.1:{port}/kts")
    assert_one_line_error(result, took, f"127.0.0.1:{port}/kts", "unreachable", secret="s3cret-pw")


def test_a_libpq_connection_string_is_accepted(log_dirs, tmp_path, pg_url):
    url = make_url(pg_url)
    dsn = f"host={url.host} port={url.port} dbname={url.database} user={url.username} password={url.password}"
    result, _ = kts_config_get(log_dirs, tmp_path, dsn)
    assert result.returncode == 0, result.stderr
    assert "retention.ms" in result.stdout


def test_a_database_at_an_unknown_revision_is_one_line(log_dirs, tmp_path, pg_url):
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE kts_alembic_version SET version_num = 'f00dfeedbeef'")
    engine.dispose()
    result, took = kts_config_get(log_dirs, tmp_path, pg_url)
    assert_one_line_error(result, took, "schema revision 'f00dfeedbeef'", "does not know",
                          secret=make_url(pg_url).password)


def test_a_conflicting_topics_table_is_one_line(log_dirs, tmp_path, pg_unmigrated_url):
    engine = sa.create_engine(pg_unmigrated_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE topics (name text)")  # another application's table
    engine.dispose()
    result, took = kts_config_get(log_dirs, tmp_path, pg_unmigrated_url)
    assert_one_line_error(result, took, "cannot bring its schema", '"topics" already exists',
                          secret=make_url(pg_unmigrated_url).password)
    engine = sa.create_engine(pg_unmigrated_url)
    with engine.connect() as conn:  # the failed upgrade left nothing half-made
        assert sa.inspect(conn).get_table_names() == ["topics"]
    engine.dispose()


def test_a_5000_digit_config_value_is_one_short_line(log_dirs, tmp_path, pg_url):
    result, took = kts_config_get(log_dirs, tmp_path, pg_url, "set", "orders", "retention.ms=" + "9" * 5000)
    assert_one_line_error(result, took, "retention.ms", "Not a number of type LONG", "(5000 characters)")
    assert len(result.stderr) < 300


def test_config_get_without_a_topic_names_only_topic_as_required(log_dirs, tmp_path):
    result, _ = kts_config_get(log_dirs, tmp_path, "postgresql://unused/kts", "get")
    assert result.returncode == 2
    assert "required: TOPIC" in result.stderr and "KEY" not in result.stderr.splitlines()[-1]
