"""The servers kts starts under a ``KTS_HOME`` and leaves running for later processes (``kts
services``): what each is, whether it is alive, and stopping it.

Each kind of server registers a ``ServiceKind``: how to describe it and how to stop it, both
from its own state files under ``KTS_HOME`` only, so kts never touches a process it did not
start. The embedded Spark Connect server (``spark_connect.py``) is the second entry of ``SERVICE_KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RUNNING = "running"
# State files say a server is there, but it does not answer (a reboot, a kill): nothing to stop.
STALE = "stale"


@dataclass(frozen=True, slots=True)
class Service:
    """One embedded server of a KTS_HOME, as ``kts services`` lists it."""

    kind: str
    state: str  # RUNNING or STALE
    pid: int | None
    port: int | None
    data_dir: Path

    def as_json(self) -> dict:
        return {"kind": self.kind, "state": self.state, "pid": self.pid, "port": self.port, "data_dir": str(self.data_dir)}


@dataclass(frozen=True, slots=True)
class ServiceKind:
    """A kind of server kts starts: ``describe(kts_home)`` → the Service or None when there is
    none; ``stop(kts_home)`` → True when it stopped a running server (a no-op otherwise)."""

    name: str
    describe: Callable[[Path], Service | None]
    stop: Callable[[Path], bool]


def _describe_postgres(kts_home: Path) -> Service | None:
    from kts_resources.metadata import embedded

    home = kts_home / "postgres"
    if not home.is_dir():
        return None
    live = embedded.running(home)
    if live is not None:
        return Service("postgres", RUNNING, live.pid, live.port, live.data_dir)
    recorded = embedded.recorded(home)
    pid = embedded.postmaster_pid(home)
    if recorded is None and pid is None:
        return None  # initialised (or never started) and not running: nothing to list
    return Service("postgres", RUNNING if pid is not None else STALE,
                   pid if pid is not None else recorded.pid, recorded.port if recorded else None, embedded.data_dir(home))


def _stop_postgres(kts_home: Path) -> bool:
    from kts_resources.metadata import embedded

    home = kts_home / "postgres"
    return home.is_dir() and embedded.stop(home)


def _describe_spark_connect(kts_home: Path) -> Service | None:
    from kts_resources import spark_connect

    home = kts_home / "spark-connect"
    recorded = spark_connect.recorded(home)
    if recorded is None:
        return None
    state = RUNNING if spark_connect.running(home) is not None else STALE
    return Service("spark-connect", state, recorded.pid, recorded.port, home)


def _stop_spark_connect(kts_home: Path) -> bool:
    from kts_resources import spark_connect

    home = kts_home / "spark-connect"
    return home.is_dir() and spark_connect.stop(home)


SERVICE_KINDS: tuple[ServiceKind, ...] = (
    ServiceKind("postgres", _describe_postgres, _stop_postgres),
    ServiceKind("spark-connect", _describe_spark_connect, _stop_spark_connect),
)


def _kinds(only: str | None) -> tuple[ServiceKind, ...]:
    return tuple(kind for kind in SERVICE_KINDS if only is None or kind.name == only)


def services(kts_home: Path, only: str | None = None) -> list[Service]:
    """The embedded servers of ``kts_home`` (of kind ``only``, when given) that are running or left state behind."""
    return [s for kind in _kinds(only) if (s := kind.describe(kts_home)) is not None]


def stop_services(kts_home: Path, only: str | None = None) -> list[str]:
    """Stop every embedded server of ``kts_home`` (of kind ``only``, when given); the kinds that were running and stopped."""
    return [kind.name for kind in _kinds(only) if kind.stop(kts_home)]
