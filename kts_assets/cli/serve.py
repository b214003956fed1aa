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
    from kts_resources.serving import stats
    from kts_resources.serving.server import KafkaReadServer

    if args.status:
        return _print_status(args)
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

    writing: list[asyncio.Task] = []  # held: the loop keeps only a weak reference to a task

    def listening(bound_host: str, bound_port: int, adv: tuple[str, int]) -> None:
        serve_state.record_this_process(home, bound_host, bound_port, f"{adv[0]}:{adv[1]}")
        writing.append(asyncio.get_running_loop().create_task(stats.write_every(home, server.side.stats)))
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
            if server.side is not None:  # the last counters, for `kts serve --status` after the stop
                stats.write(home, server.side.stats, running=False)
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


def _print_status(args) -> int:
    """``kts serve --status``: whether this KTS_HOME's `kts serve` runs, and its counters (the
    stats file it rewrites every few seconds, or the last one a stopped server left)."""
    from kts_assets.cli.common import print_json, print_table
    from kts_resources import settings
    from kts_resources.servers import serve_state
    from kts_resources.serving import stats

    home = serve_state.state_dir(settings.kts_home())
    server = serve_state.running(home)
    counters = stats.read(home)
    if args.json:
        print_json({"running": server is not None, "pid": server.pid if server else None,
                    "listen": f"{server.host}:{server.port}" if server else None,
                    "advertised": server.advertised if server else None, "stats": counters})
        return 0
    print(f"kts serve: running (pid {server.pid}) on {server.host}:{server.port}, advertised as {server.advertised}"
          if server is not None else "kts serve: not running")
    if counters is None:
        print("no stats yet (kts serve has not run for this KTS_HOME)")
        return 0
    print(status_lines(counters, running=server is not None))
    apis = sorted(set(counters["requests"]) | set(counters["errors"]))
    print_table([{"api": a, "requests": counters["requests"].get(a, 0), "errors": counters["errors"].get(a, 0)} for a in apis],
                ["api", "requests", "errors"])
    return 0


def status_lines(counters: dict, *, running: bool) -> str:
    """The counters other than per API, as `kts serve --status` prints them."""
    import time

    mib = 1024 * 1024
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(counters["started"]))
    age = time.time() - counters["written"]
    return "\n".join([
        f"stats of the server started {started}, written {age:.0f} s ago" + ("" if running else " (its last, at its stop)"),
        f"bytes served      {counters['bytes_served'] / mib:.1f} MiB (remote tier {counters['remote_bytes'] / mib:.1f}, "
        f"local log {counters['local_bytes'] / mib:.1f})",
        f"throttle time     {counters['throttle_time_ms']} ms",
        f"malformed frames  {counters['malformed_frames']}"])


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
    p.add_argument("--status", action="store_true",
                   help="do not serve: say whether kts serve runs for this KTS_HOME and print its counters (requests, "
                        "bytes served from each tier, throttle time, errors per API)")
    p.add_argument("--json", action="store_true", help="with --status: print JSON")
    p.set_defaults(func=cmd_serve)
