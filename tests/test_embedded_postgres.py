"""The embedded PostgreSQL under KTS_HOME: started once, left running, and reused by every later
process (found through server.json, trusted only once the server confirms its data directory);
two processes starting together share one initdb and one server; KTS_DATABASE_URL overrides it."""

from __future__ import annotations

import json
import subprocess
import sys
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
    conn = psycopg2.connect(host="127.0.0.1", port=embedded_postgres.port, user="postgres", dbname="kts")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database(), inet_server_addr()::text")
            assert cur.fetchone() == ("kts", "127.0.0.1/32")
    finally:
        conn.close()
    assert embedded_postgres.url == f"postgresql+psycopg2://postgres@127.0.0.1:{embedded_postgres.port}/kts"


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
    finally:
        assert embedded.stop(home)
    assert embedded.running(home) is None
    assert not embedded.stop(home)


class socket_bound_elsewhere:
    """A loopback port nothing listens on (bound, never listened, for the block's duration)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
