"""``kts services [stop]``: the embedded servers of a KTS_HOME are listed (kind, state, pid, port,
data dir) and stopped by their own state files; stopping again is a no-op that succeeds."""

from __future__ import annotations

import json
import shutil
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


# -- every server of the account, orphans included (issue 34) -------------------------------------


def test_services_all_lists_and_stops_every_server_of_the_account_orphans_included(tmp_path):
    from kts_resources.servers.local_processes import alive

    kept_home, gone_home = tmp_path / "kept", tmp_path / "gone"
    kept = embedded.ensure_running(kept_home / "postgres")
    orphan = embedded.ensure_running(gone_home / "postgres")
    try:
        # An orphan as a server started before watchdogs existed (or whose watchdog was killed) is one.
        from kts_resources.servers.services import machine_servers

        for watchdog in machine_servers(gone_home, watchdogs=True):
            if watchdog.kind == "watchdog":
                os.kill(watchdog.pid, 9)
        shutil.rmtree(gone_home)
        elsewhere = tmp_path / "elsewhere"  # --all does not depend on the KTS_HOME it is run with

        listed = kts(elsewhere, "services", "--all", "--under", str(tmp_path), "--json")
        assert listed.returncode == 0, listed.stderr
        assert sorted((s["kind"], s["state"], s["pid"], s["port"], s["kts_home"], s["orphan"]) for s in json.loads(listed.stdout)) == sorted([
            ("postgres", "running", kept.pid, kept.port, str(kept_home), False),
            ("postgres", "running", orphan.pid, orphan.port, str(gone_home), True),
        ])
        table = kts(elsewhere, "services", "--all", "--under", str(tmp_path))
        assert table.returncode == 0 and str(gone_home) in table.stdout and "True" in table.stdout

        stopped = kts(elsewhere, "services", "stop", "--all", "--under", str(tmp_path))
        assert (stopped.returncode, stopped.stderr) == (0, "")
        assert f"stopped postgres (pid {orphan.pid}) of {gone_home} (orphan)" in stopped.stdout
        assert f"stopped postgres (pid {kept.pid}) of {kept_home}" in stopped.stdout
        assert not alive(kept.pid) and not alive(orphan.pid)
        assert kept.data_dir.exists()  # a KTS_HOME that is there keeps its data
        assert not orphan.data_dir.exists()  # an orphan's cluster goes with it

        after = json.loads(kts(elsewhere, "services", "--all", "--under", str(tmp_path), "--json").stdout)
        # Under root kept's cluster lives in /var/lib/kts/postgres and is listed, stopped, not orphaned.
        assert [(s["state"], s["kts_home"], s["orphan"]) for s in after] in ([], [("stopped", str(kept_home), False)])
        assert not (elsewhere).exists()
    finally:
        embedded.discard(kept_home / "postgres")
        embedded.remove_cluster(orphan.data_dir.parent)


def test_under_without_all_is_a_usage_error(tmp_path):
    result = kts(tmp_path, "services", "--under", str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == ["kts: services: --under needs --all"]
