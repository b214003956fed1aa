"""`kts serve` as the servers' lifecycle (``lifecycle.py``) sees it: its state under
``KTS_HOME/serve`` (pid, start time, listen and advertised addresses), whether it runs, and
stopping it (SIGTERM: it drains its in-flight requests and exits within seconds)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kts_resources.private_dirs import make_dirs
from kts_resources.servers import lifecycle
from kts_resources.servers.local_processes import same_process, start_time

STATE_DIR = "serve"
# SIGTERM drains within DRAIN_S (serving/server.py); SIGKILL after this.
STOP_GRACE_S = 15


@dataclass(frozen=True, slots=True)
class ServeServer:
    home: Path  # KTS_HOME/serve
    pid: int
    started: int | None  # the process's start time: a reused pid is never taken for it
    host: str
    port: int
    advertised: str  # host:port

    def as_record(self) -> dict:
        return {"pid": self.pid, "started": self.started, "host": self.host, "port": self.port, "advertised": self.advertised}


def state_dir(kts_home: Path) -> Path:
    return kts_home / STATE_DIR


def recorded(home: Path) -> ServeServer | None:
    return lifecycle.read_state(home, lambda raw: ServeServer(home, int(raw["pid"]), raw.get("started"), str(raw["host"]),
                                                              int(raw["port"]), str(raw["advertised"])))


def running(home: Path) -> ServeServer | None:
    """The recorded server when its process is alive and is the one recorded."""
    server = recorded(home)
    if server is None or not same_process(server.pid, server.started):
        return None
    return server


def record_this_process(home: Path, host: str, port: int, advertised: str) -> ServeServer:
    make_dirs(home, 0o700)
    server = ServeServer(home, os.getpid(), start_time(os.getpid()), host, port, advertised)
    lifecycle.write_state(home, server.as_record())
    return server


def forget_this_process(home: Path) -> None:
    """Clear the record if it is this process's (a newer server may have replaced it)."""
    server = recorded(home)
    if server is not None and server.pid == os.getpid():
        lifecycle.clear_state(home)


def stop(home: Path) -> bool:
    """Stop ``home``'s server; True when one was running."""
    return lifecycle.stop_recorded(home, running, lambda server: lifecycle.end_process(
        server.pid, server.started, grace_s=STOP_GRACE_S, poll_s=0.05))
