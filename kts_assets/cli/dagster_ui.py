"""`kts ui` and `kts code-server`: Dagster's servers on the instance and environment the CLI uses.

- ``kts ui``: the webserver and the daemon (``dagster dev``), loopback only. Alone it loads this kts's
  code location itself; with ``--workspace`` it loads the code locations a workspace file names —
  beside a cluster, every broker's ``kts code-server`` — and is the one webserver and daemon of them.
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
import time
from pathlib import Path

from kts_assets.broker_scope import DEFINITIONS_MODULE
from kts_assets.cli.common import EXIT_USAGE, CommandError, bounded
from kts_assets.instance import REPO_ROOT, dagster_home

# How long `kts ui` / `kts code-server` wait for Dagster's process to stop its servers after
# SIGINT/SIGTERM before killing them.
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

    return {**settings.resolved_environment(), "DAGSTER_HOME": str(dagster_home())}


def _own_workspace(location_name: str) -> Path:
    """A workspace of this kts's one code location: the repo's workspace.yaml for the plain
    location in a source checkout, else one written under KTS_HOME (an installed kts, or a broker's
    location beside a cluster, whose name the sensors' stored state is found by)."""
    from kts_assets.broker_scope import PLAIN_LOCATION
    from kts_resources import settings
    from kts_resources.private_dirs import make_dirs

    repo_workspace = REPO_ROOT / "workspace.yaml"
    if location_name == PLAIN_LOCATION and repo_workspace.is_file():
        return repo_workspace
    home = settings.kts_home()
    make_dirs(home)
    workspace = home / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: {DEFINITIONS_MODULE}\n"
                         f"      location_name: {location_name}\n")
    return workspace


def cmd_ui(args) -> int:
    """`dagster dev` (webserver + daemon) on loopback, on the CLI's instance and environment, over
    this kts's code location or the workspace file given."""
    from kts_assets import broker_scope
    from kts_resources import settings

    env = _environment()
    if args.workspace is not None:
        if not args.workspace.is_file():
            raise CommandError(f"{args.workspace}: no such workspace file", EXIT_USAGE)
        workspace = args.workspace.absolute()
        loads = f"the code locations of {workspace}"
    else:
        location = broker_scope.current().location_name
        workspace = _own_workspace(location)
        loads = f"location {location}, {settings.HOME}={env[settings.HOME]}, {settings.LOG_DIRS}={env[settings.LOG_DIRS]}"
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(args.port)]
    print(f"kts ui: http://127.0.0.1:{args.port} (DAGSTER_HOME={env['DAGSTER_HOME']}, {loads}); Ctrl-C stops it",
          file=sys.stderr, flush=True)
    return _run_until_stopped(command, env)


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
    print(f"kts code-server: location {location} on {args.host}:{args.port} ({settings.HOME}={env[settings.HOME]}, "
          f"{settings.LOG_DIRS}={env[settings.LOG_DIRS]}); its workspace entry: "
          f"- grpc_server: {{host: {reach}, port: {args.port}, location_name: {location}}}; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    return _run_until_stopped(command, env)


def _run_until_stopped(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` in a process group of its own until it exits (its status) or this process
    gets SIGINT/SIGTERM: then it is asked to stop, and after UI_STOP_GRACE_S its group is killed (0)."""
    stopping = {"signal": None}
    started: list = []

    def forward(signum, _frame) -> None:
        stopping["signal"] = signum
        if started:
            started[0].send_signal(signal.SIGTERM)  # Dagster's process stops the servers it started

    # Handlers first: a signal caught here is default again in the child, while one this process
    # was started ignoring (SIGINT under `nohup` or a script's `&`) would stay ignored in dagster dev
    # and its webserver and daemon, which dagster dev stops with SIGINT: they would never stop.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    server = subprocess.Popen(command, env=env, cwd=REPO_ROOT if REPO_ROOT.is_dir() else None, start_new_session=True)
    started.append(server)
    if stopping["signal"] is not None:  # asked to stop while it was starting
        server.send_signal(signal.SIGTERM)
    give_up_at = None
    while True:
        try:
            status = server.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if stopping["signal"] is not None:
                give_up_at = give_up_at or time.monotonic() + UI_STOP_GRACE_S
                if time.monotonic() > give_up_at:
                    break  # asked to stop and still not gone: the group is killed below
    if stopping["signal"] is not None:
        try:
            os.killpg(server.pid, signal.SIGKILL)  # anything of its group that outlived it
        except ProcessLookupError:
            pass
        server.wait()
        return 0
    return status
