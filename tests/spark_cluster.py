"""A Spark standalone cluster on loopback, as README's "Beyond one machine" runs one: a master and
workers from the pip wheel's ``bin/spark-class`` (the wheel ships no ``start-master.sh`` or
``start-worker.sh``), and a Spark Connect server on it from ``bin/spark-submit``, which kts
attaches to through ``KTS_SPARK_REMOTE``.

Every process is started in a session of its own, so its process group holds the JVM and all it
starts (a worker's executors, their Python workers), and :meth:`SparkCluster.stop` ends exactly
those groups. The cluster is small (one core and 512 MiB per worker, daemons of 256 MiB, C1-only
JVMs) so it starts in seconds on a loaded 2-CPU machine.

The proof that work ran on the cluster is read from Spark's own JSON: the master's
(``/json/``: workers, applications), each worker's (``/json/``: the executors it runs) and the
Connect server's application REST API (``/api/v1``: its executors' tasks, its completed stages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kts_resources.servers import lifecycle
from kts_resources.servers.local_processes import start_time
from kts_resources.spark.conf import spark_conf
from kts_resources.spark.connect_server import SERVER_CLASS

LOOPBACK = lifecycle.LOOPBACK
APP_NAME = "kts on a standalone cluster"
WORKER_MEMORY = "512m"  # the least an executor may have is 450 MiB (1.5 × Spark's reserved 300 MiB)
# Hang-only bound on each wait below: JVMs start in seconds, but a loaded machine can be slow.
START_TIMEOUT_S = 180.0
# What every JVM here runs with: the C1 compiler only (kts_resources/spark/conf.py: C2's warm-up
# costs more than it gives to short-lived small work), and the serial collector (one thread).
LEAN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@dataclass
class SparkCluster:
    home: Path
    master_port: int
    master_webui_port: int
    connect_port: int
    app_ui_port: int
    # (pid, start time) of each process group started, in start order
    groups: list[tuple[int, int | None]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def connect_url(self) -> str:
        """What ``KTS_SPARK_REMOTE`` is set to."""
        return f"sc://{LOOPBACK}:{self.connect_port}"

    def master_state(self) -> dict:
        """The master's JSON API: its workers and applications."""
        return get_json(f"http://{LOOPBACK}:{self.master_webui_port}/json/")

    def worker_states(self) -> list[dict]:
        """Each worker's JSON API (at the address it registered with the master): the executors it
        runs, by application id."""
        return [get_json(f"{worker['webuiaddress']}/json/") for worker in self.master_state()["workers"]]

    def app(self, path: str = "") -> Any:
        """The Connect server's application REST API (``/api/v1/applications/<id>`` + ``path``)."""
        base = f"http://{LOOPBACK}:{self.app_ui_port}/api/v1/applications"
        [application] = get_json(base)
        return get_json(f"{base}/{application['id']}{path}")

    def cluster_executors(self) -> list[dict]:
        """The application's live executors on the workers (the driver's own entry left out)."""
        return [e for e in self.app("/executors") if e["id"] != "driver"]

    def completed_tasks(self) -> int:
        return sum(e["completedTasks"] for e in self.cluster_executors())

    def log(self, name: str) -> Path:
        return self.home / f"{name}.log"

    def _launch(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.log(name), "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, cwd=self.home, start_new_session=True)
        self.groups.append((proc.pid, start_time(proc.pid)))
        return proc

    def stop(self) -> None:
        """End every process group started, the Connect server first (its executors then leave
        the workers), the master last; SIGKILL to what is left of a group after a grace period."""
        for pid, started in reversed(self.groups):
            lifecycle.end_process(pid, started, grace_s=15, group=True, poll_s=0.2)


def processes_working_under(home: Path) -> list[tuple[int, list[str]]]:
    """Live processes whose working directory is ``home`` or lies under it, with their command lines."""
    from kts_resources.servers.local_processes import alive, command_line, pids

    found = []
    for pid in pids():
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(home) and alive(pid):
            found.append((pid, command_line(pid)))
    return found


def _env(home: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": LEAN_JVM,
        "SPARK_WORKER_DIR": str(home / "work"),
        "SPARK_LOCAL_DIRS": str(home / "tmp"),
        # The Python the executors run (Spark Connect takes it from its server's environment): kts's
        # own interpreter, where kts's dependencies are installed.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "KTS_SPARK_REMOTE", "KTS_SPARK_MASTER"):
        env.pop(name, None)
    return env


def wait_for(what: str, ready: Callable[[], bool], processes: list[subprocess.Popen], cluster: SparkCluster) -> None:
    """Until ``ready()`` holds; a process of the cluster that exited meanwhile fails it at once."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if ready():
                return
        except OSError:  # a web UI not listening yet
            pass
        for proc in processes:
            if proc.poll() is not None:
                raise RuntimeError(f"waiting for {what}: {proc.args[-1]!r} exited with status {proc.returncode}; "
                                   f"logs under {cluster.home}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not within {START_TIMEOUT_S:.0f} s; logs under {cluster.home}")
        time.sleep(0.25)


def start_cluster(home: Path, workers: int = 2) -> SparkCluster:
    """A master, ``workers`` workers of one core each and a Spark Connect server on them, all on
    loopback under ``home``; returns once every worker runs an executor of the Connect server's
    application and the application knows them all. On failure, what was started is stopped."""
    for sub in ("work", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    free = lifecycle.free_port
    cluster = SparkCluster(home, free(), free(), free(), free())
    env = _env(home)
    spark_class = str(spark_home() / "bin" / "spark-class")
    try:
        master = cluster._launch("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                                            "--port", str(cluster.master_port), "--webui-port", str(cluster.master_webui_port)], env)
        started = [master]
        wait_for("the master", lambda: cluster.master_state()["status"] == "ALIVE", started, cluster)
        for i in range(workers):
            # Any free port for its web UI (0): the master's JSON gives each worker's address.
            started.append(cluster._launch(f"worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--webui-port", "0",
                "--cores", "1", "--memory", WORKER_MEMORY, cluster.master_url], env))
        # The Connect server as README starts one, plus what a small loopback cluster needs: the
        # driver on loopback (kts's spark_conf), one 512 MiB executor a worker, and its UI (the
        # REST API the tests read).
        conf = spark_conf(cluster.master_url, {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(cluster.connect_port),
            "spark.ui.enabled": "true",
            "spark.ui.port": str(cluster.app_ui_port),
            "spark.driver.memory": WORKER_MEMORY,
            "spark.driver.extraJavaOptions": LEAN_JVM,
            "spark.executor.memory": WORKER_MEMORY,
            "spark.executor.cores": "1",
            "spark.executor.extraJavaOptions": LEAN_JVM,
            "spark.log.level": "WARN",
        })
        argv = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", APP_NAME]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        # Its launcher takes a Connect server's heap from SPARK_DAEMON_MEMORY, not spark.driver.memory.
        started.append(cluster._launch("connect-server", argv, {**env, "SPARK_DAEMON_MEMORY": WORKER_MEMORY}))

        def every_worker_runs_an_executor() -> bool:
            state = cluster.master_state()
            apps = [a for a in state["activeapps"] if a["name"] == APP_NAME]
            if state["aliveworkers"] != workers or len(apps) != 1:
                return False
            running = [[e for e in w["executors"] if e["appid"] == apps[0]["id"]] for w in cluster.worker_states()]
            return len(running) == workers and all(running) and len(cluster.cluster_executors()) == workers

        wait_for(f"an executor on each of {workers} workers", every_worker_runs_an_executor, started, cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster
