"""``kts services [stop]``: the embedded servers of a KTS_HOME are listed (kind, state, pid, port,
data dir) and stopped by their own state files; stopping again is a no-op that succeeds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from kts_resources.metadata import embedded
from tests.conftest import REPO_ROOT


def kts(home, *args):
    env = {**os.environ, "KTS_HOME": str(home)}
    env.pop("KTS_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def accepts_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_services_lists_the_embedded_postgres_and_stop_stops_it(tmp_path):
    home = tmp_path / "kts-home"
    server = embedded.ensure_running(home / "postgres")
    try:
        listed = kts(home, "services", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [{"kind": "postgres", "state": "running", "pid": server.pid,
                                              "port": server.port, "data_dir": str(server.data_dir)}]
        table = kts(home, "services")
        assert table.returncode == 0 and "postgres" in table.stdout and str(server.port) in table.stdout

        stopped = kts(home, "services", "stop")
        assert (stopped.returncode, stopped.stderr) == (0, "")
        assert "stopped postgres" in stopped.stdout
        assert not accepts_connections(server.port)

        again = kts(home, "services", "stop")
        assert again.returncode == 0 and "no embedded server" in again.stdout
        assert json.loads(kts(home, "services", "--json").stdout) == []
    finally:
        embedded.discard(home / "postgres")


def test_services_of_a_kts_home_with_no_server_is_an_empty_list(tmp_path):
    result = kts(tmp_path / "never-used", "services", "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    assert not (tmp_path / "never-used").exists()  # looking starts nothing and creates nothing


def test_a_killed_server_is_listed_stale_and_stop_clears_it(tmp_path):
    home = tmp_path / "kts-home"
    server = embedded.ensure_running(home / "postgres")
    try:
        os.kill(server.pid, 9)
        deadline = time.monotonic() + 10
        while embedded.postmaster_pid(home / "postgres") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = json.loads(kts(home, "services", "--json").stdout)
        assert [(s["kind"], s["state"], s["pid"]) for s in listed] == [("postgres", "stale", server.pid)]
        assert kts(home, "services", "stop").returncode == 0
        assert json.loads(kts(home, "services", "--json").stdout) == []
    finally:
        embedded.discard(home / "postgres")
