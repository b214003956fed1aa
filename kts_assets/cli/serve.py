"""`kts serve`: the tiered log over the Kafka protocol, read-only, as one node leading every
partition kts knows (kts_resources/serving/). It runs until SIGTERM or Ctrl-C; `kts services`
lists it and `kts services stop` stops it."""

from __future__ import annotations

import errno
import socket

from kts_assets.cli.common import EXIT_USAGE, CommandError

DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise
DEFAULT_PORT = 9092  # Kafka's; when taken, a free loopback port (said on stderr)


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CommandError(f"{what} {text!r} is not HOST:PORT (a port from 0 to 65535)", EXIT_USAGE)
    return host.strip("[]"), int(port)


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def cmd_serve(args) -> int:
    import asyncio
    import logging
    import sys

    from kts_assets.cli.read import _reader
    from kts_resources import settings
    from kts_resources.servers import serve_state
    from kts_resources.serving.server import KafkaReadServer

    if args.listen is not None:
        host, port = parse_address(args.listen, "--listen")
    else:
        host, port = DEFAULT_HOST, DEFAULT_PORT
        if _port_taken(host, port):
            print(f"kts serve: {host}:{port} is taken; listening on a free loopback port instead "
                  "(--listen HOST:PORT picks one)", file=sys.stderr)
            port = 0
    advertised = parse_address(args.advertised, "--advertised") if args.advertised is not None else None
    tls = _tls_context(args)
    for option, value in (("--max-connections", args.max_connections), ("--fetch-budget-mib", args.fetch_budget_mib)):
        if value is not None and value < 1:
            raise CommandError(f"{option} {value}: at least 1", EXIT_USAGE)
    home = serve_state.state_dir(settings.kts_home())
    already = serve_state.running(home)
    if already is not None:
        raise CommandError(f"kts serve already runs for this KTS_HOME (pid {already.pid}, {already.host}:{already.port}); "
                           "`kts services stop` stops it")
    # The server's own lines (a refused write, a malformed frame) are part of what it says.
    logging.getLogger("kts_resources.serving").setLevel(min(logging.INFO, logging.getLogger().level))

    def listening(bound_host: str, bound_port: int, adv: tuple[str, int]) -> None:
        serve_state.record_this_process(home, bound_host, bound_port, f"{adv[0]}:{adv[1]}")
        protocol = ("SASL_SSL" if tls else "SASL_PLAINTEXT") if args.sasl else ("SSL" if tls else "PLAINTEXT")
        print(f"kts serve: listening on {bound_host}:{bound_port}, advertised as {adv[0]}:{adv[1]} ({protocol})", flush=True)

    with _reader() as reader:
        sasl_lookup = None
        if args.sasl is not None:
            from kts_resources.metadata.credentials import ScramCredentials

            credentials = ScramCredentials(reader.store.engine)
            sasl_lookup = credentials.get
            if not credentials.users():
                print("kts serve: SASL is on and no user is known yet (`kts users add NAME` adds one)", file=sys.stderr)
        limits = {} if args.max_connections is None else {"max_connections": args.max_connections}
        if args.fetch_budget_mib is not None:
            limits["fetch_budget_bytes"] = args.fetch_budget_mib * 1024 * 1024
        server = KafkaReadServer(reader, host, port, advertised, tls=tls, sasl_lookup=sasl_lookup, **limits)
        try:
            asyncio.run(server.run(listening))
        except OSError as e:
            raise CommandError(f"kts serve: cannot listen on {host}:{port}: {e.strerror or e}") from None
        finally:
            serve_state.forget_this_process(home)
    print("kts serve: stopped", flush=True)
    return 0


def _tls_context(args):
    """The server's TLS context from --tls-cert and --tls-key (both or neither), or None."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together (the certificate chain and its private key, PEM)", EXIT_USAGE)
    if args.tls_cert is None:
        return None
    from pathlib import Path

    from kts_resources.serving.tls import TlsConfigError, server_context

    try:
        return server_context(Path(args.tls_cert).expanduser(), Path(args.tls_key).expanduser())
    except TlsConfigError as e:
        raise CommandError(f"kts serve: {e}", EXIT_USAGE) from None


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the tiered log over the Kafka protocol (read-only) until stopped")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"where to listen (default {DEFAULT_HOST}:{DEFAULT_PORT}, or a free loopback port when that is taken; "
                        "port 0: any free port)")
    p.add_argument("--advertised", metavar="HOST:PORT",
                   help="the address Metadata gives clients (default: the one listened on)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS: the server's certificate chain (clients use security.protocol SSL "
                                                     "or SASL_SSL); with --tls-key")
    p.add_argument("--tls-key", metavar="PEM", help="TLS: the certificate's private key (unencrypted PEM)")
    p.add_argument("--sasl", choices=["SCRAM-SHA-256"], type=str.upper,
                   help="require SASL authentication with this mechanism against the users of `kts users`")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="connections served at once; one more is closed as it arrives (default 1000)")
    p.add_argument("--fetch-budget-mib", type=int, metavar="MIB",
                   help="memory every connection's fetch responses may hold together, in MiB (default 128)")
    p.set_defaults(func=cmd_serve)
