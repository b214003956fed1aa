"""The embedded Spark Connect server of a KTS_HOME: with neither KTS_SPARK_REMOTE nor
KTS_SPARK_MASTER set, the first process needing Spark starts it on loopback, concurrent first
starts share one server, later processes reuse it, a dead or stale one is replaced, and
``kts services stop`` stops it with its workers."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kts_resources.servers.local_processes import group_alive
from kts_resources.spark import connect_server as spark_connect
from kts_resources.spark.conf import spark_conf
from kts_resources.spark.session import EMBEDDED, build_spark_session, forget_connect_sessions, lost_connect_server, spark_mode
from tests.conftest import REPO_ROOT

# Each test here starts servers of its own (a KTS_HOME each), not the session's.
ATTACH = (
    "from kts_resources.spark import connect_server as spark_connect\n"
    "from kts_resources.spark.session import build_spark_session\n"
    "spark = build_spark_session()\n"
    "rows = spark.range(0, 4, 1, numPartitions=2).mapInArrow(lambda batches: batches, 'id long').count()\n"
    "print(spark_connect.running().pid, rows)\n"
)


def embedded_env(home) -> dict[str, str]:
    env = {**os.environ, "KTS_HOME": str(home)}
    for name in ("KTS_SPARK_REMOTE", "KTS_SPARK_MASTER"):
        env.pop(name, None)
    return env


def kts(home, *args):
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=embedded_env(home), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def accepts_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def python_workers_of(pid: int) -> list[int]:
    """PySpark's worker daemons the JVM ``pid`` started (its children running pyspark.daemon)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"pyspark.daemon" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_neither_remote_nor_master_means_the_embedded_server(monkeypatch):
    monkeypatch.delenv("KTS_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("KTS_SPARK_MASTER", raising=False)
    assert spark_mode() == EMBEDDED


@pytest.mark.parametrize("master", ["local[*]", "local[2]", "local"])
def test_a_local_jvm_leaves_out_adaptive_execution_and_the_c2_compiler_and_a_cluster_keeps_sparks_defaults(master):
    local = spark_conf(master)
    assert local["spark.sql.adaptive.enabled"] == "false"
    assert local["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"
    cluster = spark_conf("spark://spark-master:7077")
    assert "spark.sql.adaptive.enabled" not in cluster and "spark.driver.extraJavaOptions" not in cluster


def test_two_processes_starting_spark_at_once_share_one_server_and_services_stop_stops_it(tmp_path):
    home = tmp_path / "kts-home"
    try:
        procs = [subprocess.Popen([sys.executable, "-c", ATTACH], env=embedded_env(home), cwd=REPO_ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
        pids = {out.split()[0] for out, _ in outs}
        assert len(pids) == 1 and all(out.split()[1] == "4" for out, _ in outs)
        server = spark_connect.running(home / "spark-connect")
        assert server is not None and str(server.pid) in pids

        listed = json.loads(kts(home, "services", "--json").stdout)
        entry = {"kind": "spark-connect", "state": "running", "pid": server.pid, "port": server.port,
                 "data_dir": str(home / "spark-connect")}
        assert entry in listed
        assert json.loads(kts(home, "spark", "--json").stdout) == [entry]  # `kts spark status`: this server only
        # Nothing listens beyond loopback: every port the server holds is bound to 127.0.0.1.
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        ours = [line for line in listening if f"pid={server.pid}," in line]
        assert ours and all(line.split()[3].rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for line in ours), ours

        # A local JVM compiles with C1 only (kts_resources.spark.session: C2's warm-up took the copy's cores).
        assert b"-XX:TieredStopAtLevel=1" in Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")

        workers = python_workers_of(server.pid)
        # The jobs above ran Python on the server's own workers; every process attaches to the one
        # server-side session, so they share one worker daemon, and a later process reuses it warm.
        assert len(workers) == 1, workers
        later = subprocess.run([sys.executable, "-c", ATTACH], env=embedded_env(home), cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=300)
        assert later.returncode == 0, later.stderr[-2000:]
        assert python_workers_of(server.pid) == workers

        stopped = kts(home, "services", "stop")
        assert stopped.returncode == 0 and "spark-connect" in stopped.stdout, stopped.stderr
        assert not group_alive(server.pid)  # the JVM and whatever it started in its group
        # Nothing of it listens any more (by its pid: the port number itself may be another test's by now).
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        assert not [line for line in listening if f"pid={server.pid}," in line]
        assert spark_connect.recorded(home / "spark-connect") is None
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if alive(pid)]  # the workers end with their JVM: nothing left behind
    finally:
        spark_connect.stop(home / "spark-connect")


def test_a_client_that_stops_its_session_leaves_the_shared_one_open_for_every_later_process(tmp_path):
    # `spark.stop()` would release the server-side session every kts process shares; kts's clients
    # only close their own channel, so later processes attach to the same session and its workers.
    home = tmp_path / "kts-home"
    try:
        closing = subprocess.run([sys.executable, "-c", ATTACH + "spark.stop()\n"], env=embedded_env(home), cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=300)
        assert closing.returncode == 0, closing.stderr[-2000:]
        shared = spark_connect.recorded(home / "spark-connect").session_id
        later = subprocess.run([sys.executable, "-c", ATTACH], env=embedded_env(home), cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=120)
        assert later.returncode == 0 and later.stdout.split()[1] == "4", later.stderr[-2000:]
        assert spark_connect.recorded(home / "spark-connect").session_id == shared
    finally:
        spark_connect.stop(home / "spark-connect")


def test_a_later_process_in_the_shared_session_reads_a_parquet_directory_as_it_is_now(tmp_path):
    # The inventory is replaced whole between runs (new part files under the same path). In a
    # session shared by every run, a plan cached from an earlier read would list the old files.
    home, table = tmp_path / "kts-home", tmp_path / "table.parquet"
    write = ("import shutil, sys\nfrom kts_resources.spark.session import build_spark_session\nspark = build_spark_session()\n"
             f"shutil.rmtree({str(table)!r}, ignore_errors=True)\n"
             f"spark.range(0, int(sys.argv[1])).write.parquet({str(table)!r})\n"
             f"print(spark.read.parquet({str(table)!r}).count())\n")
    try:
        for n in ("3", "5"):
            run = subprocess.run([sys.executable, "-c", write, n], env=embedded_env(home), cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=300)
            assert run.returncode == 0 and run.stdout.split() == [n], run.stderr[-2000:]
    finally:
        spark_connect.stop(home / "spark-connect")


def test_a_server_killed_mid_job_fails_the_job_in_seconds_and_the_next_use_starts_a_fresh_one(tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "kts-home"))
    monkeypatch.delenv("KTS_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("KTS_SPARK_MASTER", raising=False)
    home = tmp_path / "kts-home" / "spark-connect"

    try:
        spark = build_spark_session()
        first = spark_connect.running(home)
        assert first is not None and spark.range(3).count() == 3
        server_pid = first.pid

        def kill_own_server(batches):  # defined here: pickled by value, the worker cannot import tests/
            import os
            import signal

            os.killpg(server_pid, signal.SIGKILL)  # the JVM running this very task, and its group
            yield from batches

        started = time.monotonic()
        with pytest.raises(Exception) as failed:
            spark.range(0, 2, 1, numPartitions=1).mapInArrow(kill_own_server, "id long").collect()
        # Hang-only, yet short of the client's default ten minutes of retries, which it rules out.
        assert time.monotonic() - started < 300
        # What a step fails with (KtsPySparkResource.server_loss_as_failure): one line, not a gRPC trace.
        said = lost_connect_server(spark, failed.value)
        assert said is not None and first.url in said and "stopped answering" in said and "next run" in said
        assert lost_connect_server(spark, ValueError("a bug of kts")) is None
        assert spark_connect.running(home) is None
        listed = json.loads(kts(home.parent, "services", "--json").stdout)
        assert [(s["kind"], s["state"], s["pid"]) for s in listed] == [("spark-connect", "stale", first.pid)]

        again = build_spark_session()
        second = spark_connect.running(home)
        assert second is not None and second.pid != first.pid
        assert again.range(5).count() == 5
    finally:
        forget_connect_sessions()
        spark_connect.stop(home)


def test_a_starter_killed_before_its_server_answers_leaves_no_unrecorded_server(tmp_path):
    """A sync killed in its first seconds, while the JVM it launched is still starting: the next
    starter finds that JVM recorded and ends it, rather than starting a second beside it."""
    home = tmp_path / "spark-connect"
    # The starter never sees its server answer (as if it were killed before it did).
    starter = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom pathlib import Path\nfrom kts_resources.spark import connect_server as spark_connect\n"
                               "spark_connect._answers = lambda port: False\n"
                               "spark_connect.ensure_running(Path(sys.argv[1]))\n", str(home)],
        env=embedded_env(tmp_path), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while spark_connect.recorded(home) is None and time.monotonic() < deadline:
            assert starter.poll() is None, starter.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        first = spark_connect.recorded(home)
        assert first is not None and alive(first.pid)
        starter.kill()
        starter.wait(timeout=10)
        assert alive(first.pid)  # its own session: the launched JVM outlives the killed starter

        server = spark_connect.ensure_running(home)
        assert server.pid != first.pid and accepts_connections(server.port)
        assert not group_alive(first.pid)  # the unanswered one was ended, not left running
    finally:
        starter.kill()
        spark_connect.stop(home)
        if "first" in locals() and first is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(first.pid, 9)


def test_a_recorded_pid_that_is_not_a_spark_server_is_left_alone_and_not_reused(tmp_path):
    """A pid reused after a reboot (here: this test's own process) is never signalled."""
    home = tmp_path / "spark-connect"
    home.mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        (home / "server.json").write_text(json.dumps({"pid": os.getpid(), "port": port}))
        assert spark_connect.recorded(home).pid == os.getpid()
        assert spark_connect.running(home) is None  # the port answers, but the pid is no Spark server
        assert spark_connect.stop(home) is False
    assert spark_connect.recorded(home) is None


@pytest.mark.parametrize("content", ["", "{", '{"pid": "x", "port": 1}', '{"port": 1}'])
def test_an_unreadable_state_file_means_no_server(tmp_path, content):
    home = tmp_path / "spark-connect"
    home.mkdir()
    (home / "server.json").write_text(content)
    assert spark_connect.recorded(home) is None and spark_connect.running(home) is None


def _delete(path: Path) -> None:
    """``rm -rf path`` while a server still writes into it (a first pass can race a new file)."""
    import shutil

    deadline = time.monotonic() + 60
    while path.exists() and time.monotonic() < deadline:
        shutil.rmtree(path, ignore_errors=True)


def test_a_server_whose_kts_home_is_deleted_stops_and_services_all_saw_it_before(tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_IDLE_CHECK_S", "0.2")
    kts_home = tmp_path / "kts-home"
    home = kts_home / "spark-connect"
    server = spark_connect.ensure_running(home, master="local[1]")
    try:
        listed = kts(tmp_path / "elsewhere", "services", "--all", "--under", str(tmp_path), "--json")
        assert listed.returncode == 0, listed.stderr
        assert [(s["kind"], s["state"], s["pid"], s["port"], s["kts_home"], s["orphan"]) for s in json.loads(listed.stdout)] == [
            ("spark-connect", "running", server.pid, server.port, str(kts_home), False)]

        _delete(kts_home)

        deadline = time.monotonic() + 120  # hang-only: the watchdog looks every 0.2 s
        while (alive(server.pid) or accepts_connections(server.port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server.pid), "the Spark Connect server of a deleted KTS_HOME still runs"
        assert not accepts_connections(server.port)
    finally:
        spark_connect.end_watched(spark_connect.home_watch.Watched(server.pid, None), deleted=True)
