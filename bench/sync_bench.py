"""How fast ``kts sync`` tiers a log dir, against the copy procedure alone on the same bytes: the
cost of Dagster and Spark around the copy, as a ratio measured in the same run.

    .venv/bin/python bench/sync_bench.py [--size 1GiB] [--segment-size 64MiB] [--partitions 8]
                                   [--repeats N] [--[no-]noop] [--no-warmup] [--quick] [--json PATH]

A deterministic (seeded) broker log dir is simulated (``kts_resources.kafka.simulator.simulate``: two topics,
``--partitions`` partitions in all, all five codecs, transactions) so that ``--size`` bytes of .log
sit in closed, copy-eligible segments. Then, each round, every measurement into a fresh remote tier
(a directory) and a fresh, migrated metadata database:

- "copy alone": ``copy_pass(LogDir(...), store, FileSystemRemoteStorage(...))``, the copy
  procedure with nothing around it (four partitions side by side, its default) (the baseline);
- info "copy under the copy quota": the same under the unbounded copy quota (whose samples live in
  the store), the way the copy's step (``remote_segments``) runs it, still without Dagster;
- "kts sync": ``python -m kts_assets.cli sync`` as a subprocess, as a user runs it, with
  KTS_LOG_DIRS, KTS_DATABASE_URL, KTS_REMOTE_URI, a fresh KTS_HOME (the Parquet inventory) and a
  fresh DAGSTER_HOME (the repo's dagster.yaml: telemetry off, the instance in the database's
  ``dagster`` schema), on the standing embedded Spark Connect server (``--spark classic``:
  KTS_SPARK_MASTER=local[*], a JVM per sync) and in the standing CLI server (``--cli-server off``:
  a fresh Python process per sync that imports everything), both started once, untimed, as kts's
  first sync starts them and later ones reuse them. It includes what a user pays: the client's
  start-up, Dagster's run bookkeeping, the copy (remote_segments) with the Spark inventory of every
  segment (local_segments) beside it in one step, and the asset checks;
- "kts sync, nothing to copy": the same command again right after, on the same state. Everything
  but the copy: the fixed cost (start-up, Spark session, Dagster) plus the inventory, which
  re-scans every local segment whether copied or not. ``--quick`` skips it (``--noop`` to keep
  it): every sync costs tens of seconds whatever the size;
- "kts status": ``python -m kts_assets.cli status`` right after the no-op sync, on the same state:
  the yardstick for the no-op sync (issue 10's goal: a no-op sync within 5× of a status).

Where a sync's time goes is read from its Dagster run's event log (step start/success events,
resource initialisation) and the subprocess's wall clock: start-up before the run's first event,
run planning, the Spark session (resource initialisation), each step, Dagster between steps, and
the exit after the run's last event.

Correctness is checked once per run, untimed: after the first sync the metadata store must hold
exactly the eligible segments as COPY_SEGMENT_FINISHED (same offsets), the first and last of them
must be byte-identical in the remote tier (.log and .index), and the Dagster runs must have
succeeded. Every timed sync must report all eligible segments copied, every no-op sync none.

The database is ``KTS_DATABASE_URL``'s server when set (the bench creates a database of its own
per measurement there, so its user needs CREATEDB, and drops them), else an embedded server under
a temporary KTS_HOME with the settings kts itself starts it with (fsync on), stopped at the end.

The page cache is not dropped (that needs root); the source files are read right before every
measurement and ``sync`` runs (untimed) before each, as in bench/copy.py. The machine may be
shared, so the results are the ratios. Measurements are interleaved (one round of everything, the
order rotated every round); each keeps its best round, and the JSON has every round, the
median-round ratios and the load average. Prints a table on stdout, progress on stderr, and writes
JSON (default bench/results/sync.json).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, copy_pass, format_rows, git_state, keep_simulated_data, progress, write_json

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_assets.cli import server as cli_server
from kts_assets.cli.common import parse_size
from kts_resources.tiering.copier import PARALLEL_PARTITIONS
from kts_resources.dagster_storage import KtsDagsterStorage
from kts_resources.kafka.logdir import LogDir, SegmentFiles
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.spark import connect_server as spark_connect
from kts_resources.metadata import database, embedded
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import IndexType, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage import FileSystemRemoteStorage
from kts_resources.tiering.tiers import copy_candidates

MiB = 1024 * 1024
READ_CHUNK = MiB
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
SYNC_TIMEOUT_S = 1800
MEASUREMENTS = ("copy_alone", "copy_parallel", "sync", "sync_noop", "status")
# The phases of one `kts sync`, in the order they happen (see sync_phases).
PHASES = ("startup", "planning", "resource_init", "local_and_remote_segments", "retention_state",
          "remote_log_index", "other_steps", "dagster_other", "exit")
STEP_PHASES = ("local_and_remote_segments", "retention_state", "remote_log_index")

# Sizes: (full, --quick).
DEFAULTS = {
    "size": (1024 * MiB, 32 * MiB),
    "segment_size": (64 * MiB, 4 * MiB),
    "partitions": (8, 4),
    "repeats": (5, 1),
}


# --- the database -------------------------------------------------------------------------------


class Databases:
    """Fresh, migrated databases on one server: ``KTS_DATABASE_URL``'s when set, else an embedded
    server under ``tmpdir`` (stopped by ``close``). Every database made is dropped by ``drop`` or,
    at the latest, by ``close``."""

    def __init__(self, tmpdir: Path):
        configured = os.environ.get("KTS_DATABASE_URL", "").strip()
        self.home: Path | None = None
        if configured:
            self.server_url = database.normalize_url(configured)
            self.info = {"source": "KTS_DATABASE_URL", "server": database.describe_url(self.server_url)}
        else:
            self.home = tmpdir / "kts_home" / "postgres"
            progress(f"starting an embedded PostgreSQL under {self.home.parent}")
            self.server_url = embedded.ensure_running(self.home).url_for("postgres")  # kts's own settings
            self.info = {"source": "embedded", "server": database.describe_url(self.server_url)}
        self.admin = database.create_engine(self.server_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        self.names: list[str] = []
        with self.admin.connect() as conn:
            for setting in ("server_version", "fsync", "synchronous_commit"):
                self.info[setting] = conn.exec_driver_sql(f"SHOW {setting}").scalar()

    def fresh(self, name: str | None = None) -> str:
        """URL of a new database with kts's schema and Dagster's tables (made here, untimed: a user's
        sync finds them),
        named ``name`` (one just dropped may be made again) or a new name."""
        name = name or f"kts_bench_sync_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        url = make_url(self.server_url).set(database=name).render_as_string(hide_password=False)
        engine = database.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            database.migrate(engine)
            keep_simulated_data(engine)
        finally:
            engine.dispose()
        # Dagster's tables too (dagster.yaml keeps the instance in this database): a deployment
        # made them once, at its first run, not at every sync.
        storage = KtsDagsterStorage(server_url=url)
        for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
            part.dispose()
        return url

    def empty_store(self, url: str) -> None:
        """Empty kts's store (its schema made again, migrated) and keep the Dagster instance that
        lives beside it in the ``dagster`` schema: what a long-lived daemon's world needs."""
        engine = database.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP SCHEMA public CASCADE")
                conn.exec_driver_sql("CREATE SCHEMA public")
            database.migrate(engine)
            keep_simulated_data(engine)
        finally:
            engine.dispose()

    def drop(self, url: str) -> None:
        name = make_url(url).database
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.names.remove(name)

    def close(self) -> None:
        try:
            with self.admin.connect() as conn:
                for name in self.names:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self.names.clear()
        finally:
            self.admin.dispose()
            if self.home is not None:
                progress("stopping the embedded PostgreSQL")
                embedded.discard(self.home)  # under root its cluster is outside tmpdir


# --- the log dir --------------------------------------------------------------------------------


@dataclass
class Eligible:
    partition_dir: str  # e.g. "orders-0"
    segment: SegmentFiles
    files: list[Path]  # what travels with it: .log, .index, .timeindex, .txnindex, snapshot


def simulate_log_dir(root: Path, size: int, segment_size: int, partitions: int, seed: int, leader_change_ratio: float) -> dict:
    """Two topics; every partition gets enough whole segments for its share of ``size`` plus half a
    segment more, which stays in its active segment."""
    topics = ("orders", "page.views")[: min(partitions, 2)]
    per_topic = -(-partitions // len(topics))
    n = per_topic * len(topics)
    whole = max(1, -(-size // (n * segment_size)))  # closed segments per partition
    config = SimulationConfig(seed=seed, topics=topics, partitions=per_topic, total_bytes=n * (whole * segment_size + segment_size // 2),
                              segment_bytes=segment_size, leader_epoch_change_ratio=leader_change_ratio)
    summary = simulate(root, config)
    return {"topics": list(topics), "partitions": n, "bytes_written": summary.bytes_written,
            "batches_written": summary.batches_written, "records_written": summary.records_written}


def eligible_segments(root: Path) -> list[Eligible]:
    """What the copy procedure will copy, picked with its own rule (``copy_candidates``)."""
    log_dir = LogDir(root)
    out = []
    for partition in log_dir.partitions():
        tp = partition.topic_partition
        segments = partition.segments()
        start = log_dir.log_start_offset(tp)
        for seg in copy_candidates(segments, high_watermark=log_dir.high_watermark(tp), recovery_point=log_dir.recovery_point(tp),
                                   log_start_offset=segments[0].base_offset if start is None else start, highest_copied_offset=-1):
            assert seg.next_base_offset is not None
            snapshot = partition.producer_snapshot_path(seg.next_base_offset)
            files = [p for p in (seg.log, seg.offset_index, seg.time_index, seg.txn_index, snapshot if snapshot.exists() else None)
                     if p is not None]
            out.append(Eligible(partition.path.name, seg, files))
    return out


def warm(paths: list[Path]) -> None:
    buf = bytearray(READ_CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --- the measurements ---------------------------------------------------------------------------


def timed_copy_pass(root: Path, url: str, dest: Path) -> tuple[float, list]:
    """Seconds of one ``copy_pass`` over ``root`` into the directory tier at ``dest``, and its
    results (the store's engine and first connection are made before the clock starts)."""
    store = RemoteLogMetadataStore(database.create_engine(url))
    try:
        with store.engine.connect():
            pass  # the pool's first connection, untimed
        gc.collect()
        t0 = time.perf_counter()
        results = copy_pass(LogDir(root), store, FileSystemRemoteStorage(dest))
        return time.perf_counter() - t0, results
    finally:
        store.close()


def copy_alone(root: Path, url: str, dest: Path, expected: list[Eligible]) -> float:
    """Seconds of one ``copy_pass``, every eligible segment checked copied."""
    seconds, results = timed_copy_pass(root, url, dest)
    check_copied(results, expected, "the copy pass")
    return seconds


def copy_parallel(root: Path, url: str, dest: Path, expected: list[Eligible]) -> float:
    """Seconds of ``copy_pass`` (PARALLEL_PARTITIONS at a time) under the (unbounded) shared
    copy quota, whose samples live in the store: what the remote_segments step does, without Dagster."""
    from kts_resources.resources import CopyQuotaResource

    store = RemoteLogMetadataStore(database.create_engine(url))
    try:
        with store.engine.connect():
            pass
        gc.collect()
        t0 = time.perf_counter()
        quota = CopyQuotaResource().manager(store.engine)
        results = copy_pass(LogDir(root), store, FileSystemRemoteStorage(dest), quota=quota)
        seconds = time.perf_counter() - t0
    finally:
        store.close()
    check_copied(results, expected, "the copy pass under the copy quota")
    return seconds


def check_copied(results, expected: list[Eligible], what: str) -> None:
    copied = sum(len(r.copied) for r in results)
    stopped = [r.stopped or r.skipped for r in results if r.stopped or r.skipped]
    if stopped or copied != len(expected) or sum(r.copied_bytes for r in results) != sum(e.segment.log.stat().st_size for e in expected):
        raise SystemExit(f"{what} did not copy the {len(expected)} eligible segments: {copied} copied; {stopped}")


@dataclass
class SyncEnv:
    """One sync's world: a fresh database, remote tier, KTS_HOME and Dagster instance."""

    url: str
    remote: Path
    kts_home: Path
    dagster_home: Path
    log_dir: Path
    spark: dict[str, str]  # KTS_SPARK_MASTER for --spark classic; empty for the embedded default (see make_sync_env)
    cli_server: bool = False  # KTS_CLI_SERVER on (a standing server, see make_sync_env) or off

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KTS_", "DAGSTER_"))}
        env.update({
            "KTS_LOG_DIRS": str(self.log_dir), "KTS_HOME": str(self.kts_home), "KTS_DATABASE_URL": self.url,
            "KTS_REMOTE_URI": self.remote.as_uri(), "DAGSTER_HOME": str(self.dagster_home), **self.spark,
            "KTS_CLI_SERVER": "on" if self.cli_server else "off",
        })
        return env

    def instance(self):
        """The Dagster instance this world's syncs record into, loaded here as they load it: the
        repo's dagster.yaml keeps it in the world's database (KTS_DATABASE_URL, read at load)."""
        import dagster as dg

        saved = os.environ.get("KTS_DATABASE_URL")
        os.environ["KTS_DATABASE_URL"] = self.url
        try:
            return dg.DagsterInstance.from_config(str(self.dagster_home))
        finally:
            if saved is None:
                os.environ.pop("KTS_DATABASE_URL")
            else:
                os.environ["KTS_DATABASE_URL"] = saved


def make_sync_env(base: Path, url: str, log_dir: Path, spark: dict[str, str], standing_spark: Path | None = None,
                  standing_cli_server: Path | None = None) -> SyncEnv:
    env = SyncEnv(url, base / "remote", base / "kts_home", base / "dagster_home", log_dir, spark,
                  cli_server=standing_cli_server is not None)
    for d in (env.remote, env.kts_home, env.dagster_home):
        d.mkdir(parents=True)
    if standing_cli_server is not None:
        # Likewise the CLI server: the one kts's first sync starts and later ones reuse.
        (env.kts_home / cli_server.STATE_DIR).symlink_to(standing_cli_server, target_is_directory=True)
    if standing_spark is not None:
        # The fresh KTS_HOME's embedded Spark Connect server is the standing one: the sync takes
        # kts's default path (the embedded server and its shared session), not KTS_SPARK_REMOTE's.
        (env.kts_home / "spark-connect").symlink_to(standing_spark, target_is_directory=True)
    # The instance `kts sync` uses in a source checkout is the repo's dagster.yaml (telemetry off,
    # pools, storage in kts's database, here the world's fresh one, so no run sees another's).
    shutil.copy(REPO_ROOT / "dagster.yaml", env.dagster_home / "dagster.yaml")
    return env


SYNCED = re.compile(r"^synced ([\d,]+) partitions \(([\d,]+) new\): copied ([\d,]+) segments \(([\d,]+) bytes\)", re.MULTILINE)


def run_sync(env: SyncEnv) -> dict:
    """One ``kts sync`` subprocess: wall seconds, what it reported, and when it started and ended
    (wall clock, to place the run's events)."""
    gc.collect()
    launched = time.time()
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", "sync"], env=env.environ(), cwd=env.kts_home,
                            capture_output=True, text=True, timeout=SYNC_TIMEOUT_S, check=False)
    seconds = time.perf_counter() - t0
    exited = time.time()
    if result.returncode != 0:
        raise SystemExit(f"kts sync exited {result.returncode}:\n{result.stderr[-4000:]}")
    m = SYNCED.search(result.stdout)
    if m is None:
        raise SystemExit(f"kts sync printed no summary line:\n{result.stdout[-2000:]}")
    return {"seconds": seconds, "launched": launched, "exited": exited, "partitions": int(m[1].replace(",", "")),
            "copied_segments": int(m[3].replace(",", "")), "copied_bytes": int(m[4].replace(",", "")), "stdout": result.stdout.strip()}


def sync_phases(env: SyncEnv, launched: float, exited: float, run_ids_before: set[str]) -> dict:
    """Seconds per phase of one ``kts sync`` from its Dagster runs' event logs (the runs not in
    ``run_ids_before``): start-up (process start → the first run's first event: imports, the
    Definitions, partition discovery, the instance), planning (→ the run's start event), resource
    initialisation (the Spark session is made in the first step that needs one), each step,
    Dagster between steps and runs, and the exit (the last run's last event → the process gone,
    a classic session's JVM shutdown among it). They add up to
    the subprocess's wall time, give or take the clock read around the launch."""
    phases = dict.fromkeys(PHASES, 0.0)
    steps: dict[str, float] = {}
    statuses = []
    with env.instance() as instance:
        runs = [r for r in reversed(instance.get_runs()) if r.run_id not in run_ids_before]  # oldest first
        previous_end = None
        for run in runs:
            statuses.append(run.status.value)
            logs = [e for e in instance.all_logs(run.run_id) if e.dagster_event is not None]
            first, last = logs[0].timestamp, logs[-1].timestamp
            if previous_end is None:
                phases["startup"] += first - launched
            else:
                phases["dagster_other"] += first - previous_end  # between runs: the CLI's loop
            previous_end = last
            run_start, init_start, init = first, None, 0.0
            run_steps: dict[str, float] = {}
            starts: dict[str, float] = {}
            for e in logs:
                kind = e.dagster_event.event_type_value
                if kind in ("PIPELINE_START", "RUN_START"):
                    run_start = e.timestamp
                elif kind == "RESOURCE_INIT_STARTED":
                    init_start = e.timestamp
                elif kind in ("RESOURCE_INIT_SUCCESS", "RESOURCE_INIT_FAILURE") and init_start is not None:
                    init += e.timestamp - init_start
                elif kind == "STEP_START":
                    starts[e.step_key] = e.timestamp
                elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and e.step_key in starts:
                    run_steps[e.step_key] = run_steps.get(e.step_key, 0.0) + e.timestamp - starts.pop(e.step_key)
            phases["planning"] += run_start - first
            phases["resource_init"] += init
            for key, seconds in run_steps.items():
                steps[key] = steps.get(key, 0.0) + seconds
                phase = key if key in STEP_PHASES else "other_steps"
                phases[phase] += seconds
            phases["dagster_other"] += (last - run_start) - init - sum(run_steps.values())
        if previous_end is not None:
            phases["exit"] = exited - previous_end
    return {"phases": phases, "steps": steps, "runs": len(runs), "run_statuses": statuses, "total_seconds": exited - launched}


def verify(url: str, remote: Path, root: Path, expected: list[Eligible]) -> dict:
    """The store holds exactly the eligible segments as COPY_SEGMENT_FINISHED (same offsets), and
    the first and last of them are byte-identical in the remote tier (.log and .index)."""
    store = RemoteLogMetadataStore(database.create_engine(url))
    storage = FileSystemRemoteStorage(remote)
    problems: list[str] = []
    finished_total = 0
    compared_bytes = 0
    try:
        by_partition: dict[str, list[Eligible]] = {}
        for e in expected:
            by_partition.setdefault(e.partition_dir, []).append(e)
        finished_by_base = {}
        for partition in LogDir(root).partitions():
            metadata = partition.metadata()
            assert metadata is not None
            tip = TopicIdPartition(metadata.topic_id, partition.topic_partition)
            finished = store.list_remote_log_segments(tip, states={FINISHED})
            finished_total += len(finished)
            want = [e.segment.base_offset for e in by_partition.get(partition.path.name, [])]
            got = [md.start_offset for md in finished]
            if got != want:
                problems.append(f"{partition.path.name}: finished segments start at {got}, eligible at {want}")
            for md in finished:
                finished_by_base[(partition.path.name, md.start_offset)] = md
        for e in {id(x): x for x in (expected[0], expected[-1])}.values():
            md = finished_by_base.get((e.partition_dir, e.segment.base_offset))
            if md is None:
                continue  # reported above
            local = e.segment.log.read_bytes()
            if md.end_offset != e.segment.next_base_offset - 1 or storage.fetch_log_segment(md, 0) != local:
                problems.append(f"{e.segment.log}: the remote copy differs")
            if storage.fetch_index(md, IndexType.OFFSET) != e.segment.offset_index.read_bytes():
                problems.append(f"{e.segment.offset_index}: the remote copy differs")
            compared_bytes += len(local)
    finally:
        store.close()
    return {"passed": not problems and finished_total == len(expected), "eligible_segments": len(expected),
            "finished_segments": finished_total, "compared_segments": len({id(expected[0]), id(expected[-1])}),
            "compared_log_bytes": compared_bytes, "problems": problems}


# --- the run ------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def measure(args: argparse.Namespace, tmpdir: Path, dbs: Databases, spark_env: dict[str, str],
            standing_spark: Path | None = None, standing_cli_server: Path | None = None) -> dict:
    root = tmpdir / "logs"
    progress(f"simulating a log dir: {args.size / MiB:.0f} MiB in closed {args.segment_size / MiB:.0f} MiB segments "
             f"over {args.partitions} partitions (seed {args.seed})")
    t = time.perf_counter()
    sim = simulate_log_dir(root, args.size, args.segment_size, args.partitions, args.seed, args.leader_change_ratio)
    simulate_seconds = time.perf_counter() - t
    eligible = eligible_segments(root)
    if not eligible:
        raise SystemExit("the simulated log dir has no eligible segment: raise --size or lower --segment-size")
    files = [p for e in eligible for p in e.files]
    total_bytes = sum(p.stat().st_size for p in files)
    log_bytes = sum(e.segment.log.stat().st_size for e in eligible)
    progress(f"  {len(eligible)} eligible segments, {len(files)} files, {total_bytes / MiB:.0f} MiB "
             f"({log_bytes / MiB:.0f} MiB of .log) in {simulate_seconds:.1f} s")

    rounds: dict[str, list[float]] = {name: [] for name in MEASUREMENTS}
    phases: dict[str, list[dict]] = {"sync": [], "sync_noop": []}
    sync_reports: list[dict] = []
    verification: dict[str, dict] = {}
    counter = [0]

    def fresh(prefix: str) -> Path:
        counter[0] += 1
        base = tmpdir / f"{prefix}-{counter[0]}"
        os.sync()  # nobody inherits the previous measurement's dirty pages (untimed)
        return base

    def run_copy(name: str, fn: Callable[[Path, str, Path, list[Eligible]], float], record: bool) -> None:
        url = dbs.fresh()
        dest = fresh(name)
        dest.mkdir()
        try:
            warm(files)
            seconds = fn(root, url, dest, eligible)
            if record:
                rounds[name].append(seconds)
            if name not in verification:
                verification[name] = verify(url, dest, root, eligible)
            progress(f"  {name}: {seconds:.2f} s")
        finally:
            dbs.drop(url)
            shutil.rmtree(dest, ignore_errors=True)

    def run_syncs(record: bool) -> None:
        url = dbs.fresh()
        base = fresh("sync")
        env = make_sync_env(base, url, root, spark_env, standing_spark, standing_cli_server)
        try:
            warm(files)
            progress("  kts sync …")
            first = run_sync(env)
            if first["copied_segments"] != len(eligible) or first["copied_bytes"] != log_bytes:
                raise SystemExit(f"kts sync copied {first['copied_segments']} segments ({first['copied_bytes']} bytes), "
                                 f"not the {len(eligible)} eligible ({log_bytes} bytes): {first['stdout']}")
            first_phases = sync_phases(env, first["launched"], first["exited"], set())
            progress(f"  sync: {first['seconds']:.2f} s")
            if "sync" not in verification:
                verification["sync"] = {**verify(url, env.remote, root, eligible), "run_statuses": first_phases["run_statuses"]}
                if any(s != "SUCCESS" for s in first_phases["run_statuses"]):
                    verification["sync"]["passed"] = False
            if record:
                rounds["sync"].append(first["seconds"])
                phases["sync"].append(first_phases)
                sync_reports.append({"sync": first["stdout"]})
            if not args.noop:
                return
            with env.instance() as instance:
                before = {r.run_id for r in instance.get_runs()}
            os.sync()
            warm(files)
            progress("  kts sync, nothing to copy …")
            second = run_sync(env)
            if second["copied_segments"] != 0:
                raise SystemExit(f"the second kts sync copied {second['copied_segments']} segments: {second['stdout']}")
            second_phases = sync_phases(env, second["launched"], second["exited"], before)
            progress(f"  sync_noop: {second['seconds']:.2f} s")
            if record:
                rounds["sync_noop"].append(second["seconds"])
                phases["sync_noop"].append(second_phases)
                sync_reports[-1]["sync_noop"] = second["stdout"]
            # `kts status` on the same state: what a no-op sync is held to (issue 10: ≤ 5×).
            gc.collect()
            t0 = time.perf_counter()
            status = subprocess.run([sys.executable, "-m", "kts_assets.cli", "status"], env=env.environ(), cwd=env.kts_home,
                                    capture_output=True, text=True, timeout=SYNC_TIMEOUT_S, check=False)
            seconds = time.perf_counter() - t0
            if status.returncode != 0:
                raise SystemExit(f"kts status exited {status.returncode}:\n{status.stderr[-2000:]}")
            progress(f"  status: {seconds:.2f} s")
            if record:
                rounds["status"].append(seconds)
        finally:
            dbs.drop(url)
            shutil.rmtree(base, ignore_errors=True)

    units: dict[str, Callable[[bool], None]] = {
        "copy_alone": lambda record: run_copy("copy_alone", copy_alone, record),
        "copy_parallel": lambda record: run_copy("copy_parallel", copy_parallel, record),
        "sync": run_syncs,  # the no-op sync follows the sync: it needs its state
    }
    names = list(units)
    if args.warmup:
        progress("warm-up round (untimed; the correctness checks run here)")
        for name in names:
            units[name](False)
    for round_ in range(args.repeats):
        order = names[round_ % len(names):] + names[: round_ % len(names)]
        progress(f"round {round_ + 1}/{args.repeats}: {', '.join(order)}")
        for name in order:
            units[name](True)

    best = {name: min(s) for name, s in rounds.items() if s}
    med = {name: median(s) for name, s in rounds.items() if s}

    def entry(name: str) -> dict:
        return {"seconds": best[name], "mb_per_s": total_bytes / best[name] / 1e6, "median_seconds": med[name],
                "median_mb_per_s": total_bytes / med[name] / 1e6, "rounds_seconds": rounds[name]}

    phase_medians = {kind: {p: median([r["phases"][p] for r in phases[kind]]) for p in PHASES} for kind in phases if phases[kind]}
    copy_step = [r["phases"]["local_and_remote_segments"] for r in phases["sync"]]
    result = {
        "log_dir": {**sim, "eligible_segments": len(eligible), "files": len(files), "bytes": total_bytes, "log_bytes": log_bytes,
                    "segment_size": args.segment_size, "leader_change_ratio": args.leader_change_ratio,
                    "simulate_seconds": simulate_seconds},
        "copy_alone": entry("copy_alone"),
        "copy_parallel": {**entry("copy_parallel"), "partitions_at_once": PARALLEL_PARTITIONS,
                          "ratio_vs_copy_alone": best["copy_alone"] / best["copy_parallel"],
                          "median_ratio_vs_copy_alone": med["copy_alone"] / med["copy_parallel"]},
        "sync": {**entry("sync"),
                 # Throughput ratio: copy-alone seconds ÷ sync seconds on the same bytes.
                 "ratio_vs_copy_alone": best["copy_alone"] / best["sync"], "median_ratio_vs_copy_alone": med["copy_alone"] / med["sync"],
                 "phases_median_seconds": phase_medians["sync"], "rounds": phases["sync"], "reports": sync_reports},
        "sync_noop": None,  # without --noop
        "sync_per_byte": None,
        "copy_step": {"rounds_seconds": copy_step, "median_seconds": median(copy_step),
                      "mb_per_s": total_bytes / median(copy_step) / 1e6,
                      "ratio_vs_copy_alone": med["copy_alone"] / median(copy_step),
                      "ratio_vs_copy_parallel": med["copy_parallel"] / median(copy_step)},
        "verification": {**verification, "passed": all(v["passed"] for v in verification.values())
                         and {"copy_alone", "copy_parallel", "sync"} <= verification.keys()},
    }
    if rounds["sync_noop"]:
        result["sync_noop"] = {
            "seconds": best["sync_noop"], "median_seconds": med["sync_noop"], "rounds_seconds": rounds["sync_noop"],
            # The fixed cost (start-up, Spark session, Dagster) plus the inventory of every local segment.
            "share_of_sync": best["sync_noop"] / best["sync"],
            "median_share_of_sync": median([n / s for s, n in zip(rounds["sync"], rounds["sync_noop"])]),
            "phases_median_seconds": phase_medians["sync_noop"], "rounds": phases["sync_noop"],
            # Against `kts status` on the same state, in the same round (goal ≤ 5×).
            "status_seconds": best["status"], "status_median_seconds": med["status"], "status_rounds_seconds": rounds["status"],
            "ratio_vs_status": best["sync_noop"] / best["status"],
            "median_ratio_vs_status": median([n / t for n, t in zip(rounds["sync_noop"], rounds["status"])]),
        }
        # Per round the no-op sync ran right after the sync, on its state: the difference is what
        # the bytes cost inside kts sync (the copy, and whatever else grows with them).
        per_byte = [s - n for s, n in zip(rounds["sync"], rounds["sync_noop"])]
        m = median(per_byte)
        result["sync_per_byte"] = {"rounds_seconds": per_byte, "median_seconds": m,
                                   "mb_per_s": total_bytes / m / 1e6 if m > 0 else None,
                                   "ratio_vs_copy_alone": med["copy_alone"] / m if m > 0 else None}
    return result


def versions() -> dict:
    import dagster
    import pyspark

    java = subprocess.run(["java", "-version"], check=False, capture_output=True, text=True)
    return {"python": platform.python_version(), "dagster": dagster.__version__, "pyspark": pyspark.__version__,
            "java": (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 else None}


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    load_before = os.getloadavg()
    git = git_state()
    with tempfile.TemporaryDirectory(prefix="kts-bench-sync-") as tmp:
        dbs = Databases(Path(tmp))
        spark_home = Path(tmp) / "kts_home" / "spark-connect"
        cli_home = cli_server.state_dir(Path(tmp) / "kts_home") if args.cli_server == "standing" else None
        spark_env: dict[str, str] = {}
        try:
            if cli_home is not None:
                # The standing CLI server every sync runs in, as kts's default leaves it between
                # syncs: started once, untimed (its imports are what a first sync pays).
                progress(f"starting the CLI server under {cli_home.parent}")
                cli_server.ensure_running(cli_home, cli_server.code_fingerprint())
            if args.spark == "connect":
                # The standing server every sync attaches to, as kts's embedded default runs: started
                # once, untimed; each sync's fresh KTS_HOME links its spark-connect directory to it.
                progress(f"starting an embedded Spark Connect server under {spark_home.parent}")
                spark_connect.ensure_running(spark_home)
            else:
                spark_env = {"KTS_SPARK_MASTER": "local[*]"}
            result = measure(args, Path(tmp), dbs, spark_env, spark_home if args.spark == "connect" else None, cli_home)
        finally:
            if cli_home is not None and cli_server.stop(cli_home):
                progress("stopped the CLI server")
            dbs.close()
            if spark_connect.stop(spark_home):
                progress("stopped the embedded Spark Connect server")
    load_after = os.getloadavg()
    git_after = git_state()
    return {
        "params": {
            "size_bytes": args.size, "segment_size_bytes": args.segment_size, "partitions": args.partitions,
            "repeats": args.repeats, "warmup": args.warmup, "noop": args.noop, "quick": bool(args.quick), "seed": args.seed,
            "spark": args.spark, "spark_env": spark_env, "cli_server": args.cli_server, "command": [sys.executable, "-m", "kts_assets.cli", "sync"],
            "page_cache": "warm: source files read before every measurement; sync before every one, untimed",
            # Each sync subprocess imports the code on disk at its start, the copies run the code
            # this process imported: if the two states differ, so may the code the rounds ran.
            "database": dbs.info, **versions(), "git": git, "git_after": git_after, "machine": platform.machine(), "cpus": os.cpu_count(),
            # The machine may be shared: load averages (1, 5, 15 minutes) before and after the run.
            "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        },
        **result,
        "runtime_seconds": time.perf_counter() - started,
    }


PHASE_LABELS = {
    "startup": "start-up: python, imports, Definitions, discovery",
    "planning": "run planning (events per partition)",
    "resource_init": "resources (Spark attaches in its first step)",
    "local_and_remote_segments": "step local_and_remote_segments (copy, inventory, checks)",
    "retention_state": "step retention_state",
    "remote_log_index": "step remote_log_index",
    "other_steps": "other steps (none: every check is judged in its asset's step)",
    "dagster_other": "Dagster between steps",
    "exit": "exit (the last event → the process gone)",
}


def table(result: dict) -> str:
    a, p, s, n = result["copy_alone"], result["copy_parallel"], result["sync"], result["sync_noop"]
    b, r = result["sync_per_byte"], result["copy_step"]
    rows = [("measurement", "best s", "median s", "rate", "ratio", "vs")]
    rows.append(("copy alone (copy_log_dir)", f"{a['seconds']:.2f}", f"{a['median_seconds']:.2f}", f"{a['mb_per_s']:,.0f} MB/s", "1.00", "(baseline)"))
    rows.append((f"  info: copy under the copy quota, {p['partitions_at_once']} side by side", f"{p['seconds']:.2f}", f"{p['median_seconds']:.2f}",
                 f"{p['mb_per_s']:,.0f} MB/s", f"{p['ratio_vs_copy_alone']:.2f}", "copy alone"))
    rows.append(("kts sync (subprocess, all of it)", f"{s['seconds']:.2f}", f"{s['median_seconds']:.2f}", f"{s['mb_per_s']:,.1f} MB/s",
                 f"{s['ratio_vs_copy_alone']:.3f}", "copy alone"))
    rows.append(("", "", "", "", f"{s['median_ratio_vs_copy_alone']:.3f}", "copy alone, median rounds"))
    if n is not None:
        rows.append(("kts sync, nothing to copy", f"{n['seconds']:.2f}", f"{n['median_seconds']:.2f}", "", f"{n['share_of_sync']:.2f}",
                     "of kts sync's time (fixed cost + inventory)"))
        rows.append(("", "", "", "", f"{n['median_share_of_sync']:.2f}", "likewise, median of the rounds"))
        rows.append(("kts status (subprocess, same state)", f"{n['status_seconds']:.2f}", f"{n['status_median_seconds']:.2f}", "", "", ""))
        rows.append(("kts sync, nothing to copy ÷ kts status", "", "", "", f"{n['ratio_vs_status']:.2f}", "best rounds (goal ≤ 5)"))
        rows.append(("", "", "", "", f"{n['median_ratio_vs_status']:.2f}", "median of per-round ratios"))
    if b is not None and b["ratio_vs_copy_alone"] is not None:
        rows.append(("kts sync − nothing to copy, per round", "", f"{b['median_seconds']:.2f}", f"{b['mb_per_s']:,.0f} MB/s",
                     f"{b['ratio_vs_copy_alone']:.2f}", "copy alone (medians)"))
    rows.append(("  in kts sync: the copy's step", "", f"{r['median_seconds']:.2f}", f"{r['mb_per_s']:,.0f} MB/s",
                 f"{r['ratio_vs_copy_alone']:.2f}", "copy alone (medians)"))
    lines = format_rows(rows, {1, 2, 3, 4})

    columns = [("sync", s["phases_median_seconds"])] + ([("nothing to copy", n["phases_median_seconds"])] if n is not None else [])
    prow = [("where kts sync's time goes (median s)", *[c for name, _ in columns for c in (name, "share")])]
    for key in PHASES:
        prow.append((PHASE_LABELS[key], *[c for _, ph in columns for c in (f"{ph[key]:.2f}", f"{ph[key] / sum(ph.values()):.0%}")]))
    # Medians of each phase: their sum is not the median sync's time.
    prow.append(("sum of the phase medians", *[c for _, ph in columns for c in (f"{sum(ph.values()):.2f}", "")]))
    lines += [""] + format_rows(prow, set(range(1, len(prow[0]))))
    v = result["verification"]
    lines.append("")
    lines.append(f"verification: {'passed' if v['passed'] else 'FAILED'} "
                 f"({v['sync']['finished_segments']} of {v['sync']['eligible_segments']} eligible segments COPY_SEGMENT_FINISHED after kts sync, "
                 f"{v['sync']['compared_segments']} compared byte for byte; runs {', '.join(v['sync']['run_statuses'])})")
    for name in ("copy_alone", "copy_parallel", "sync"):
        for problem in v.get(name, {}).get("problems", []):
            lines.append(f"  {name}: {problem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=None, help=".log bytes in closed segments (default 1GiB; 32MiB with --quick)")
    parser.add_argument("--segment-size", type=parse_size, default=None, help="segment.bytes (default 64MiB; 4MiB with --quick)")
    parser.add_argument("--partitions", type=int, default=None, help="partitions over two topics (default 8; 4 with --quick)")
    parser.add_argument("--leader-change-ratio", type=float, default=0.0001,
                        help="leader changes per batch per partition (default 0.0001, ~1-2 per 64 MiB segment; see bench/copy.py)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds; each measurement keeps its best (default 5; 1 with --quick)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", default=None,
                        help="skip the untimed warm-up round (default: one, none with --quick)")
    parser.add_argument("--noop", action=argparse.BooleanOptionalAction, default=None,
                        help="after every sync, time a second one with nothing to copy (default: yes; no with --quick)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round, no warm-up, no no-op sync: a smoke run, not a measurement")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spark", choices=["connect", "classic"], default="connect",
                        help="connect: every sync attaches to one standing Spark Connect server (kts's default); "
                             "classic: each sync starts its own in-process JVM (KTS_SPARK_MASTER=local[*])")
    parser.add_argument("--cli-server", choices=["standing", "off"], default="standing",
                        help="standing: every sync runs in one standing CLI server (kts's default, KTS_CLI_SERVER=on); "
                             "off: each sync is a fresh Python process that imports everything (KTS_CLI_SERVER=off)")
    add_json_argument(parser, "sync")
    args = parser.parse_args(argv)
    pick = 1 if args.quick else 0
    for name, values in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, values[pick])
    if args.warmup is None:
        args.warmup = not args.quick
    if args.noop is None:
        args.noop = not args.quick
    for name in ("repeats", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.segment_size < 64 * 1024:
        parser.error("--segment-size must be at least 64KiB")

    result = run(args)
    print(table(result))
    p, d = result["params"], result["log_dir"]
    load = p["load_average"]
    print(f"\n{d['bytes'] / MiB:,.0f} MiB in {d['files']} files ({d['eligible_segments']} segments, {d['log_bytes'] / MiB:,.0f} MiB of .log, "
          f"over {d['partitions']} partitions); best of {p['repeats']}{' after a warm-up round' if p['warmup'] else ''}; "
          f"PostgreSQL {p['database'].get('server_version')} ({p['database']['source']}, fsync={p['database'].get('fsync')}); "
          f"dagster {p['dagster']}, pyspark {p['pyspark']}, {p['java']}; python {p['python']}, {p['cpus']} CPUs, "
          f"load {load['before'][0]:.1f}→{load['after'][0]:.1f} (5 min {load['before'][1]:.1f}→{load['after'][1]:.1f}); "
          f"{result['runtime_seconds']:.0f} s")
    write_json(args.json, result)
    if p["git"] != p["git_after"]:
        progress(f"warning: the code changed during the run (git {p['git']} → {p['git_after']}); the rounds may have run different code")
    return 0 if result["verification"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
