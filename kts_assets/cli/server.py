"""The standing CLI server of a ``KTS_HOME``: a process with kts, Dagster and PySpark already
imported that runs each ``kts sync`` in a child it forks, so a sync stops paying the ~2.5–4 s of
imports every fresh Python process pays before its first event (the Spark Connect server spared
it the JVM; this spares it the interpreter).

Like the embedded Spark Connect server, on the servers' one lifecycle
(``kts_resources.servers.lifecycle``): started by the first ``kts sync`` that finds none, reused by
later ones, state under ``KTS_HOME/cli-server`` (``server.json``, ``server.log``), a start lock so
concurrent first starts share one server, listed and stopped by ``kts services`` as one more
service kind (``kts_resources.servers.cli_server_state`` holds what that needs). ``KTS_CLI_SERVER=off``
runs every command in its own process, as before.

What a command sees is what it would see run in its own process: the child takes the client's
arguments, environment, working directory and its stdin/stdout/stderr themselves (passed over a
Unix socket), and the client exits with the child's status. SIGINT/SIGTERM/SIGHUP to the client
go to the child (a sync cancels its run, as in its own process); a client that dies (SIGKILL)
closes its connection and the child gets SIGTERM; a server that dies takes its children with it
(PR_SET_PDEATHSIG) and the client says so and exits 1. A server whose code on disk has changed
since it started (an upgrade, an edit) is not used: it is stopped and a fresh one started.

The socket is in Linux's abstract namespace (no path-length limit, nothing left on disk), so the
server accepts a connection only from its own user (SO_PEERCRED).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from kts_resources.servers import lifecycle
# The server's state and stopping it are the lifecycle's; tests, benches and the CLI use them from here too.
from kts_resources.servers.cli_server_state import (LOG_FILE, SERVER_MODULE, STATE_DIR, STOP_GRACE_S, CliServer,  # noqa: F401
                                                    recorded, running, state_dir, stop)
from kts_resources.servers.cli_server_state import end as _stop_pid
from kts_resources.servers.home_watch import home_gone

# A server with no command for this long exits (it holds ~300 MB; the next sync starts another).
IDLE_EXIT_S = 30 * 60
START_TIMEOUT_S = 120
# A client has this long after connecting to send its request; until it arrives the connection
# waits in the loop beside the others, so a stalled one delays nobody's command.
REQUEST_TIMEOUT_S = 10
# Modules the server imports before it serves: everything a sync imports before its first event.
PRELOAD = ("kts_assets.cli.main", "kts_assets.definitions", "kts_assets.sync", "kts_assets.run_hygiene",
           "kts_assets.sensors.roll", "kts_resources.tiering.partition_admin", "pyspark.sql.connect.session",
           "pyarrow.parquet", "psycopg2", "kts_resources.dagster_storage")
_LENGTH = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


class CliServerError(RuntimeError):
    """The server could not be started or reached; the message says where to look."""


def code_fingerprint() -> str:
    """What the code this process would run is: the interpreter, the installed packages (pip
    touches site-packages), every file of kts's two packages (path, size, modification time), and
    what names its Definitions take (a broker's, with KTS_DAGSTER_PER_BROKER: the server imported
    them under its first client's environment) and the steps' retry delay they hold. Stat calls
    only: a client computes it in a few milliseconds before every command."""
    import kts_assets
    import kts_resources
    from kts_resources import settings

    digest = hashlib.sha256()
    digest.update(f"{sys.executable}\0{sys.version}\0{os.environ.get('PYTHONPATH', '')}\0".encode())
    digest.update(f"{settings.dagster_scope_inputs()!r}\0{settings.step_retry_delay_s()!r}\0".encode())
    for entry in sys.path:
        if entry.endswith("site-packages"):
            try:
                digest.update(f"{entry}:{os.stat(entry).st_mtime_ns}\0".encode())
            except OSError:
                pass
    for package in (kts_assets, kts_resources):
        root = Path(package.__file__).resolve().parent
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(directory, name))
                    digest.update(f"{directory}/{name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:32]


def _connect(server: CliServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + server.address)
    except OSError:
        sock.close()
        raise
    return sock


def ensure_running(home: Path, fingerprint: str) -> CliServer:
    """The server of ``home`` running this very code, started (or replaced) if need be. The lock
    makes concurrent first starts share one server."""

    def current() -> CliServer | None:
        server = running(home)
        return server if server is not None and server.fingerprint == fingerprint else None

    def replace() -> CliServer:
        server = running(home)
        if server is not None:  # older code than the client's: it must not run this command
            _stop_pid(server)
        lifecycle.clear_state(home)
        return _start(home, fingerprint)

    return lifecycle.ensure_started(home, current, replace)


def _start(home: Path, fingerprint: str) -> CliServer:
    log = open(home / LOG_FILE, "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, "serve", str(home.resolve())],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
                                # Its own directory, not the first client's: that one may go, and
                                # `-m` puts it first on sys.path.
                                cwd=home, env={**os.environ, **SERVER_ENVIRONMENT})
    finally:
        log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server = recorded(home)
        if server is not None and server.pid == proc.pid:
            if server.fingerprint != fingerprint:
                _stop_pid(server)
                raise CliServerError(f"the CLI server started under {home} runs other code than this kts "
                                     f"(files changed while it started); see {home / LOG_FILE}")
            return server
        if proc.poll() is not None:
            raise CliServerError(f"the CLI server under {home} exited {proc.returncode} while starting; see {home / LOG_FILE}")
        time.sleep(0.05)
    _stop_pid(CliServer(home, proc.pid, "", ""))
    raise CliServerError(f"the CLI server under {home} did not start in {START_TIMEOUT_S} s; see {home / LOG_FILE}")


# -- the client -----------------------------------------------------------------------------------


def run_command(home: Path, argv: list[str]) -> int:
    """Run ``kts argv`` in ``home``'s server (started if need be) with this process's arguments,
    environment, working directory and standard streams; the command's exit status."""
    fingerprint = code_fingerprint()
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fingerprint": fingerprint}).encode()
    for attempt in (1, 2):
        server = ensure_running(home, fingerprint)
        try:
            sock = _connect(server)
        except OSError:
            continue  # gone between the check and the call (stopped, idle exit): once more, fresh
        with sock:
            socket.send_fds(sock, [_LENGTH.pack(len(request)) + request], [0, 1, 2])
            forwarded = {signum: signal.signal(signum, lambda n, _f: _send(sock, {"signal": n}))
                         for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
            try:
                reply = _read_message(sock)
                if reply is None and attempt == 1:
                    # The server went before it started the command (an idle exit racing this
                    # request): nothing ran, so asking a fresh server is safe.
                    continue
                if reply is not None and "started" in reply:
                    reply = _read_message(sock)
            finally:
                for signum, handler in forwarded.items():
                    signal.signal(signum, handler)
        break
    else:
        raise CliServerError(f"the CLI server under {home} accepted no connection; see {home / LOG_FILE}")
    if reply is None:
        print(f"kts: the CLI server (pid {server.pid}) ended before the command did; its log is {server.log}, "
              "and a sync's run is in the Dagster UI", file=sys.stderr)
        return 1
    if "error" in reply:
        print(f"kts: {reply['error']}", file=sys.stderr)
        return 1
    code = int(reply["exit"])
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    try:
        sock.sendall(_LENGTH.pack(len(data)) + data)
    except OSError:
        pass  # the server is gone: the read that follows says so


def _read_message(sock: socket.socket) -> dict | None:
    """One length-prefixed JSON message; None at end of stream. Retries reads a signal interrupts."""
    header = _read_exactly(sock, _LENGTH.size)
    if header is None:
        return None
    body = _read_exactly(sock, _LENGTH.unpack(header)[0])
    return None if body is None else json.loads(body)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


# -- the server -----------------------------------------------------------------------------------


def serve(home: Path) -> int:
    """Import what a command needs, listen, and fork a child per command until SIGTERM or idle."""
    import gc
    import importlib

    started = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    _warm_up()
    others = _other_threads()
    if threading.active_count() != 1 or others:
        # A fork copies only the forking thread: a lock another thread held stays held in the child.
        names = ", ".join([t.name for t in threading.enumerate()][1:] + others)
        print(f"cli server: threads after the imports ({names}); not serving: a fork would copy their locks", flush=True)
        return 1
    gc.collect()
    gc.freeze()  # the imported objects stay shared with the children, not copied by the collector's writes
    gc.set_threshold(50_000, 20, 20)
    fingerprint = code_fingerprint()
    address = f"kts-cli-server-{hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:16]}-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(64)
    listener.setblocking(False)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = [False]

    def on_stop(_signum, _frame):
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to wake the loop (wakeup fd)

    lifecycle.write_state(home, {"pid": os.getpid(), "address": address, "fingerprint": fingerprint})
    print(f"cli server {os.getpid()} serving {home} ({time.monotonic() - started:.1f} s to import)", flush=True)

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # child pid → its client's connection
    pending: dict[socket.socket, float] = {}  # connections whose request has not come yet → deadline
    idle_since = time.monotonic()
    stop_deadline: float | None = None
    try:
        while True:
            if stopping[0] and stop_deadline is None:
                for pid in children:
                    _signal_child(pid, signal.SIGTERM)
                stop_deadline = time.monotonic() + STOP_GRACE_S
            if stopping[0] and not children:
                return 0
            now = time.monotonic()
            for conn in [c for c, deadline in pending.items() if deadline < now or stopping[0]]:
                del pending[conn]
                selector.unregister(conn)
                conn.close()
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for pid in children:
                    _signal_child(pid, signal.SIGKILL, group=True)
            if not children and not pending and not stopping[0]:
                # Its KTS_HOME gone: the rule the embedded servers' watchdog applies to them.
                if time.monotonic() - idle_since > IDLE_EXIT_S or home_gone(home):
                    print(f"cli server {os.getpid()}: idle for {IDLE_EXIT_S} s (or its KTS_HOME is gone); exiting", flush=True)
                    return 0
            for key, _mask in selector.select(timeout=1.0):
                if key.data == "wake":
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data == "listener":
                    if stopping[0]:
                        continue
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    pending[conn] = time.monotonic() + REQUEST_TIMEOUT_S
                    selector.register(conn, selectors.EVENT_READ, "request")
                elif key.data == "request":  # a new client's request has come (or its end)
                    conn = key.fileobj
                    selector.unregister(conn)
                    pending.pop(conn, None)
                    pid = None if stopping[0] else _start_child(conn, fingerprint, listener, selector)
                    if pid is not None:
                        children[pid] = conn
                        selector.register(conn, selectors.EVENT_READ, pid)
                    else:
                        conn.close()
                else:  # a message from a running command's client, or its end
                    pid, conn = key.data, key.fileobj
                    message = _read_message_nowait(conn)
                    if message is None:  # the client is gone: its command must not run on unseen
                        selector.unregister(conn)
                        _signal_child(pid, signal.SIGTERM)
                    elif "signal" in message:
                        _signal_child(pid, int(message["signal"]))
            for pid, code in _reaped():
                conn = children.pop(pid, None)
                if conn is None:
                    continue
                try:
                    selector.unregister(conn)
                except (KeyError, ValueError):
                    pass
                _send(conn, {"exit": code})
                conn.close()
                idle_since = time.monotonic()
    finally:
        try:
            current = recorded(home)
            if current is not None and current.pid == os.getpid():
                lifecycle.clear_state(home)
        except OSError:
            pass


def _warm_up() -> None:
    """What every sync computes the same way before its first event, done once before the forks:
    the command line's parser (building it imports the modules of every command's options, ~0.1 s
    of a child's start otherwise), the copy job resolved from the Definitions, the metadata store's
    newest schema revision (which loads Alembic's scripts)."""
    from kts_assets.cli.main import build_parser
    from kts_assets.definitions import defs
    from kts_assets.jobs import COPY_JOB_NAME
    from kts_resources.metadata.database import head_revision

    build_parser()
    defs.resolve_job_def(COPY_JOB_NAME)
    head_revision()


# Set for the server only, before its imports: the libraries that would otherwise start threads
# of their own when imported (numpy's OpenBLAS pool, pyarrow's jemalloc background thread), which
# a fork would leave behind with whatever locks they held. A command needs neither.
SERVER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def _other_threads() -> list[str]:
    """The names of this process's OS threads other than the calling one (Python's threading
    module sees only the threads Python started; libraries start their own)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) == threading.get_native_id():
            continue
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # ended meanwhile
    return names


def _read_message_nowait(conn: socket.socket) -> dict | None:
    conn.setblocking(True)
    conn.settimeout(5)
    try:
        return _read_message(conn)
    except (OSError, ValueError):
        return None


def _signal_child(pid: int, signum: int, *, group: bool = False) -> None:
    """``signum`` to the command, as a signal to a process of its own reaches it; with ``group``,
    to everything it started in its group too (the last resort of a stop: what it spawned to tee
    its output, a classic Spark JVM). Not for a forwarded signal: it would kill those tee processes
    before the command's last lines pass through them."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reaped() -> list[tuple[int, int]]:
    """(pid, exit status; minus the signal for a child a signal killed) of every child that ended."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def _start_child(conn: socket.socket, fingerprint: str, listener: socket.socket, selector) -> int | None:
    """Read one request (and the client's three standard streams), which has begun to arrive,
    and fork the child that runs it; the child's pid, or None when the request is refused
    (answered on ``conn``)."""
    conn.setblocking(True)
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return None
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
        if len(data) < _LENGTH.size or len(fds) != 3:
            return None
        length = _LENGTH.unpack(data[:_LENGTH.size])[0]
        body = data[_LENGTH.size:]
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                return None
            body += chunk
        request = json.loads(body)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return None
    if request.get("fingerprint") != fingerprint:
        _send(conn, {"error": "the CLI server runs other code than this kts; run the command again (a fresh server starts)"})
        for fd in fds:
            os.close(fd)
        return None
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            selector.close()
            listener.close()
            conn.close()
            _run_child(request, fds, server_pid)
        finally:
            os._exit(70)  # only reached when _run_child itself failed before the command ran
    for fd in fds:
        os.close(fd)
    _send(conn, {"started": pid})  # from here on the command runs: the client must not ask again
    return pid


def _run_child(request: dict, fds: list[int], server_pid: int) -> None:
    """In the forked child: become the client's command, run it, exit with its status."""
    import io

    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setpgid(0, 0)
    try:  # die with the server, rather than run on with nobody to report the status to
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != server_pid:
        os._exit(1)  # the server died before the line above: its client may ask another server
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        os.chdir(request["cwd"])
    except OSError as e:
        os.write(2, f"kts: {request['cwd']}: {e.strerror or e}\n".encode())
        os._exit(1)
    encoding = sys.stdout.encoding
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding, line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding, errors="backslashreplace",
                                  line_buffering=True)
    sys.argv = ["kts", *request["argv"]]
    from kts_assets.cli.main import run_here

    code = 1
    try:
        run_here(list(request["argv"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a process's own top level would print
        import traceback

        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m kts_assets.cli.server serve KTS_HOME/cli-server")
    sys.exit(serve(Path(sys.argv[2])))
