"""The standing CLI server (``kts_assets.cli.server``) as the servers' lifecycle (``lifecycle.py``)
sees it: its state under ``KTS_HOME/cli-server``, how to tell its process, and stopping it. Here,
not beside the server, so that ``kts services`` lists and stops it as one more service kind
(``services.py``) without kts_resources importing kts_assets; and the CLI server's client reads
no more than this before every command."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from kts_resources.servers import lifecycle

STATE_DIR = "cli-server"
LOG_FILE = "server.log"
# What its process runs: ``python -m SERVER_MODULE serve KTS_HOME/cli-server``.
SERVER_MODULE = "kts_assets.cli.server"
# How long a stopping server gives its running commands after their SIGTERM.
STOP_GRACE_S = 20


@dataclass(frozen=True, slots=True)
class CliServer:
    home: Path  # KTS_HOME/cli-server
    pid: int
    address: str  # the abstract socket's name (without the leading NUL)
    fingerprint: str

    @property
    def log(self) -> Path:
        return self.home / LOG_FILE


def state_dir(kts_home: Path) -> Path:
    return kts_home / STATE_DIR


def recorded(home: Path) -> CliServer | None:
    """The server ``home``'s state file names, alive or not; None when there is none."""
    return lifecycle.read_state(home, lambda raw: CliServer(home, int(raw["pid"]), str(raw["address"]), str(raw["fingerprint"])))


def running(home: Path) -> CliServer | None:
    """The recorded server when its process is alive and is this server (not a reused pid)."""
    server = recorded(home)
    if server is None or not lifecycle.runs(server.pid, SERVER_MODULE, str(server.home.resolve())):
        return None
    return server


def stop(home: Path) -> bool:
    """Stop ``home``'s server (SIGTERM: its running commands get SIGTERM too); True when one was running."""
    return lifecycle.stop_recorded(home, running, end)


def end(server: CliServer) -> None:
    """SIGTERM to ``server``'s process, SIGKILL once its commands' grace (and a little) has passed."""
    lifecycle.end_process(server.pid, grace_s=STOP_GRACE_S + 5, first=signal.SIGTERM, poll_s=0.05)
