"""The machinery of the standing race-and-fault harness (tests/test_fault_harness.py).

A scenario runs real ``kts`` processes against a simulated broker log dir, a metadata store on a
PostgreSQL server of the harness's own (:class:`Postgres`: stopped and started again on the same
port) and a remote tier: a directory, or S3 on a moto server of the harness's own
(:class:`S3Server`: stopped and started again on the same port, its buckets kept).

Faults strike at a moment picked by what kts does, never by a guessed sleep:

- :class:`StoreGate`: a trigger on the store's append-only event log (``remote_log_events``) makes
  the Nth event of a kind wait on an advisory lock the test holds. kts is then stopped inside that
  transaction (its state change not committed yet), and the test strikes: kill -9, stop
  PostgreSQL, delete a segment, rewrite a checkpoint.
- an S3 request gate (:meth:`S3Server.gate`): the Nth request of a kind waits in the server
  before moto sees it (a PUT of a segment's object, a DeleteObjects, a ranged GET).

After each fault a scenario runs the next normal pass and :func:`tier_problems` checks what
README promises: every remote segment's first and last offset read back from the tier alone as
the broker wrote them, no COPY_/DELETE_SEGMENT_STARTED row left, the tier's listing equal to the
store, and every offset from the start of kts's watch to the local log start either in a finished
remote segment or in an open lost range.

Every kts command runs in a child of one standing CLI server for the whole module (kts's own
``kts_assets.cli.server``, in which every user's ``kts sync`` runs by default), with its
scenario's own environment: the server forks a child per command that takes the client's
environment whole and runs the command as ``kts`` would in a process of its own, so scenarios
share only the imports (a fresh process spends seconds importing Dagster and PySpark). kill -9
goes to that child, the process running the command. The reads that check a scenario afterwards
run kts's reader in the test's process, built from the scenario's environment as ``kts fetch``
builds it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# Generous bounds that only catch a hang (no command here takes more than seconds).
COMMAND_TIMEOUT_S = 300
STRIKE_TIMEOUT_S = 120

STARTED_STATES = ("COPY_SEGMENT_STARTED", "DELETE_SEGMENT_STARTED")


def note(line: str) -> None:
    """A timestamped line on stdout: pytest shows a failed scenario's story."""
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {line}", flush=True)


# --- kts processes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """A finished kts command."""

    argv: tuple[str, ...]
    status: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"kts {' '.join(self.argv)}: exit {self.status}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-5000:]}"


class Running:
    """A kts command running in the background; :meth:`kill` sends SIGKILL to the command itself
    (for a sync, the CLI server's child that runs it, not the thin client)."""

    def __init__(self, argv: tuple[str, ...], process: subprocess.Popen, cli_server_pid: int | None):
        self.argv, self.process, self._server_pid = argv, process, cli_server_pid
        self._command_pid: int | None = None

    def command_pid(self) -> int | None:
        """The pid running the command: this process, or the CLI server's child serving it."""
        if self._server_pid is None:
            return self.process.pid
        if self._command_pid is None:
            children = _children(self._server_pid)
            if len(children) == 1:
                self._command_pid = children[0]
        return self._command_pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """kill -9 of the command (and what it started in its process group)."""
        pid = self.command_pid()
        assert pid is not None, "the command's process is not known (several CLI server children?)"
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: float = COMMAND_TIMEOUT_S) -> Outcome:
        if self.process.returncode is None:
            note(f"waiting for kts {' '.join(self.argv)}")
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            raise AssertionError(f"kts {' '.join(self.argv)} still ran after {timeout} s (a hang)\n{stderr[-3000:]}") from None
        note(f"kts {' '.join(self.argv)}: exit {self.process.returncode}; stderr: {stderr[-1500:]!r}")
        return Outcome(self.argv, self.process.returncode, stdout, stderr)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class CliServer:
    """kts's own standing CLI server, one for the harness, serving every scenario's ``kts sync``
    with that scenario's environment (the child it forks takes the client's environment whole)."""

    def __init__(self, home: Path):
        self.home = home / "cli-server"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KTS_") or k == "KTS_STEP_RETRY_DELAY_S"}
        self.env["KTS_HOME"] = str(home)

    @property
    def pid(self) -> int:
        from kts_assets.cli import server as cli_server

        server = cli_server.running(self.home)
        assert server is not None, f"the harness's CLI server is not running; see {self.home / 'server.log'}"
        return server.pid

    def start(self) -> None:
        from kts_assets.cli import server as cli_server

        self.home.mkdir(parents=True, exist_ok=True)
        cli_server.ensure_running(self.home, cli_server.code_fingerprint())

    def stop(self) -> None:
        from kts_assets.cli import server as cli_server

        cli_server.stop(self.home)


CLIENT = ("import sys; from pathlib import Path; from kts_assets.cli.server import run_command; "
          "sys.exit(run_command(Path(sys.argv[1]), sys.argv[2:]))")


# --- the harness's own servers ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """An embedded PostgreSQL of the harness's own (kts's embedded server code), which a scenario
    stops (fast shutdown: every session terminated, as a crash or an operator would) and starts
    again on the same port, so the URL every kts process was given works again."""

    FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

    def __init__(self, home: Path):
        from kts_resources.metadata import embedded

        self.home = home / "postgres"
        self.server = embedded.ensure_running(self.home, settings=self.FAST_SETTINGS)
        self.port = self.server.port
        self.template = f"harness_template_{uuid.uuid4().hex[:8]}"
        try:
            self._make_template()
        except BaseException:
            embedded.discard(self.home)
            raise

    def url(self, database: str) -> str:
        return self.server.url_for(database)

    def _make_template(self) -> None:
        from kts_resources.metadata import database

        self.execute(f'CREATE DATABASE "{self.template}"')
        engine = database.create_engine(self.url(self.template))
        try:
            database.migrate(engine)
            with engine.begin() as conn:
                # As the session's template (tests/fixtures_postgres.py): the simulated 2023 clock
                # would be expired by Kafka's 7-day default on every pass.
                conn.exec_driver_sql("INSERT INTO broker_configs (name, value) VALUES ('log.retention.ms', '-1')")
                conn.exec_driver_sql(StoreGate.INSTALL)
        finally:
            engine.dispose()
        # Dagster's own tables too (schema "dagster", as dagster.yaml has it): every scenario's first
        # run would otherwise create them.
        from kts_resources.dagster_storage import KtsDagsterStorage

        storage = KtsDagsterStorage(server_url=self.url(self.template))
        for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
            part.dispose()

    def execute(self, sql: str, database: str = "postgres") -> list[tuple]:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", password=self.server.password,
                                dbname=database, connect_timeout=10)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def new_database(self, template: str | None = None) -> str:
        """A fresh database, copied from ``template`` (default: migrated, gate installed); its name."""
        name, template = f"harness_{uuid.uuid4().hex[:12]}", template or self.template
        # A template must have no session: a server-side leftover of a killed command may linger.
        self.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{template}'")
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return name

    def stop(self) -> None:
        from kts_resources.metadata import embedded

        assert embedded.stop(self.home), "the harness's PostgreSQL was not running"

    def start(self) -> None:
        """Start the stopped server again on its port."""
        from kts_resources.metadata import embedded

        cluster = embedded._cluster_dir(self.home)
        options = [f"-p {self.port}", f"-c listen_addresses={embedded.LOOPBACK}", "-c unix_socket_directories=''"]
        options += [f"-c {k}={v}" for k, v in self.FAST_SETTINGS.items()]
        result = embedded._run_as_server_account(
            [embedded._bin("pg_ctl"), "-D", str(cluster / "data"), "-l", str(cluster / "postgres.log"), "-w", "-t", "60",
             "-o", " ".join(options), "start"], cwd=cluster)
        assert result.returncode == 0, result.output
        embedded._write_state(self.home, self.server)

    def close(self) -> None:
        from kts_resources.metadata import embedded

        embedded.discard(self.home)


class S3Server:
    """moto's S3 on a loopback port of its own. :meth:`stop` closes the listener and every open
    connection (clients see refused and reset connections, as from a crashed server); :meth:`start`
    listens on the same port again. The buckets live in moto's backends in this process, so they
    outlive a stop. :meth:`gate` holds the Nth matching request before moto sees it."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._thread: threading.Thread | None = None
        self._gates: list[RequestGate] = []
        self._lock = threading.Lock()
        self._app = None
        # WSGI middlewares around moto (outermost last): a tier that answers some requests its own way.
        self.middlewares: list[Callable[[Callable], Callable]] = []

    def _wsgi(self, environ, start_response):
        for gate in list(self._gates):
            gate.consider(environ)
        app = self._app
        for middleware in self.middlewares:
            app = middleware(app)
        return app(environ, start_response)

    def start(self) -> None:
        import logging

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import ThreadedWSGIServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury a failure's story
        if self._app is None:
            self._app = DomainDispatcherApplication(create_backend_app)
        connections: set[socket.socket] = set()

        class Server(ThreadedWSGIServer):
            daemon_threads = True

            def process_request(self, request, client_address):
                connections.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request):
                connections.discard(request)
                super().shutdown_request(request)

        for _ in range(100):  # the port is ours, but the kernel may hold it a moment after a stop
            try:
                server = Server("127.0.0.1", self.port, self._wsgi, handler=MotoRequestHandler)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(f"port {self.port} stayed busy")
        server.harness_connections = connections
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        assert server is not None, "the S3 server is not running"
        server.shutdown()
        server.server_close()
        for conn in list(server.harness_connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        return self._server is not None

    def gate(self, method: str, path: str | re.Pattern, nth: int = 1, query: str | None = None) -> RequestGate:
        """Hold the ``nth`` request with this method whose path matches ``path`` (a regex) and whose
        query string contains ``query``."""
        gate = RequestGate(self, method, re.compile(path), nth, query)
        self._gates.append(gate)
        return gate

    def client(self):
        import boto3

        from .fixtures_s3 import _FAKE_CREDENTIALS

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=_FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=_FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


class RequestGate:
    """Holds one S3 request (the Nth that matches) until :meth:`release`."""

    def __init__(self, server: S3Server, method: str, path: re.Pattern, nth: int, query: str | None):
        self._server, self.method, self.path, self.query = server, method, path, query
        self._remaining = nth
        self._lock = threading.Lock()
        self.reached = threading.Event()
        self._released = threading.Event()
        self.request: str | None = None

    def consider(self, environ) -> None:
        if environ["REQUEST_METHOD"] != self.method or not self.path.search(environ.get("PATH_INFO", "")):
            return
        if self.query is not None and self.query not in environ.get("QUERY_STRING", ""):
            return
        with self._lock:
            self._remaining -= 1
            hit = self._remaining == 0
        if hit:
            self.request = f"{self.method} {environ.get('PATH_INFO')}?{environ.get('QUERY_STRING', '')}"
            self.reached.set()
            self._released.wait(STRIKE_TIMEOUT_S)

    def wait(self, running: Running) -> str:
        """Wait until the request is held (the command must still run); what it was."""
        while not self.reached.wait(0.02):
            assert running.alive(), f"the command ended before the request was made\n{running.wait()}"
        return self.request

    def release(self) -> None:
        self._released.set()
        if self in self._server._gates:
            self._server._gates.remove(self)


class StoreGate:
    """Stops kts inside the transaction that writes the Nth event of a kind to ``remote_log_events``.

    Installed in the harness's template database, disarmed; :meth:`arm` re-creates the trigger's
    function with the event to wait at. A sequence counts the matching events (no row lock that
    concurrent kts transactions would queue on); the Nth waits on an advisory lock the test holds
    until :meth:`release` (or until the server stops, or the test kills the command).
    """

    KEY = 0x4B545348  # "KTSH": the harness's advisory lock key, far from kts's own keys
    INSTALL = f"""
        CREATE SEQUENCE harness_gate_hits;
        CREATE FUNCTION harness_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
        CREATE TRIGGER harness_gate AFTER INSERT ON remote_log_events FOR EACH ROW EXECUTE FUNCTION harness_gate();
    """

    def __init__(self, postgres: Postgres, database: str):
        self.postgres, self.database = postgres, database
        self._holder = None

    def arm(self, kind: str, new_state: str | None = None, nth: int = 1, partition: int | None = None) -> StoreGate:
        import psycopg2

        state = "" if new_state is None else f" AND NEW.new_state = '{new_state}'"
        state += "" if partition is None else f" AND NEW.partition = {int(partition)}"
        self.postgres.execute(f"""
            SELECT setval('harness_gate_hits', 1, false);
            CREATE OR REPLACE FUNCTION harness_gate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.kind = '{kind}'{state} AND nextval('harness_gate_hits') = {int(nth)} THEN
                    PERFORM pg_advisory_xact_lock({self.KEY});
                END IF;
                RETURN NEW;
            END $$;""", self.database)
        self._holder = psycopg2.connect(host="127.0.0.1", port=self.postgres.port, user="postgres",
                                        password=self.postgres.server.password, dbname=self.database)
        self._holder.autocommit = True
        with self._holder.cursor() as cur:
            cur.execute(f"SELECT pg_advisory_lock({self.KEY})")
        self.what = (f"{kind}{'' if new_state is None else ' ' + new_state} #{nth}"
                     f"{'' if partition is None else f' of partition {partition}'}")
        return self

    def wait(self, running: Running) -> str:
        """Wait until kts waits at the gate (the command must still run); what it waits at."""
        while True:
            rows = self.postgres.execute(
                f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 "
                f"AND objid = {self.KEY} AND objsubid = 1", self.database)
            if rows[0][0]:
                return self.what
            assert running.alive(), f"the command ended before {self.what}\n{running.wait()}"
            time.sleep(0.02)

    def release(self) -> None:
        """Let the held transaction go on (a no-op when the server was stopped meanwhile)."""
        holder, self._holder = self._holder, None
        if holder is not None:
            try:
                with holder.cursor() as cur:
                    cur.execute(f"SELECT pg_advisory_unlock({self.KEY})")
            except Exception:  # noqa: BLE001 - the server was stopped with the lock: it went with it
                pass
            try:
                holder.close()
            except Exception:  # noqa: BLE001
                pass

    def disarm(self) -> None:
        self.release()
        self.postgres.execute("CREATE OR REPLACE FUNCTION harness_gate() RETURNS trigger LANGUAGE plpgsql AS "
                              "$$ BEGIN RETURN NEW; END $$", self.database)


# --- what the broker wrote ---------------------------------------------------------------------------


class BrokerTruth:
    """Every record the simulated broker ever wrote, by partition and offset, as ``kts fetch
    --json`` shows a record (control batches are never records). Read from the log dir's segment
    files before anything could delete them; offsets never change their record."""

    def __init__(self):
        self.records: dict[tuple[str, int], dict[int, dict]] = {}

    def read(self, log_dir: Path) -> BrokerTruth:
        from kts_resources.kafka.logdir import LogDir
        from kts_resources.kafka.records import read_records

        for partition in LogDir(log_dir).partitions():
            known = self.records.setdefault((partition.topic, partition.partition), {})
            for segment in partition.segments():
                for header, records in read_records(segment.log.read_bytes()):
                    if header.is_control:
                        continue
                    for r in records:
                        known.setdefault(r.offset, {
                            "offset": r.offset, "timestamp": r.timestamp, "key": _b64(r.key), "value": _b64(r.value),
                            "headers": [[k, _b64(v)] for k, v in r.headers]})
        return self

    def copy(self) -> BrokerTruth:
        other = BrokerTruth()
        other.records = {tp: dict(records) for tp, records in self.records.items()}
        return other

    def between(self, tp: tuple[str, int], first: int, last: int) -> list[dict]:
        known = self.records.get(tp, {})
        return [known[o] for o in sorted(o for o in known if first <= o <= last)]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


# --- what the store and the tier hold ----------------------------------------------------------------


@dataclass(frozen=True)
class StoredSegment:
    segment_id: uuid.UUID
    topic: str
    topic_id: uuid.UUID
    partition: int
    start_offset: int
    end_offset: int
    size_bytes: int
    state: str

    @property
    def tp(self) -> tuple[str, int]:
        return self.topic, self.partition


def stored_segments(postgres: Postgres, database: str) -> list[StoredSegment]:
    rows = postgres.execute(
        "SELECT s.segment_id, p.topic, s.topic_id, s.partition, s.start_offset, s.end_offset, s.size_bytes, s.state "
        "FROM remote_segments s JOIN partitions p ON p.topic_id = s.topic_id AND p.partition = s.partition "
        "ORDER BY p.topic, s.partition, s.start_offset", database)
    return [StoredSegment(uuid.UUID(str(r[0])), r[1], uuid.UUID(str(r[2])), *r[3:]) for r in rows]


def partition_rows(postgres: Postgres, database: str) -> dict[tuple[str, int], dict]:
    rows = postgres.execute("SELECT topic, partition, log_start_offset, delete_state, topic_id FROM partitions", database)
    found = {}
    for topic, partition, log_start, delete_state, topic_id in rows:
        found[(topic, partition)] = {"log_start_offset": log_start, "delete_state": delete_state, "topic_id": topic_id}
    return found


def open_lost_ranges(postgres: Postgres, database: str) -> dict[tuple[str, int], list[tuple[int, int]]]:
    rows = postgres.execute(
        "SELECT p.topic, l.partition, l.start_offset, l.end_offset FROM lost_ranges l JOIN partitions p "
        "ON p.topic_id = l.topic_id AND p.partition = l.partition WHERE l.acknowledged_at IS NULL", database)
    found: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for topic, partition, start, end in rows:
        found.setdefault((topic, partition), []).append((start, end))
    return found


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, unpadded."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


_SEGMENT_OBJECT = re.compile(r"(?P<dir>[^/]+)/(?P<partition>\d+)/(?P<start>\d{20})-(?P<segment_id>[A-Za-z0-9_-]{22})\.(?P<suffix>[a-z-]+)")
# The log start offset record, and the remote log index: its pointer and its versioned file sets.
_OTHER_OBJECT = re.compile(r"[^/]+/\d+/(log-start-offset|remote-log-index/(current|\d{12}-[0-9a-f]{8}/\d{20}\.remote(Log|Offset|Time)Index))")


class Tier:
    """A scenario's remote tier, listed and read without kts: a directory, or an S3 bucket/prefix."""

    def __init__(self, kind: str, root: Path | None = None, s3: S3Server | None = None, bucket: str | None = None,
                 prefix: str = "tier"):
        self.kind, self.root, self.s3, self.bucket, self.prefix = kind, root, s3, bucket, prefix

    @property
    def env(self) -> dict[str, str]:
        if self.kind == "filesystem":
            return {"KTS_REMOTE_URI": self.root.as_uri()}
        from .fixtures_s3 import _FAKE_CREDENTIALS

        return {"KTS_REMOTE_URI": f"s3://{self.bucket}/{self.prefix}", "KTS_S3_ENDPOINT_URL": self.s3.url, **_FAKE_CREDENTIALS}

    def objects(self) -> dict[str, int]:
        """Key below the tier's root → size (a file-system tier's upload leftovers included)."""
        if self.kind == "filesystem":
            if not self.root.exists():
                return {}
            return {p.relative_to(self.root).as_posix(): p.stat().st_size for p in self.root.rglob("*") if p.is_file()}
        found = {}
        for page in self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/"):
            for item in page.get("Contents", []):
                found[item["Key"].removeprefix(f"{self.prefix}/")] = item["Size"]
        return found

    def read(self, key: str) -> bytes:
        if self.kind == "filesystem":
            return (self.root / key).read_bytes()
        return self.s3.client().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()

    def copy_to(self, other: Tier) -> None:
        """Every object of this tier into ``other`` (a snapshot a scenario starts from)."""
        if self.kind == "filesystem":
            shutil.copytree(self.root, other.root)
            return
        client = self.s3.client()
        for key in self.objects():
            client.copy_object(Bucket=other.bucket, Key=f"{other.prefix}/{key}",
                               CopySource={"Bucket": self.bucket, "Key": f"{self.prefix}/{key}"})


def tier_problems(tier: Tier, segments: list[StoredSegment]) -> list[str]:
    """The tier's listing against the store: every finished segment's objects (as its manifest
    names them) there with their sizes, and no object of a segment id the store does not hold
    finished; nothing else but remote log index files and log start offset records."""
    problems = []
    objects = tier.objects()
    finished = {kafka_uuid(s.segment_id): s for s in segments if s.state == "COPY_SEGMENT_FINISHED"}
    seen: dict[str, set[str]] = {}
    for key, size in sorted(objects.items()):
        m = _SEGMENT_OBJECT.fullmatch(key)
        if m is None:
            if _OTHER_OBJECT.fullmatch(key) is None:
                problems.append(f"tier object {key} ({size} bytes) is no object of kts's layout (an upload's leftover?)")
            continue
        segment = finished.get(m["segment_id"])
        if segment is None:
            problems.append(f"tier object {key}: its segment {m['segment_id']} is not a finished segment in the store")
            continue
        seen.setdefault(m["segment_id"], set()).add(m["suffix"])
    for sid, segment in finished.items():
        stem = f"{segment.topic}-{kafka_uuid(segment.topic_id)}/{segment.partition}/{segment.start_offset:020d}-{sid}"
        if f"{stem}.manifest" not in objects:
            problems.append(f"finished segment {segment.tp} {segment.start_offset}..{segment.end_offset} ({sid}): no manifest in the tier")
            continue
        manifest = json.loads(tier.read(f"{stem}.manifest"))
        if (manifest["start_offset"], manifest["end_offset"]) != (segment.start_offset, segment.end_offset):
            problems.append(f"manifest {stem}.manifest says {manifest['start_offset']}..{manifest['end_offset']}, "
                            f"the store {segment.start_offset}..{segment.end_offset}")
        for suffix, described in manifest["objects"].items():
            key = described["key"]
            key = key.removeprefix(f"{tier.prefix}/") if tier.kind == "s3" else key
            if objects.get(key) != described["size"]:
                problems.append(f"finished segment {segment.tp} {segment.start_offset}..{segment.end_offset}: its .{suffix} "
                                f"{key} is {objects.get(key, 'missing')} bytes in the tier, {described['size']} in its manifest")
    return problems


def coverage_problems(segments: list[StoredSegment], partitions: dict, lost: dict, log_dir: Path) -> list[str]:
    """Every offset from the partition's log start offset in the store to its local log start is in
    a finished remote segment or an open lost range (README: data loss is never forgotten)."""
    from kts_resources.kafka.logdir import LogDir

    problems = []
    local_starts = {(p.topic, p.partition): (p.segments()[0].base_offset if p.segments() else None)
                    for p in LogDir(log_dir).partitions()}
    for tp, row in partitions.items():
        if row["delete_state"] is not None or local_starts.get(tp) is None:
            continue
        ranges = sorted([(s.start_offset, s.end_offset) for s in segments if s.tp == tp and s.state == "COPY_SEGMENT_FINISHED"]
                        + lost.get(tp, []))
        position, end = row["log_start_offset"], local_starts[tp]
        for start, last in ranges:
            if start > position and position < end:
                problems.append(f"{tp[0]}-{tp[1]}: offsets {position}..{min(start, end) - 1} are neither remote, local nor "
                                "in an open lost range")
            position = max(position, last + 1)
        if position < end:
            problems.append(f"{tp[0]}-{tp[1]}: offsets {position}..{end - 1} are neither remote, local nor in an open lost range")
    return problems


def fetch_problems(answers: list[dict | str], plan: list[tuple[tuple[str, int], int, StoredSegment]],
                   truth: BrokerTruth) -> list[str]:
    """Fetch answers (one per planned offset: the JSON of ``kts fetch --json``, or its error line)
    against the broker's records: from the offset to the last record fetched, exactly those."""
    problems = []
    for (tp, offset, segment), fetched in zip(plan, answers):
        where = f"{tp[0]}-{tp[1]} offset {offset} (remote segment {segment.start_offset}..{segment.end_offset})"
        if isinstance(fetched, str):
            problems.append(f"{where}: kts fetch fails: {fetched}")
            continue
        records = [r for r in fetched["records"] if r["offset"] >= offset]
        if fetched["next_offset"] <= offset:
            problems.append(f"{where}: next offset {fetched['next_offset']} does not move past it")
        last = max([r["offset"] for r in records], default=fetched["next_offset"] - 1)
        expected = truth.between(tp, offset, last)
        if records != expected:
            got = [r["offset"] for r in records][:5]
            problems.append(f"{where}: fetched offsets {got}… differ from what the broker wrote {[r['offset'] for r in expected][:5]}…")
    return problems


def stderr_problems(outcome: Outcome) -> list[str]:
    return [f"kts {' '.join(outcome.argv)} printed a traceback:\n{outcome.stderr[-3000:]}"] if "Traceback" in outcome.stderr else []


def wait_for(condition: Callable[[], Any], what: str, running: Running | None = None, timeout: float = STRIKE_TIMEOUT_S):
    """Poll ``condition`` until it answers something true (a hang, not speed, is what the bound catches)."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if running is not None and not running.alive():
            raise AssertionError(f"the command ended before {what}\n{running.wait()}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)



# --- one scenario ------------------------------------------------------------------------------------


@dataclass
class Scenario:
    """One scenario's world: its log dir (a copy of its family's), KTS_HOME, Dagster instance,
    database on the harness's PostgreSQL and remote tier; kts commands run in its environment."""

    name: str
    root: Path
    postgres: Postgres
    database: str
    tier: Tier
    log_dir: Path
    truth: BrokerTruth
    cli_server: CliServer | None = None
    home: Path = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        dagster_home = self.root / "dagster"
        dagster_home.mkdir(exist_ok=True)
        shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home)  # kts's instance: its runs in the scenario's database
        self.no_logs = self.root / "no-logs"  # a remote-only reader's log dir
        self.no_logs.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KTS_") or k.startswith("KTS_SPARK_")
                    or k == "KTS_STEP_RETRY_DELAY_S"}  # the suite's short step retries (conftest)
        self.env.update(KTS_DATABASE_URL=self.postgres.url(self.database), KTS_LOG_DIRS=str(self.log_dir),
                        KTS_HOME=str(self.home), DAGSTER_HOME=str(dagster_home), KTS_CLI_SERVER="off", **self.tier.env)

    # -- running kts

    def start(self, *argv: str, env: dict[str, str] | None = None) -> Running:
        """``kts argv`` in the background, in a child of the harness's CLI server (or, without
        one, in a process of its own)."""
        served = self.cli_server is not None
        command = ([sys.executable, "-c", CLIENT, str(self.cli_server.home), *argv] if served
                   else [sys.executable, "-m", "kts_assets.cli", *argv])
        note(f"{self.name}: kts {' '.join(argv)}")
        process = subprocess.Popen(command, env={**self.env, **(env or {})}, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        return Running(tuple(argv), process, self.cli_server.pid if served else None)

    def other_host(self) -> dict[str, str]:
        """The environment of a second kts sharing this one's store and tier (another host): its own
        KTS_HOME and Dagster instance (a schema of its own in the same database)."""
        home, dagster_home = self.root / "other-home", self.root / "other-dagster"
        home.mkdir(exist_ok=True)
        dagster_home.mkdir(exist_ok=True)
        text = (REPO_ROOT / "dagster.yaml").read_text()
        assert "schema: dagster\n" in text
        (dagster_home / "dagster.yaml").write_text(text.replace("schema: dagster\n", "schema: dagster_other\n"))
        return {"KTS_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}

    def kts(self, *argv: str, env: dict[str, str] | None = None) -> Outcome:
        return self.start(*argv, env=env).wait()

    def sync(self) -> Outcome:
        return self.kts("sync")

    def gate(self) -> StoreGate:
        return StoreGate(self.postgres, self.database)

    # -- what it holds

    def segments(self) -> list[StoredSegment]:
        return stored_segments(self.postgres, self.database)

    def finished(self) -> list[StoredSegment]:
        return [s for s in self.segments() if s.state == "COPY_SEGMENT_FINISHED"]

    def problems(self) -> list[str]:
        """Everything the harness checks after a scenario's recovering pass (see the module docstring)."""
        segments = self.segments()
        problems = [f"{s.tp[0]}-{s.tp[1]} segment {s.start_offset}..{s.end_offset} ({s.segment_id}) left in {s.state}"
                    for s in segments if s.state in STARTED_STATES]
        partitions = partition_rows(self.postgres, self.database)
        problems += [f"{tp[0]}-{tp[1]} left in {row['delete_state']}" for tp, row in partitions.items()
                     if row["delete_state"] not in (None, "DELETE_PARTITION_FINISHED")]
        problems += tier_problems(self.tier, segments)
        problems += coverage_problems(segments, partitions, open_lost_ranges(self.postgres, self.database), self.log_dir)
        problems += self.read_problems(segments, partitions)
        return problems

    def read_problems(self, segments: list[StoredSegment], partitions: dict) -> list[str]:
        """The first and last offset of every finished remote segment (from the log start offset on),
        fetched by a remote-only reader, against what the broker wrote."""
        plan = []
        for s in segments:
            if s.state != "COPY_SEGMENT_FINISHED":
                continue
            first = max(s.start_offset, partitions[s.tp]["log_start_offset"])
            if first <= s.end_offset:
                plan += [(s.tp, first, s), (s.tp, s.end_offset, s)]
        if not plan:
            return []
        note(f"{self.name}: fetching {len(plan)} offsets from the tier alone")
        return fetch_problems(self.fetch_all(plan), plan, self.truth)

    def fetch_all(self, plan) -> list[dict | str]:
        """``kts fetch --json --max-bytes 1`` of each planned offset, by kts's reader as the command
        builds it (from this scenario's environment, with a log dir holding nothing: remote only),
        in this process: the JSON, or the one line the command would print."""
        from kts_resources.reading.reader import ReadError, TieredLogReader

        answers: list[dict | str] = []
        with environment({**self.env, "KTS_LOG_DIRS": str(self.no_logs)}):
            with TieredLogReader.from_environment() as reader:
                for tp, offset, _segment in plan:
                    try:
                        answers.append(reader.fetch(tp[0], tp[1], offset, 1, "read_uncommitted").to_json())
                    except ReadError as e:
                        answers.append(str(e))
        return answers


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """This process's KTS_* and AWS_* variables as ``env`` has them, for the block."""
    names = {k for k in {*os.environ, *env} if k.startswith(("KTS_", "AWS_"))}
    saved = {k: os.environ.get(k) for k in names}
    try:
        for k in names:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- what a broker does to its log dir ------------------------------------------------------------


def broker_deletes_oldest(log_dir: Path, topic: str, partition: int, count: int, *, remove: bool = True) -> int:
    """The broker's own retention (UnifiedLog.deleteOldSegments) on the partition's ``count`` oldest
    segments: each one's files renamed ``.deleted`` (and, with ``remove``, removed, as Kafka does
    file.delete.delay.ms later), the log start offset advanced to the first segment left and
    ``log-start-offset-checkpoint`` rewritten atomically. The new log start offset."""
    from kts_resources.kafka.checkpoints import read_offset_checkpoint, write_offset_checkpoint
    from kts_resources.kafka.logdir import LogDir
    from kts_resources.kafka.partition import TopicPartition

    tp = TopicPartition(topic, partition)
    [pdir] = [p for p in LogDir(log_dir).partitions() if p.topic_partition == tp]
    segments = pdir.segments()
    doomed, new_start = segments[:count], segments[count].base_offset
    renamed = []
    for segment in doomed:
        stem = segment.log.name.removesuffix(".log")
        for path in pdir.path.iterdir():
            if path.name.startswith(stem + ".") and not path.name.endswith(".deleted"):
                renamed.append(path.rename(path.with_name(path.name + ".deleted")))
    checkpoint = log_dir / "log-start-offset-checkpoint"
    offsets = read_offset_checkpoint(checkpoint)
    offsets[tp] = new_start
    write_offset_checkpoint(checkpoint, offsets)
    if remove:
        for path in renamed:
            path.unlink()
    return new_start


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Callable[[str], None]]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (root only); yields a resize function."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True,
                   capture_output=True)

    def resize(new_size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(path)], check=True, capture_output=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path) -> Path:
    """A file taking every free byte of ``directory``'s file system (a full disk); its path."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (64 * 1024, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return ballast


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None
