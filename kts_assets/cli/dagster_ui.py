"""`kts ui` and `kts code-server`: Dagster's servers on the instance and environment the CLI uses.

- ``kts ui``: the webserver and the daemon, loopback only. Alone it starts this kts's code location as
  a code server of its own, which both share; with ``--workspace`` it loads the code locations a
  workspace file names — beside a cluster, every broker's ``kts code-server`` — and is the one
  webserver and daemon of them. In order: the code server (Dagster, PySpark and kts imported, the
  definitions loaded), the webserver once it listens (the first page answers once the webserver has
  loaded the location from it), then the daemon — not ``dagster dev``, which starts all three at
  once (and a proxy code server besides), so on two busy CPUs they slowed each other's start and
  the first page took about a minute.
- ``kts code-server``: this kts's code location as a gRPC server (``dagster code-server start``),
  under the name ``kts_assets.broker_scope`` gives it. The daemon launches a location's runs through
  its server, and the server starts each run's worker beside itself (Dagster's DefaultRunLauncher), so
  a broker's runs read that broker's log dirs on that broker's host.

Both stop on SIGINT/SIGTERM, with everything they started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kts_assets.broker_scope import DEFINITIONS_MODULE
from kts_assets.cli.common import EXIT_USAGE, CommandError, bounded
from kts_assets.instance import REPO_ROOT, dagster_home

# How long `kts ui` / `kts code-server` wait for Dagster's processes to stop after SIGINT/SIGTERM
# before killing them.
UI_STOP_GRACE_S = 20
DEFAULT_CODE_SERVER_PORT = 4000


def add_dagster_parsers(sub) -> None:
    p = sub.add_parser("ui", help="the Dagster UI (webserver + daemon) on the instance and environment the CLI uses, loopback only")
    p.add_argument("--port", type=bounded(int, 1, 65535), default=3000, metavar="P", help="the port on 127.0.0.1 (default 3000)")
    p.add_argument("--workspace", type=Path, metavar="FILE",
                   help="a workspace.yaml naming the code locations to load (beside a cluster: each broker's `kts code-server`); "
                        "default: this kts's own code location")
    p.set_defaults(func=cmd_ui)
    p = sub.add_parser("code-server", help="this kts's Dagster code location as a gRPC server, for the webserver and daemon "
                                           "of `kts ui --workspace` (beside a cluster: one per broker)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default 127.0.0.1; the daemon's host must reach it: anyone who can may "
                        "launch runs)")
    p.add_argument("--port", type=bounded(int, 1, 65535), default=DEFAULT_CODE_SERVER_PORT, metavar="P",
                   help=f"the port (default {DEFAULT_CODE_SERVER_PORT})")
    p.set_defaults(func=cmd_code_server)


def _environment() -> dict[str, str]:
    """The environment a Dagster process gets: this CLI's DAGSTER_HOME, and KTS_HOME / KTS_LOG_DIRS
    resolved as the CLI resolves them, so the code location never falls back to other defaults."""
    from kts_resources import settings

    home = dagster_home()  # first: it sets what every process of the instance shares (DAGSTER_EVENT_BATCH_SIZE)
    return {**settings.resolved_environment(), "DAGSTER_HOME": str(home)}


def cmd_ui(args) -> int:
    """The webserver and the daemon on loopback, on the CLI's instance and environment, over this
    kts's code location (a code server of its own) or the workspace file given."""
    from kts_assets import broker_scope
    from kts_resources import settings

    env = _environment()
    with tempfile.TemporaryDirectory(prefix="kts-ui-") as scratch:
        services = _Services(env)
        if args.workspace is not None:
            if not args.workspace.is_file():
                raise CommandError(f"{args.workspace}: no such workspace file", EXIT_USAGE)
            workspace = args.workspace.absolute()
            loads = f"the code locations of {workspace}"
        else:
            location = broker_scope.current().location_name
            # One code server, which the webserver and the daemon share: each would otherwise start
            # its own, importing Dagster, PySpark and kts again (what `dagster dev` avoids with a
            # proxy server and a child, two processes more).
            code_socket = Path(scratch) / "code.sock"
            workspace = Path(scratch) / "workspace.yaml"
            workspace.write_text(f"load_from:\n  - grpc_server:\n      socket: {code_socket}\n"
                                 f"      location_name: {location}\n")
            loads = f"location {location}, {settings.HOME}={env[settings.HOME]}, {settings.LOG_DIRS}={env[settings.LOG_DIRS]}"
        print(f"kts ui: http://127.0.0.1:{args.port} (DAGSTER_HOME={env['DAGSTER_HOME']}, {loads}); Ctrl-C stops it",
              file=sys.stderr, flush=True)
        bin_dir = Path(sys.executable).parent
        webserver_args = ["-w", str(workspace), "-h", "127.0.0.1", "-p", str(args.port)]
        with services:
            if args.workspace is None:
                services.start([str(bin_dir / "dagster"), "api", "grpc", "-m", DEFINITIONS_MODULE, "--location-name", location,
                                "--socket", str(code_socket)])
                # Side by side with the code server's start: the webserver's imports (half its
                # start-up), then its start once the code server listens — it loads the location
                # once, as it starts, and from a server not yet listening would show a load error.
                services.start([sys.executable, "-m", __name__, str(code_socket), *webserver_args])
            else:
                services.start([str(bin_dir / "dagster-webserver"), *webserver_args])
            # The daemon (sensors, schedules, the run queue) after the first page: its start-up, and
            # its sensors' first ticks, would compete for the CPUs with the webserver's.
            if services.wait(lambda: _serves(args.port)):
                services.start([str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)])
                services.wait(lambda: False)
        return services.status


def _webserver_once_listening(code_socket: Path, webserver_args: list[str]) -> None:
    """Dagster's webserver, imported now and started once the code server listens on ``code_socket``."""
    from dagster_webserver.cli import main  # the installed `dagster-webserver`

    while not _accepts(code_socket):
        time.sleep(0.1)  # `kts ui` stops this process if the code server exits instead
    sys.argv = ["dagster-webserver", *webserver_args]
    main()


def _accepts(path: Path) -> bool:
    """Whether a server listens on the Unix socket ``path``."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False


def _serves(port: int) -> bool:
    """Whether the webserver on 127.0.0.1:``port`` answers its first page."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/server_info")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def cmd_code_server(args) -> int:
    """`dagster code-server start` of this kts's code location, named as ``broker_scope`` names it;
    says the workspace entry that loads it."""
    from kts_assets import broker_scope
    from kts_resources import settings

    env = _environment()
    location = broker_scope.current().location_name
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "code-server", "start", "-m", DEFINITIONS_MODULE, "--location-name", location,
               "-h", args.host, "-p", str(args.port)]
    reach = socket.getfqdn() if args.host in ("0.0.0.0", "::", "") else args.host
    probe = "127.0.0.1" if args.host in ("0.0.0.0", "") else "::1" if args.host == "::" else args.host

    def serving() -> None:
        # Said once the port answers: a webserver that loads the entry earlier shows the location
        # failed until someone reloads it (a launch from it then fails).
        print(f"kts code-server: location {location} on {args.host}:{args.port} ({settings.HOME}={env[settings.HOME]}, "
              f"{settings.LOG_DIRS}={env[settings.LOG_DIRS]}); its workspace entry: "
              f"- grpc_server: {{host: {reach}, port: {args.port}, location_name: {location}}}; Ctrl-C stops it",
              file=sys.stderr, flush=True)

    return _run_until_stopped(command, env, ready=lambda: _port_accepts(probe, args.port), then=serving)


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _run_until_stopped(command: list[str], env: dict[str, str], *, ready=lambda: False, then=lambda: None) -> int:
    """Run ``command`` until it exits (its status) or this process gets SIGINT/SIGTERM (then 0);
    ``then()`` once ``ready()``."""
    with _Services(env) as services:
        services.start(command)
        if services.wait(ready):
            then()
            services.wait(lambda: False)
    return services.status


class _Services:
    """Dagster's processes of one command, in one process group of their own, until one exits (its
    status is the command's) or this process gets SIGINT/SIGTERM: then each is asked to stop, and
    after UI_STOP_GRACE_S the group is killed (status 0)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.processes: list[subprocess.Popen] = []
        self.stopping: int | None = None
        self.status = 0

    def __enter__(self) -> "_Services":
        # Handlers first: a signal caught here is default again in the children, while one this
        # process was started ignoring (SIGINT under `nohup` or a script's `&`) would stay ignored in
        # them.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop_on)
        return self

    def _stop_on(self, signum, _frame) -> None:
        self.stopping = signum
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def start(self, command: list[str]) -> None:
        # One group, not this process's: a Ctrl-C at the terminal reaches this process only, which
        # stops them in order (SIGINT straight to the group would leave none to stop the rest).
        group = self.processes[0].pid if self.processes else 0
        self.processes.append(subprocess.Popen(command, env=self.env, cwd=REPO_ROOT if REPO_ROOT.is_dir() else None,
                                               process_group=group))
        if self.stopping is not None:  # asked to stop while it was starting
            self.processes[-1].send_signal(signal.SIGTERM)

    def wait(self, ready) -> bool:
        """Until ``ready()`` (True), or a process exits or a stop is asked for (False)."""
        while self.stopping is None:
            for process in self.processes:
                if process.poll() is not None:
                    self.status = process.returncode
                    return False
            if ready():
                return True
            time.sleep(0.25)
        return False

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):  # the daemon and the webserver before the code server they use
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        give_up_at = time.monotonic() + UI_STOP_GRACE_S
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, give_up_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if self.processes:
            try:
                os.killpg(self.processes[0].pid, signal.SIGKILL)  # anything of the group that outlived them
            except ProcessLookupError:
                pass
            for process in self.processes:
                process.wait()
        if self.stopping is not None:
            self.status = 0


if __name__ == "__main__":  # `kts ui`'s webserver process
    _webserver_once_listening(Path(sys.argv[1]), sys.argv[2:])
