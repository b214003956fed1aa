"""The embedded Spark Connect server of a ``KTS_HOME``: started by the first process that needs
Spark, reused by every later process and run, detected when dead or stale and replaced.

Like the embedded PostgreSQL (``metadata/embedded.py``), on the servers' one lifecycle
(``servers/lifecycle.py``): loopback only, state under ``KTS_HOME/spark-connect`` (``server.json``
with pid and port, ``server.log``), a start lock so concurrent first starts end up sharing one
server, and stopping by the recorded pid only. The
server is PySpark's own ``SparkConnectServer`` (the jar ships in the pip package), launched by
``bin/spark-submit`` in a session of its own (it outlives the process that started it); its Python
workers (PySpark's daemon, in a group of its own) end when the JVM's pipe to them closes. Its workers run this interpreter (kts's virtualenv), so kts's code imports
on the executors. A watchdog beside it (``home_watch.py``) stops it when its ``KTS_HOME`` is gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kts_resources import settings
from kts_resources.servers import home_watch, lifecycle
from kts_resources.servers.local_processes import start_time
from kts_resources.private_dirs import make_dirs
from kts_resources.spark.conf import spark_conf

LOOPBACK = lifecycle.LOOPBACK
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# spark-submit's --name for kts's server: how `kts services --all` tells it from other Connect servers.
APP_NAME = "kts Spark Connect server"
STATE_DIR = "spark-connect"  # under KTS_HOME
STATE_FILE = lifecycle.STATE_FILE
LOG_FILE = "server.log"


class SparkConnectError(RuntimeError):
    """The embedded server could not be started or did not answer; the message says where to look."""


@dataclass(frozen=True, slots=True)
class ConnectServer:
    home: Path
    pid: int
    port: int
    # The server-side session every kts process attaches to (None in a state written before it
    # existed: each process then makes its own). Spark gives each session its own Python workers,
    # so one shared session keeps the workers, and the kts modules they imported, warm across runs.
    session_id: str | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def session_url(self) -> str:
        """``url`` naming the shared session (Spark Connect's ``session_id`` parameter)."""
        return f"{self.url}/;session_id={self.session_id}" if self.session_id else self.url

    @property
    def log(self) -> Path:
        return self.home / LOG_FILE


def server_home(home: Path | None = None) -> Path:
    """``KTS_HOME/spark-connect`` (or ``home`` when given, as tests do)."""
    return lifecycle.state_dir(STATE_DIR, home)


def recorded(home: Path | None = None) -> ConnectServer | None:
    """What ``server.json`` under ``home`` says, alive or not (for ``kts services``)."""
    home = server_home(home)
    return lifecycle.read_state(home, lambda raw: ConnectServer(home, int(raw["pid"]), int(raw["port"]), raw.get("session_id")))


def running(home: Path | None = None) -> ConnectServer | None:
    """The live server recorded under ``home`` (its process alive and its port answering), or None;
    never starts one."""
    server = recorded(home)
    if server is not None and _is_ours(server) and _answers(server.port):
        return server
    return None


def ensure_running(home: Path | None = None, *, master: str | None = None, timeout_s: float = 120.0) -> ConnectServer:
    """The embedded server under ``home``: reused when alive, else started (a stale one stopped first)."""
    home = server_home(home)

    def replace() -> ConnectServer:
        stop(home)  # a recorded process that no longer answers: end it before replacing it
        return _start(home, master or settings.spark_master(), timeout_s)

    server = lifecycle.ensure_started(home, lambda: running(home), replace)
    home_watch.ensure_watched("spark-connect", home, watched(home))
    return server


def stop(home: Path | None = None, *, timeout_s: float = 30.0) -> bool:
    """Stop the server under ``home`` and its workers; True when one was running. Clears the state."""
    home = server_home(home)
    server = recorded(home)
    stopped = False
    if server is not None and _is_ours(server):
        _end_group(server.pid, None, timeout_s)
        stopped = True
    lifecycle.clear_state(home)
    return stopped


def _end_group(pid: int, started: int | None, timeout_s: float) -> None:
    """SIGTERM to the server's process group (its Python workers too), SIGKILL to what of it is
    left after ``timeout_s``."""
    lifecycle.end_process(pid, started, grace_s=timeout_s, group=True, poll_s=0.2)


def watched(home: Path) -> home_watch.Watched | None:
    """The live server of the state directory ``home``, as its watchdog follows it."""
    server = recorded(home)
    if server is None or not _is_ours(server):
        return None
    return home_watch.Watched(server.pid, start_time(server.pid))


def end_watched(server: home_watch.Watched, deleted: bool) -> None:
    """Stop a server whose ``KTS_HOME`` is gone (its state with it), by its recorded pid: it keeps
    nothing outside ``KTS_HOME``."""
    _end_group(server.pid, server.started, 30.0)


def _start(home: Path, master: str, timeout_s: float) -> ConnectServer:
    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    port = lifecycle.free_port()
    # kts's local session settings (loopback driver, no UI), plus where Connect listens: loopback only.
    conf = spark_conf(master, {
        "spark.connect.grpc.binding.address": LOOPBACK,
        "spark.connect.grpc.binding.port": str(port),
        "spark.log.level": "WARN",
        "spark.local.dir": str(home / "tmp"),
        # The shared session (ConnectServer.session_id) lives while the server does, idle or not:
        # an expired session's id cannot be used again.
        "spark.connect.session.manager.defaultSessionTimeout": "3650d",
        # No analysed plans kept between calls: in a session that outlives runs, a cached
        # `read.parquet(path)` keeps the file listing of an inventory a later run has replaced.
        "spark.connect.session.planCache.enabled": "false",
    })
    make_dirs(home / "tmp", 0o700)
    argv = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", APP_NAME]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": LOOPBACK,
        # The workers run kts's own interpreter, where the kts package is installed.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    with open(home / LOG_FILE, "ab") as log:
        # A session of its own: outlives this process, and its process group is what stop() ends.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=home, start_new_session=True)
    server = ConnectServer(home, proc.pid, port, str(uuid.uuid4()))
    # Recorded before it answers: a starter killed while it waits (a sync stopped in its first
    # seconds) must not leave a JVM nobody knows of. The next starter finds the record, and stop()
    # ends a recorded server that does not answer before it starts another.
    lifecycle.write_state(home, {"pid": server.pid, "port": server.port, "url": server.url, "session_id": server.session_id})
    deadline = time.monotonic() + timeout_s
    while not _answers(port):
        if proc.poll() is not None:
            lifecycle.clear_state(home)
            raise SparkConnectError(f"{home / LOG_FILE}: the Spark Connect server exited with status {proc.returncode} while starting")
        if time.monotonic() > deadline:
            lifecycle.end_process(proc.pid, grace_s=0, first=signal.SIGKILL, group=True)
            lifecycle.clear_state(home)
            raise SparkConnectError(f"{home / LOG_FILE}: the Spark Connect server did not answer on {LOOPBACK}:{port} within {timeout_s:.0f} s")
        time.sleep(0.25)
    return server


def _is_ours(server: ConnectServer) -> bool:
    """The recorded pid is alive and is a Spark Connect server on the recorded port (a pid reused
    by another process after a reboot is left alone)."""
    return lifecycle.runs(server.pid, SERVER_CLASS, f"spark.connect.grpc.binding.port={server.port}")


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((LOOPBACK, port)) == 0

