"""The ``kts`` command line, run in this process: the parser (each command module adds its
subcommands), the one line and exit status for an error, and :func:`run_here`.

Bad input gets one line on stderr naming the file and byte position, and a non-zero exit: 1 for
findings in the data, 2 for a command used wrongly. Heavy modules (dagster, pyspark, boto3) are
imported only by the commands that need them, so inspection commands start fast. Where a command
runs (here, or a sync in the standing CLI server) is :mod:`kts_assets.cli.entry`'s choice.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Sequence

from kts_assets.cli import admin, dagster_ui, groups, inspection, maintenance, read, serve, services, sync, users
from kts_assets.cli.common import EXIT_FINDINGS, EXIT_USAGE, CommandError, leaving_without_teardown, report
from kts_resources.kafka.errors import KafkaFormatError, os_error_line


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the ``command`` about to run, only its options are described
    where describing them costs an import (`kts simulate`'s come from the simulator's config, a
    tenth of a second of every other command's start)."""
    parser = argparse.ArgumentParser(prog="kts", description="Kafka tiered storage, orchestrated by Dagster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order `kts --help` lists them.
    inspection.add_inspection_parsers(sub, simulate_options=command in (None, "simulate"))
    admin.add_config_parser(sub)
    read.add_read_parsers(sub)
    serve.add_serve_parser(sub)
    users.add_users_parser(sub)
    groups.add_groups_parser(sub)
    admin.add_admin_parsers(sub)
    maintenance.add_maintenance_parsers(sub)
    services.add_services_parser(sub)
    sync.add_sync_parser(sub)
    dagster_ui.add_dagster_parsers(sub)
    sync.add_status_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    # Library warnings (a retried connection, a deferred clean-up) stay quiet unless asked for:
    # the command's own outcome is the one line a user reads.
    from kts_resources import settings

    try:
        level = settings.log_level("ERROR")
    except ValueError as e:  # KTS_LOG_LEVEL=BOGUS: the environment is used wrongly
        report([str(e)])
        return EXIT_USAGE
    logging.basicConfig(level=level, format="kts: %(levelname)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()
        return status
    except CommandError as e:
        report([str(e)])
        return e.status
    except KafkaFormatError as e:
        report([str(e)])
        return EXIT_FINDINGS
    except BrokenPipeError:
        # `kts dump ... | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ConnectionError as e:  # the metadata store or the remote tier cannot be reached
        report([str(e)])
        return EXIT_FINDINGS
    except OSError as e:  # a path kts cannot read or write: read-only, full, a symbolic link loop, ...
        report([os_error_line(e)])
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if isinstance(e, _expected_errors()):
            report([(str(e).strip() or type(e).__name__).splitlines()[0]])
            return EXIT_FINDINGS
        gone = _store_went_away(e)
        if gone is not None:
            report([gone])
            return EXIT_FINDINGS
        raise


def _store_went_away(e: BaseException) -> str | None:
    """The line for a connection to the metadata store lost mid-command that reached the top
    unretried (a driver error, not MetadataStoreUnavailable); None for any other error."""
    if "sqlalchemy" not in sys.modules and "psycopg2" not in sys.modules:
        return None  # neither was used: it cannot be theirs
    from sqlalchemy.exc import DBAPIError

    from kts_resources.metadata import database

    try:
        import psycopg2
        raw = isinstance(e, psycopg2.OperationalError) and getattr(e, "pgcode", None) is None
    except ImportError:
        raw = False
    if not raw and not (isinstance(e, DBAPIError) and database.is_connection_error(e)):
        return None
    return f"metadata store at {_store_location()} went away: {database._first_line(e)}"


def _store_location() -> str:
    """``host:port/database`` of the store this command used, never the password, and without
    starting the embedded server to find out."""
    from kts_resources import settings
    from kts_resources.metadata import database, embedded

    try:
        configured = settings.database_url()
        if configured:
            return database.describe_url(database.normalize_url(configured))
        server = embedded.recorded()
        return database.describe_url(server.url) if server is not None else f"{embedded.server_home()} (embedded)"
    except Exception:  # noqa: BLE001 - only a location for a message
        return "(unknown)"


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Errors a user meets through no bug of kts (a store down, a lock held, a bad setting): one line."""
    from kts_assets.broker_scope import BrokerScopeError
    from kts_resources.metadata.store import PartitionLockTimeout
    from kts_resources.remote_storage.base import RemoteStorageError

    return (RemoteStorageError, PartitionLockTimeout, TimeoutError, BrokerScopeError)


def run_here(argv: Sequence[str] | None = None) -> None:
    """The command in this process, then the process's exit with its status."""
    # CPython collects generation 0 every 700 allocations by default; importing Dagster, PySpark and
    # SQLAlchemy makes millions, so a command spent a fifth of its start-up in the collector.
    gc.set_threshold(50_000, 20, 20)
    status = main(argv)
    if leaving_without_teardown():
        from kts_assets.sync import exit_now

        exit_now(status)
    sys.exit(status)
