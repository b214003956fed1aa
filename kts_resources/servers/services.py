"""The servers kts starts under a ``KTS_HOME`` and leaves running for later processes (``kts
services``): what each is, whether it is alive, and stopping it.

Each kind of server registers a ``ServiceKind``: how to describe it and how to stop it, both
from its own state files under ``KTS_HOME`` only (``lifecycle.py``), so kts never touches a process
it did not start. ``SERVICE_KINDS`` holds the embedded PostgreSQL, the embedded Spark Connect server
(``spark/connect_server.py``), the standing CLI server (``cli_server_state.py``) and `kts serve`
(``serve_state.py``).

``machine_servers`` looks wider, for ``kts services --all``: every kts server of this machine's
account, whichever KTS_HOME started it, found by its process; and under root every cluster in
``/var/lib/kts/postgres``. An orphan is one whose KTS_HOME is gone (deleted or moved away).
"""

from __future__ import annotations

import os
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
    stats: dict | None = None  # what the server counts, for a kind that counts (`kts serve`)

    def as_json(self) -> dict:
        out = {"kind": self.kind, "state": self.state, "pid": self.pid, "port": self.port, "data_dir": str(self.data_dir)}
        return out if self.stats is None else {**out, "stats": self.stats}


@dataclass(frozen=True, slots=True)
class ServiceKind:
    """A kind of server kts starts: ``describe(kts_home)`` → the Service or None when there is
    none; ``stop(kts_home)`` → True when it stopped a running server (a no-op otherwise). A kind
    whose work ``uses_the_others`` (the CLI server's commands use the other two) stops first."""

    name: str
    describe: Callable[[Path], Service | None]
    stop: Callable[[Path], bool]
    uses_the_others: bool = False


def _describe_postgres(kts_home: Path) -> Service | None:
    from kts_resources.metadata import embedded

    home = kts_home / embedded.STATE_DIR
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

    home = kts_home / embedded.STATE_DIR
    return home.is_dir() and embedded.stop(home)


def _describe_spark_connect(kts_home: Path) -> Service | None:
    from kts_resources.spark import connect_server as spark_connect

    home = kts_home / spark_connect.STATE_DIR
    recorded = spark_connect.recorded(home)
    if recorded is None:
        return None
    state = RUNNING if spark_connect.running(home) is not None else STALE
    return Service("spark-connect", state, recorded.pid, recorded.port, home)


def _stop_spark_connect(kts_home: Path) -> bool:
    from kts_resources.spark import connect_server as spark_connect

    home = kts_home / spark_connect.STATE_DIR
    return home.is_dir() and spark_connect.stop(home)


def _describe_cli_server(kts_home: Path) -> Service | None:
    from kts_resources.servers import cli_server_state

    home = cli_server_state.state_dir(kts_home)
    server = cli_server_state.recorded(home)
    if server is None:
        return None
    return Service("cli-server", RUNNING if cli_server_state.running(home) is not None else STALE, server.pid, None, home)


def _stop_cli_server(kts_home: Path) -> bool:
    from kts_resources.servers import cli_server_state

    return cli_server_state.stop(cli_server_state.state_dir(kts_home))


def _describe_serve(kts_home: Path) -> Service | None:
    from kts_resources.servers import serve_state

    home = serve_state.state_dir(kts_home)
    server = serve_state.recorded(home)
    if server is None:
        return None
    from kts_resources.serving import stats

    return Service("serve", RUNNING if serve_state.running(home) is not None else STALE, server.pid, server.port, home,
                   stats.read(home))


def _stop_serve(kts_home: Path) -> bool:
    from kts_resources.servers import serve_state

    return serve_state.stop(serve_state.state_dir(kts_home))


# Listed in this order.
SERVICE_KINDS: tuple[ServiceKind, ...] = (
    ServiceKind("postgres", _describe_postgres, _stop_postgres),
    ServiceKind("spark-connect", _describe_spark_connect, _stop_spark_connect),
    ServiceKind("cli-server", _describe_cli_server, _stop_cli_server, uses_the_others=True),
    # `kts serve` reads through the metadata store: stopped before it, with the CLI server.
    ServiceKind("serve", _describe_serve, _stop_serve, uses_the_others=True),
)


def _kinds(only: str | None) -> tuple[ServiceKind, ...]:
    return tuple(kind for kind in SERVICE_KINDS if only is None or kind.name == only)


def services(kts_home: Path, only: str | None = None) -> list[Service]:
    """The embedded servers of ``kts_home`` (of kind ``only``, when given) that are running or left state behind."""
    return [s for kind in _kinds(only) if (s := kind.describe(kts_home)) is not None]


def stop_services(kts_home: Path, only: str | None = None) -> list[str]:
    """Stop every embedded server of ``kts_home`` (of kind ``only``, when given), the kinds that
    use the others first; the kinds that were running and stopped."""
    kinds = sorted(_kinds(only), key=lambda kind: not kind.uses_the_others)
    return [kind.name for kind in kinds if kind.stop(kts_home)]


# -- every kts server of this machine's account (``kts services --all``) -------------------------

# A cluster under /var/lib/kts/postgres that no server runs on.
STOPPED = "stopped"
WATCHDOG = "watchdog"


@dataclass(frozen=True, slots=True)
class MachineServer:
    """A kts server of this machine's account, found by its process (or, for a cluster no server
    runs on, by its directory), whichever KTS_HOME it belongs to: ``kts services --all``."""

    kind: str  # postgres, spark-connect, cli-server, serve (or WATCHDOG: the watchdog beside a server)
    state: str  # RUNNING, or STOPPED for a cluster
    pid: int | None
    port: int | None
    home: Path | None  # its state directory (KTS_HOME/postgres, …); None when nothing says
    data_dir: Path | None
    orphan: bool  # its KTS_HOME is gone, or no longer leads to it (False when that is unknown)
    started: int | None = None  # the process's start time, so a stop never signals a reused pid

    @property
    def kts_home(self) -> Path | None:
        return self.home.parent if self.home is not None else None

    def as_json(self) -> dict:
        return {"kind": self.kind, "state": self.state, "pid": self.pid, "port": self.port,
                "kts_home": str(self.kts_home) if self.kts_home is not None else None,
                "data_dir": str(self.data_dir) if self.data_dir is not None else None, "orphan": self.orphan}


def machine_servers(under: Path | None = None, *, watchdogs: bool = False) -> list[MachineServer]:
    """Every kts server of this account (under root, also those running as the embedded
    PostgreSQL's account), orphans included, and under root every cluster in
    ``/var/lib/kts/postgres``; with ``under``, only those whose KTS_HOME lies under it."""
    from kts_resources.servers import local_processes as procs
    from kts_resources.metadata import embedded

    accounts = {os.getuid()}
    if (uid := embedded.server_account_uid()) is not None:
        accounts.add(uid)
    found: list[MachineServer] = []
    for pid in procs.pids():
        if procs.owner_uid(pid) not in accounts:
            continue
        argv = procs.command_line(pid)
        server = (_postgres_process(pid, argv) or _spark_connect_process(pid, argv) or _kts_module_process(pid, argv)
                  or _serve_process(pid, argv))
        if server is not None and (watchdogs or server.kind != WATCHDOG):
            found.append(server)
    found += _clusters_without_server({_real(s.data_dir) for s in found if s.kind == "postgres" and s.data_dir})
    if under is not None:
        found = [s for s in found if s.home is not None and _lies_under(s.home, under)]
    return found


def stop_machine_servers(servers: list[MachineServer]) -> list[MachineServer]:
    """Stop each running server (through its KTS_HOME's own state while that is there, else by
    its pid) and remove each orphaned cluster; the ones stopped or removed. CLI servers first:
    their commands use the others."""
    from kts_resources.servers import home_watch, lifecycle
    from kts_resources.spark import connect_server as spark_connect
    from kts_resources.servers.local_processes import same_process
    from kts_resources.metadata import embedded

    done = []
    for server in sorted(servers, key=lambda s: s.kind not in ("cli-server", "serve")):
        if server.kind == WATCHDOG:
            continue  # each leaves once its server is gone
        if server.state == STOPPED:
            if server.orphan and server.data_dir is not None and embedded.remove_cluster(server.data_dir.parent):
                done.append(server)
            continue
        if not same_process(server.pid, server.started):
            continue  # ended meanwhile
        by_state = server.home is not None and not server.orphan
        if server.kind == "postgres":
            if by_state:
                embedded.stop(server.home)
            else:
                outside = server.data_dir.parent if server.data_dir is not None else None
                embedded.end_watched(home_watch.Watched(server.pid, server.started, outside), deleted=server.orphan)
        elif server.kind == "spark-connect":
            if by_state:
                spark_connect.stop(server.home)
            else:
                spark_connect.end_watched(home_watch.Watched(server.pid, server.started), deleted=True)
        else:
            # The CLI server and kts serve clear their own state as they exit.
            lifecycle.end_process(server.pid, server.started, grace_s=30.0)
        done.append(server)
    return done


def _postgres_process(pid: int, argv: list[str]) -> MachineServer | None:
    """A postmaster kts started (``embedded._start``: loopback only, no Unix socket)."""
    from kts_resources.servers.local_processes import start_time
    from kts_resources.metadata import embedded

    if not argv or os.path.basename(argv[0]) != "postgres" or "-D" not in argv[:-1]:
        return None
    if f"listen_addresses={embedded.LOOPBACK}" not in argv or "unix_socket_directories=" not in argv:
        return None
    # A postmaster runs in its data dir: its cwd is where that is now, even after a rename.
    data_dir = Path(_cwd(pid) or argv[argv.index("-D") + 1])
    cluster = data_dir.parent
    home = embedded.cluster_owner(cluster) if cluster.parent == embedded.CLUSTERS_WHEN_ROOT else cluster
    return MachineServer("postgres", RUNNING, pid, _int_after(argv, "-p"), home, data_dir,
                         home is not None and embedded.orphaned(home, data_dir), start_time(pid))


def _spark_connect_process(pid: int, argv: list[str]) -> MachineServer | None:
    """The JVM of an embedded Spark Connect server (``spark_connect._start``): its spark.local.dir
    is ``KTS_HOME/spark-connect/tmp``."""
    from kts_resources.servers import home_watch
    from kts_resources.spark import connect_server as spark_connect
    from kts_resources.servers.local_processes import start_time

    if spark_connect.SERVER_CLASS not in argv or spark_connect.APP_NAME not in argv:
        return None
    conf = dict(arg.split("=", 1) for arg in argv if arg.startswith("spark.") and "=" in arg)
    local_dir = conf.get("spark.local.dir")
    home = Path(local_dir).parent if local_dir else None
    port = conf.get("spark.connect.grpc.binding.port")
    return MachineServer("spark-connect", RUNNING, pid, int(port) if port and port.isdigit() else None, home, home,
                         home is not None and home_watch.home_gone(home), start_time(pid))


def _kts_module_process(pid: int, argv: list[str]) -> MachineServer | None:
    """A CLI server (``python -m kts_assets.cli.server serve HOME``) or a watchdog (``python -m
    kts_resources.servers.home_watch KIND HOME``)."""
    from kts_resources.servers import cli_server_state, home_watch
    from kts_resources.servers.local_processes import start_time

    kinds = {cli_server_state.SERVER_MODULE: "cli-server", "kts_resources.servers.home_watch": WATCHDOG}
    if len(argv) < 5 or argv[1] != "-m" or argv[2] not in kinds:
        return None
    home = Path(argv[4])
    return MachineServer(kinds[argv[2]], RUNNING, pid, None, home, home, home_watch.home_gone(home), start_time(pid))


def _serve_process(pid: int, argv: list[str]) -> MachineServer | None:
    """A `kts serve` (``kts serve …`` or ``python -m kts_assets.cli serve …``): its KTS_HOME is the
    one its environment names (the default ``~/.kts`` when none), its port the one it recorded."""
    from kts_resources.servers import home_watch, serve_state
    from kts_resources.servers.local_processes import start_time

    words = [os.path.basename(word) for word in argv[:4]]  # python [-m] kts_assets.cli|…/bin/kts serve
    if not any(words[i:i + 2] in (["kts", "serve"], ["kts_assets.cli", "serve"]) for i in range(3)):
        return None
    from kts_resources import settings

    # Another process's KTS_HOME, from its environment: the name is settings', the default settings' too.
    kts_home = _environment(pid).get(settings.HOME) or os.path.expanduser("~/.kts")
    home = serve_state.state_dir(Path(kts_home))
    recorded = serve_state.recorded(home)
    port = recorded.port if recorded is not None and recorded.pid == pid else None
    return MachineServer("serve", RUNNING, pid, port, home, home, home_watch.home_gone(Path(kts_home)), start_time(pid))


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(entry.decode(errors="replace").split("=", 1) for entry in raw.split(b"\0") if b"=" in entry)


def _clusters_without_server(running: set[Path]) -> list[MachineServer]:
    """Under root, the clusters in ``/var/lib/kts/postgres`` that no server runs on."""
    from kts_resources.metadata import embedded

    try:
        clusters = sorted(p for p in embedded.CLUSTERS_WHEN_ROOT.iterdir() if p.is_dir())
    except OSError:
        return []  # none, or not root: not listable
    found = []
    for cluster in clusters:
        data_dir = cluster / "data"
        if _real(data_dir) in running:
            continue
        home = embedded.cluster_owner(cluster)
        found.append(MachineServer("postgres", STOPPED, None, None, home, data_dir,
                                   home is not None and embedded.orphaned(home, data_dir)))
    return found


def _cwd(pid: int) -> str | None:
    try:
        link = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    return link.removesuffix(" (deleted)")


def _int_after(argv: list[str], flag: str) -> int | None:
    try:
        return int(argv[argv.index(flag) + 1])
    except (ValueError, IndexError):
        return None


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _lies_under(path: Path, root: Path) -> bool:
    return _real(path).is_relative_to(_real(root)) or Path(os.path.abspath(path)).is_relative_to(os.path.abspath(root))
