"""The embedded PostgreSQL under KTS_HOME: started once, left running, and reused by every later
process (found through server.json, trusted only once the server confirms its data directory);
two processes starting together share one initdb and one server; KTS_DATABASE_URL overrides it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest

from kts_resources.metadata import database, embedded
from tests.conftest import REPO_ROOT

PRINT_SERVER = (
    "import json, sys; from pathlib import Path; from kts_resources.metadata import embedded; "
    "s = embedded.ensure_running(Path(sys.argv[1])); print(json.dumps({'port': s.port, 'pid': s.pid}))"
)


def _ensure_running_in_subprocess(home: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PRINT_SERVER, str(home)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_second_process_reuses_the_running_server(embedded_postgres):
    seen = _ensure_running_in_subprocess(embedded_postgres.home)
    assert seen == {"port": embedded_postgres.port, "pid": embedded_postgres.pid}


def test_the_server_serves_kts_database_on_loopback(embedded_postgres):
    conn = psycopg2.connect(host="127.0.0.1", port=embedded_postgres.port, user="postgres", dbname="kts",
                            password=embedded_postgres.password)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database(), inet_server_addr()::text")
            assert cur.fetchone() == ("kts", "127.0.0.1/32")
    finally:
        conn.close()
    assert embedded_postgres.url == (
        f"postgresql+psycopg2://postgres:{embedded_postgres.password}@127.0.0.1:{embedded_postgres.port}/kts")


def test_a_stale_state_file_is_not_trusted(embedded_postgres):
    state = embedded_postgres.home / "server.json"
    original = state.read_text()
    with socket_bound_elsewhere() as closed_port:
        state.write_text(json.dumps({"port": closed_port, "pid": 1}))
        try:
            found = embedded.ensure_running(embedded_postgres.home)
        finally:
            state.write_text(original)
    # The running server is found through its postmaster.pid, not started a second time.
    assert (found.port, found.pid) == (embedded_postgres.port, embedded_postgres.pid)


def test_database_url_is_kts_database_url_when_set(monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", "postgresql://kts:secret@db.example:6543/meta")
    assert database.database_url() == "postgresql+psycopg2://kts:secret@db.example:6543/meta"
    monkeypatch.setenv("KTS_DATABASE_URL", "postgres://db.example/meta")
    assert database.database_url() == "postgresql+psycopg2://db.example/meta"


def test_database_url_is_the_embedded_server_under_kts_home_when_unset(monkeypatch, embedded_postgres):
    monkeypatch.delenv("KTS_DATABASE_URL", raising=False)
    monkeypatch.setenv("KTS_HOME", str(embedded_postgres.home.parent))
    assert database.database_url() == embedded_postgres.url


def test_a_non_postgres_url_is_refused(monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", "sqlite:///kts.db")
    with pytest.raises(ValueError, match="needs PostgreSQL"):
        database.database_url()


def test_processes_starting_together_share_one_server_that_outlives_them(tmp_path):
    home = tmp_path / "kts_home" / "postgres"
    try:
        with ThreadPoolExecutor(3) as pool:
            seen = list(pool.map(lambda _: _ensure_running_in_subprocess(home), range(3)))
        assert len({(s["port"], s["pid"]) for s in seen}) == 1
        # Every starter has exited; the server is still there for the next one.
        alive = embedded.running(home)
        assert alive is not None and alive.pid == seen[0]["pid"]
        assert embedded.stop(home)
        assert embedded.running(home) is None
        assert not embedded.stop(home)
    finally:
        embedded.discard(home)


class socket_bound_elsewhere:
    """A loopback port nothing listens on (bound, never listened, for the block's duration)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


# -- locked down (issue 14.5) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_kts_home(tmp_path_factory):
    """A KTS_HOME that kts creates inside a 0700 directory it did not create, with its own
    embedded server (started by kts the way the CLI does)."""
    parent = tmp_path_factory.mktemp("private")
    parent.chmod(0o700)
    home = parent / "kts-home"
    modes_before = {p: p.stat().st_mode for p in (parent, *parent.parents)}
    server = embedded.ensure_running(home / "postgres")
    try:
        yield modes_before, home, server
    finally:
        embedded.discard(home / "postgres")


def _psql(port: int, password: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSFILE"] = "/dev/null"
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "kts", "-w",
                           "-Atc", "SELECT 1"], env=env, capture_output=True, text=True, timeout=30)


def test_psql_without_the_password_is_refused(private_kts_home):
    _modes, _home, server = private_kts_home
    refused = _psql(server.port, None)
    assert refused.returncode != 0 and "password" in refused.stderr
    assert _psql(server.port, "not-the-password").returncode != 0


def test_psql_with_the_password_files_password_works(private_kts_home):
    _modes, home, server = private_kts_home
    password_file = home / "postgres" / "password"
    assert oct(password_file.stat().st_mode & 0o777) == oct(0o600)
    result = _psql(server.port, password_file.read_text().strip())
    assert (result.returncode, result.stdout.strip()) == (0, "1"), result.stderr


def test_kts_home_is_created_0700_and_its_parent_keeps_its_mode(private_kts_home):
    modes_before, home, _server = private_kts_home
    assert oct(home.parent.stat().st_mode & 0o777) == oct(0o700)
    # The 0700 parent and every directory above it are exactly as they were before kts ran.
    assert {p: p.stat().st_mode for p in modes_before} == modes_before
    assert oct(home.stat().st_mode & 0o777) == oct(0o700)
    assert oct((home / "postgres").stat().st_mode & 0o777) == oct(0o700)


def test_the_password_never_appears_in_output_or_logs(private_kts_home):
    _modes, home, server = private_kts_home
    env = {**os.environ, "KTS_HOME": str(home), "KTS_LOG_LEVEL": "DEBUG", "KTS_LOG_DIRS": str(home / "logs")}
    env.pop("KTS_DATABASE_URL", None)
    seen = ""
    for args in (["services"], ["services", "--json"], ["status"], ["config", "get", "no-such-topic"]):
        result = subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=120)
        seen += result.stdout + result.stderr
    assert "postgres" in seen  # the commands did talk about the server
    assert server.password not in seen
    assert server.password not in (server.data_dir.parent / "postgres.log").read_text()
    assert server.password not in repr(server)


def test_a_server_an_earlier_kts_left_trusting_is_locked_down_on_the_next_start(tmp_path):
    home = tmp_path / "kts-home" / "postgres"
    try:
        server = embedded.ensure_running(home)
        # What earlier kts versions left: pg_hba.conf trusting loopback, and no password file.
        (server.data_dir / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
        conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="postgres",
                                password=server.password)
        conn.autocommit = True
        conn.cursor().execute("SELECT pg_reload_conf()")
        conn.close()
        (home / "password").unlink()
        deadline = time.monotonic() + 10
        while _psql(server.port, None).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _psql(server.port, None).returncode == 0  # trusting, as before

        again = embedded.ensure_running(home)

        assert again.pid == server.pid  # the same server, reloaded rather than restarted
        assert _psql(server.port, None).returncode != 0
        assert _psql(server.port, (home / "password").read_text().strip()).returncode == 0
        assert again.password == (home / "password").read_text().strip() != server.password
    finally:
        embedded.discard(home)


def test_a_cluster_removed_from_under_kts_is_initialised_afresh(tmp_path):
    home = tmp_path / "kts-home" / "postgres"
    try:
        first = embedded.ensure_running(home)
        embedded.stop(home)
        shutil.rmtree(first.data_dir)  # a cleaned /var/lib, a lost disk
        again = embedded.ensure_running(home)
        assert again.data_dir == first.data_dir and again.pid != first.pid
        assert _psql(again.port, None).returncode != 0
        assert _psql(again.port, (home / "password").read_text().strip()).returncode == 0
    finally:
        embedded.discard(home)


# -- a server outlives no KTS_HOME (issue 34) -----------------------------------------------------

# Hang-only: the watchdog checks every KTS_IDLE_CHECK_S (0.2 s here); this only ends a test that hangs.
GONE_WITHIN_S = 120


def _eventually(condition, what) -> None:
    """Until ``condition()``; ``what`` (or what ``what()`` says then) when it never comes."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        return str(e)


def _watchdogs_of(root: Path) -> list:
    from kts_resources.servers.services import machine_servers

    return [s for s in machine_servers(root, watchdogs=True) if s.kind == "watchdog"]


def test_a_server_whose_kts_home_is_deleted_stops_and_its_cluster_goes_with_it(tmp_path, monkeypatch):
    from kts_resources.servers.local_processes import alive

    monkeypatch.setenv("KTS_IDLE_CHECK_S", "0.2")
    kts_home = tmp_path / "kts-home"
    home = kts_home / "postgres"
    first = embedded.ensure_running(home)
    try:
        embedded.stop(home)
        server = embedded.ensure_running(home)  # restarted: the same one watchdog follows it
        assert server.pid != first.pid
        _eventually(lambda: len(_watchdogs_of(tmp_path)) == 1, "one watchdog for the restarted server")
        cluster = server.data_dir.parent

        shutil.rmtree(kts_home)

        _eventually(lambda: not alive(server.pid), "the server of a deleted KTS_HOME still runs")
        _eventually(lambda: not cluster.exists(), f"the cluster of a deleted KTS_HOME is still there: {cluster}")
        _eventually(lambda: _watchdogs_of(tmp_path) == [], "the watchdog outlived its server")
    finally:
        if alive(first.pid) or alive(embedded.postmaster_pid(home) or 0):
            embedded.discard(home)
        embedded.remove_cluster(first.data_dir.parent)


def test_a_kts_home_moved_away_stops_its_server_but_keeps_its_data_for_the_new_path(tmp_path, monkeypatch):
    from kts_resources.servers.local_processes import alive

    monkeypatch.setenv("KTS_IDLE_CHECK_S", "0.2")
    before, after = tmp_path / "before", tmp_path / "after"
    server = embedded.ensure_running(before / "postgres")
    try:
        conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="kts", password=server.password)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)")
        conn.close()

        before.rename(after)

        _eventually(lambda: not alive(server.pid), lambda: "the server of a moved KTS_HOME still runs; its watchdog "
                    f"said: {_read(after / 'postgres' / 'watch.log')!r}; watchdogs: {_watchdogs_of(tmp_path)}")
        again = embedded.ensure_running(after / "postgres")
        assert again.data_dir == embedded.data_dir(after / "postgres")
        conn = psycopg2.connect(host="127.0.0.1", port=again.port, user="postgres", dbname="kts", password=again.password)
        with conn, conn.cursor() as cur:
            cur.execute("SELECT n FROM kept")
            assert cur.fetchall() == [(7,)]
        conn.close()
        if again.data_dir.parent != after / "postgres":  # under root: the cluster now names its new KTS_HOME
            assert embedded.cluster_owner(again.data_dir.parent) == after / "postgres"
    finally:
        embedded.discard(after / "postgres")
        embedded.discard(before / "postgres")
