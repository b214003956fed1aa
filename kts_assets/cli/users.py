"""`kts users add|delete|list`: the users `kts serve --sasl SCRAM-SHA-256` authenticates, kept in
the metadata store as salted SCRAM credentials (kts_resources/metadata/credentials.py), never as
passwords. A password is asked for at a terminal (twice), else read as the first line of stdin:
never from the command line, where other users' `ps` would see it."""

from __future__ import annotations

import sys

from kts_assets.cli.common import EXIT_USAGE, CommandError, print_json, print_table
from kts_assets.cli.environment import metadata_store


def _password(user: str) -> str:
    import getpass

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {user}: ")
        if getpass.getpass(f"password for {user}, again: ") != password:
            raise CommandError("the two passwords differ; nothing changed", EXIT_USAGE)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CommandError("an empty password (a terminal prompts for it; otherwise it is stdin's first line)", EXIT_USAGE)
    return password


def cmd_users_add(args) -> int:
    from kts_resources.metadata.credentials import ScramCredentials, user_name_problem
    from kts_resources.serving import scram

    problem = user_name_problem(args.name)
    if problem is not None:
        raise CommandError(problem, EXIT_USAGE)
    if not scram.MIN_ITERATIONS <= args.iterations <= scram.MAX_ITERATIONS:
        raise CommandError(f"--iterations {args.iterations}: {scram.MECHANISM} takes {scram.MIN_ITERATIONS} to "
                           f"{scram.MAX_ITERATIONS}", EXIT_USAGE)
    credential = scram.credential(_password(args.name), iterations=args.iterations)
    store = metadata_store()
    try:
        added = ScramCredentials(store.engine).put(args.name, scram.MECHANISM, credential)
    finally:
        store.close()
    print(f"{args.name}: {'added' if added else 'password changed'} ({scram.MECHANISM}, {args.iterations} iterations)")
    return 0


def cmd_users_delete(args) -> int:
    from kts_resources.metadata.credentials import ScramCredentials

    store = metadata_store()
    try:
        deleted = ScramCredentials(store.engine).delete(args.name)
    finally:
        store.close()
    if not deleted:
        raise CommandError(f"no user {args.name!r}")
    print(f"{args.name}: deleted; its next login is refused (connections already authenticated stay open)")
    return 0


def cmd_users_list(args) -> int:
    from kts_resources.metadata.credentials import ScramCredentials

    store = metadata_store()
    try:
        users = ScramCredentials(store.engine).users()
    finally:
        store.close()
    rows = [{"user": u.name, "mechanism": u.mechanism, "iterations": u.iterations,
             "updated_at": u.updated_at.isoformat(timespec="seconds")} for u in users]
    if args.json:
        print_json(rows)
    elif rows:
        print_table(rows, ["user", "mechanism", "iterations", "updated_at"])
    else:
        print("no users (`kts users add NAME` adds one)")
    return 0


def add_users_parser(sub) -> None:
    p = sub.add_parser("users", help="the users `kts serve --sasl SCRAM-SHA-256` authenticates (salted SCRAM credentials "
                                     "in the metadata store)")
    users = p.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users.add_parser("add", help="add a user, or change its password (asked at a terminal, else stdin's first line)")
    add.add_argument("name")
    add.add_argument("--iterations", type=int, default=4096, help="SCRAM iterations, 4096 to 16384 (default 4096)")
    add.set_defaults(func=cmd_users_add)
    delete = users.add_parser("delete", help="delete a user")
    delete.add_argument("name")
    delete.set_defaults(func=cmd_users_delete)
    listing = users.add_parser("list", help="the users, their mechanism and iterations (never a password)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_users_list)
