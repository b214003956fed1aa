"""``kts``, the installed command: a sync runs in the standing CLI server of KTS_HOME
(:mod:`kts_assets.cli.server`), every other command (and a sync with KTS_CLI_SERVER=off) in this
process (:func:`kts_assets.cli.main.run_here`, which the server's children run too)."""

from __future__ import annotations

import sys
from typing import Sequence

from kts_assets.cli.common import EXIT_FINDINGS, report

# Commands run in the standing CLI server unless KTS_CLI_SERVER=off: the ones that run Dagster
# jobs, whose imports are most of their start-up.
SERVED_COMMANDS = ("sync",)


def entry_point(argv: Sequence[str] | None = None) -> None:
    """``kts``: a sync runs in the standing CLI server of KTS_HOME, every other command (and a
    sync with KTS_CLI_SERVER=off) in this process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in SERVED_COMMANDS:
        status = _in_cli_server(args)
        if status is not None:
            sys.exit(status)
    from kts_assets.cli.main import run_here

    run_here(args)


def _in_cli_server(args: list[str]) -> int | None:
    """The command's exit status from the CLI server; None when it is to run in this process
    (switched off, or a server that cannot be started: said in one line, then run here)."""
    from kts_assets.cli import server as cli_server
    from kts_resources import settings

    try:
        if not settings.cli_server_enabled():
            return None
    except ValueError as e:  # KTS_CLI_SERVER is neither on nor off
        report([str(e)])
        return EXIT_FINDINGS
    try:
        return cli_server.run_command(cli_server.state_dir(settings.kts_home()), args)
    except (cli_server.CliServerError, OSError) as e:
        report([f"{e}; running the command in this process"])
        return None
