"""The standing CLI server (kts_assets/cli/server.py): `kts sync` runs in a child of a process that
has kts, Dagster and PySpark imported already, and is the same command it is in a process of its
own — same output on the same streams, same exit status, the client's environment and working
directory, one server for every later sync, a signal to the client reaching the command, a dead
client or server stopping it, and `kts services stop` leaving no process behind.

The rest of the suite runs commands in their own process (conftest sets KTS_CLI_SERVER=off)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from kts_assets.cli import server as cli_server
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

from .conftest import REPO_ROOT
from .test_run_hygiene import _processes_mentioning
from .test_sync_outcome import kts, sync_env
from .test_webserver import _stop, _tail

pytestmark = pytest.mark.spark

CONFIG = dict(seed=5, topics=("orders",), partitions=2, segment_bytes=48 * 1024)


def served_env(tmp_path: Path, log_dir: Path, pg_url: str, **overrides: str) -> dict[str, str]:
    return sync_env(tmp_path, log_dir, pg_url, KTS_CLI_SERVER="on", **overrides)


def server_of(env: dict[str, str]) -> cli_server.CliServer | None:
    return cli_server.running(cli_server.state_dir(Path(env["KTS_HOME"])))


def start_sync(env: dict[str, str], out: Path) -> subprocess.Popen:
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_run_start(sync: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 180
    while "copy_job over" not in out.read_text() and time.monotonic() < deadline:
        assert sync.poll() is None, _tail(out)
        time.sleep(0.2)
    time.sleep(2)  # into the run's steps


def test_sync_in_the_cli_server_is_the_same_command_and_later_syncs_reuse_the_server(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(total_bytes=300 * 1024, **CONFIG))
    env = served_env(tmp_path, log_dir, pg_url)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()

    first = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=workdir,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith("synced 2 partitions (2 new): copied ") and "copied 0 segments" not in first.stdout
    assert "sync: copy_job over orders-0 .. orders-1 (2 partitions)" in first.stderr  # the client's own stderr
    assert "in this process" not in first.stderr  # served, not run here after a failed start
    server = server_of(env)
    assert server is not None and server.pid != os.getpid()

    # A second sync (more rolled segments) and a failing one with another environment: the same
    # server runs both, each with its client's environment and the exit status it has on its own.
    simulate(log_dir, SimulationConfig(total_bytes=200 * 1024, **CONFIG))
    second = kts(env, "sync")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.startswith("synced 2 partitions (0 new): copied ") and "copied 0 segments" not in second.stdout
    missing = {**env, "KTS_LOG_DIRS": str(tmp_path / "no-such-dir")}
    served, alone = kts(missing, "sync"), kts({**missing, "KTS_CLI_SERVER": "off"}, "sync")
    assert served.returncode == alone.returncode == 1
    assert (served.stdout, served.stderr) == (alone.stdout, alone.stderr) and "no-such-dir" in served.stderr
    assert server_of(env) == server
    assert (Path(env["KTS_HOME"]) / "cli-server" / "server.log").read_text().count(" serving ") == 1

    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert [r.status for r in instance.get_runs()] == [dg.DagsterRunStatus.SUCCESS] * 2

    listed = kts(env, "services", "--json")
    assert {"kind": "cli-server", "state": "running", "pid": server.pid} in [
        {k: s[k] for k in ("kind", "state", "pid")} for s in json.loads(listed.stdout)]
    stopped = kts(env, "services", "stop")
    assert stopped.returncode == 0 and "cli-server" in stopped.stdout
    assert server_of(env) is None and _processes_mentioning(str(cli_server.state_dir(Path(env["KTS_HOME"])))) == []


def test_a_signal_to_the_client_reaches_the_sync_and_a_dead_client_or_server_stops_it(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(total_bytes=300 * 1024, **CONFIG))
    env = served_env(tmp_path, log_dir, pg_url)
    try:
        # SIGTERM to the client: the sync cancels its run and says so, as in a process of its own.
        out = tmp_path / "sync.log"
        sync = start_sync(env, out)
        wait_for_run_start(sync, out)
        sync.send_signal(signal.SIGTERM)
        try:
            sync.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _stop(sync)
            pytest.fail(f"kts sync still running 15 s after SIGTERM\n{_tail(out)}")
        assert sync.returncode == 128 + signal.SIGTERM, _tail(out)
        assert "kts: sync stopped by SIGTERM" in out.read_text() and "Traceback" not in out.read_text()
        server = server_of(env)
        assert server is not None and "in this process" not in out.read_text()

        # SIGKILL leaves the client no say: its connection closes, and the server stops the command.
        doomed = start_sync(env, tmp_path / "doomed.log")
        wait_for_run_start(doomed, tmp_path / "doomed.log")
        doomed.kill()
        doomed.wait()
        deadline = time.monotonic() + 20
        while _children(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _children(server.pid) == [], "the served sync of a killed client still runs"
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            assert [r.status for r in instance.get_runs()] == [dg.DagsterRunStatus.CANCELED] * 2

        # A server killed mid-command: the client says so and fails; the command dies with it.
        out = tmp_path / "orphaned.log"
        sync = start_sync(env, out)
        wait_for_run_start(sync, out)
        assert server_of(env) == server
        children = _children(server.pid)
        assert children
        os.kill(server.pid, signal.SIGKILL)
        sync.wait(timeout=30)
        assert sync.returncode == 1
        assert f"kts: the CLI server (pid {server.pid}) ended before the command did" in out.read_text()
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in children), "the command outlived its server"

        # The next sync starts a fresh server and finishes what the stopped ones left.
        again = kts(env, "sync")
        assert again.returncode == 0, again.stderr[-3000:]
        assert server_of(env).pid != server.pid
    finally:
        kts(env, "services", "stop")


def test_concurrent_first_syncs_share_one_server_and_a_request_from_other_code_is_refused(tmp_path, pg_url):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()  # no partitions: a sync with nothing to do, fast
    env = served_env(tmp_path, log_dir, pg_url)
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
        assert len({rc for _, _, rc in results}) == 1, results
        log = (Path(env["KTS_HOME"]) / "cli-server" / "server.log").read_text()
        assert log.count(" serving ") == 1, log

        # A client whose code differs (an upgrade the server predates) is told so, not served.
        server = server_of(env)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + server.address)
            request = json.dumps({"argv": ["sync"], "env": env, "cwd": str(tmp_path), "fingerprint": "other"}).encode()
            socket.send_fds(sock, [len(request).to_bytes(4, "big") + request], [0, 1, 2])
            reply = cli_server._read_message(sock)
        assert "other code" in reply["error"]

        # A client that connects and says nothing holds up no one: the next sync is served while
        # the silent connection still waits for its request (the server reads a request only once
        # it has come, and drops a silent connection after REQUEST_TIMEOUT_S).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
            silent.connect("\0" + server.address)
            served = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env, cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=600)
            assert served.returncode == results[0][2], served.stderr[-2000:]
            silent.setblocking(False)
            with pytest.raises(BlockingIOError):  # not closed yet: the sync did not wait behind it
                silent.recv(1)
            silent.setblocking(True)
            silent.settimeout(cli_server.REQUEST_TIMEOUT_S + 30)
            assert silent.recv(1) == b""  # then dropped, unanswered
    finally:
        kts(env, "services", "stop")


def test_off_runs_the_sync_in_its_own_process_and_a_bad_value_is_one_line(tmp_path, pg_url):
    env = sync_env(tmp_path, tmp_path / "no-such-dir", pg_url, KTS_CLI_SERVER="off")
    result = kts(env, "sync")
    assert result.returncode == 1 and not (Path(env["KTS_HOME"]) / "cli-server").exists()
    bad = kts({**env, "KTS_CLI_SERVER": "sometimes"}, "sync")
    assert bad.returncode == 1 and bad.stderr.strip() == "kts: KTS_CLI_SERVER='sometimes': must be on or off"


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    from kts_resources.servers.local_processes import alive

    return alive(pid)


def test_the_servers_warm_up_leaves_a_command_nothing_to_import_before_it_runs():
    # A served child starts from the server's imports: whatever parsing its command line still
    # imported was paid by every sync (~0.1 s, the read and simulate commands' option modules).
    script = (
        "import importlib, sys\n"
        "from kts_assets.cli import server as cli_server\n"
        "for name in cli_server.PRELOAD: importlib.import_module(name)\n"
        "cli_server._warm_up()\n"
        "before = set(sys.modules)\n"
        "from kts_assets.cli.main import build_parser\n"
        "build_parser().parse_args(['sync'])\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                         env={**os.environ, **cli_server.SERVER_ENVIRONMENT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
