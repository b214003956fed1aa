"""`kts services` and `kts spark`: the servers a KTS_HOME started (the embedded PostgreSQL, Spark
Connect, the CLI server), or with ``--all`` every kts server of this account; `stop` stops them."""

from __future__ import annotations

import sys
from pathlib import Path

from kts_assets.cli.common import print_json, print_table


def cmd_services(args) -> int:
    from kts_resources.servers.services import services, stop_services
    from kts_resources.settings import kts_home

    if getattr(args, "all", False):
        return _services_of_machine(args)
    if getattr(args, "under", None) is not None:
        print("kts: services: --under needs --all", file=sys.stderr)
        return 2
    home = kts_home()
    only = getattr(args, "only", None)
    what = f"embedded {only} server" if only else "embedded server"
    if args.services_command == "stop":
        stopped = stop_services(home, only)
        # Stopping what is not running is no error: the goal, nothing running, holds.
        print(f"stopped {', '.join(stopped)} of {home}" if stopped else f"no {what} of {home} is running")
        return 0
    found = services(home, only)
    if args.json:
        print_json([s.as_json() for s in found])
    elif found:
        print_table([{**s.as_json(), "pid": s.pid if s.pid is not None else "-", "port": s.port if s.port is not None else "-"}
                     for s in found], ["kind", "state", "pid", "port", "data_dir"])
    else:
        print(f"no {what} of {home} is running")
    return 0


def _services_of_machine(args) -> int:
    """``kts services [stop] --all [--under DIR]``: every kts server of this account, orphans included."""
    from kts_resources.servers.services import STOPPED, machine_servers, stop_machine_servers

    under = Path(args.under).absolute() if args.under is not None else None
    where = f" with a KTS_HOME under {under}" if under is not None else ""
    found = machine_servers(under)
    if args.services_command == "stop":
        done = stop_machine_servers(found)
        for s in done:
            if s.state == STOPPED:
                print(f"removed the orphaned cluster {s.data_dir.parent}")
            else:
                print(f"stopped {s.kind} (pid {s.pid}) of {s.kts_home or 'an unknown KTS_HOME'}{' (orphan)' if s.orphan else ''}")
        if not done:
            print(f"no kts server of this account{where} is running")
        return 0
    if args.json:
        print_json([s.as_json() for s in found])
    elif found:
        print_table([{key: ("-" if value is None else value) for key, value in s.as_json().items()} for s in found],
                    ["kind", "state", "pid", "port", "orphan", "kts_home", "data_dir"])
    else:
        print(f"no kts server of this account{where} is running")
    return 0


def add_services_parser(sub) -> None:
    p = sub.add_parser("services", help="the servers (PostgreSQL, Spark Connect, the CLI server, kts serve) of this KTS_HOME "
                                        "(with --all: of every KTS_HOME); `stop` stops them")
    p.add_argument("services_command", nargs="?", choices=["list", "stop"], default="list", metavar="stop",
                   help="stop the embedded servers this KTS_HOME started (they run until then)")
    p.add_argument("--all", action="store_true",
                   help="every kts server of this account, whichever KTS_HOME started it, orphans (KTS_HOME gone) "
                        "included, and under root every cluster in /var/lib/kts/postgres; `stop --all` also "
                        "removes the orphaned clusters")
    p.add_argument("--under", metavar="DIR", help="with --all: only the servers whose KTS_HOME lies under DIR")
    p.add_argument("--json", action="store_true", help="print JSON (one object per server)")
    p.set_defaults(func=cmd_services)
    p = sub.add_parser("spark", help="the embedded Spark Connect server of this KTS_HOME: `status` (the default) or `stop`")
    p.add_argument("services_command", nargs="?", choices=["status", "stop"], default="status", metavar="status|stop",
                   help="show it, or stop it and its Python workers (the next process needing Spark starts a fresh one)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_services, only="spark-connect")
