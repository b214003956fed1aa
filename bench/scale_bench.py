"""kts at a broker's real size: 4,000 partitions over 200 topics, each with a few small rolled
segments, synced once; then what each of kts's everyday operations costs at that size, as ratios
measured in the same run, and against the same operations at 400 partitions.

    .venv/bin/python bench/scale_bench.py [--partitions 400,4000] [--segments 3] [--quick] [--json PATH]

For each size (``--partitions``, 20 partitions a topic) it writes a broker log dir with the
simulator's broker (``BrokerLogDir``): every partition ``--segments`` rolled segments of one small
batch each (records stamped ten days ago, an hour apart per segment), the high watermark at the log
end. One ``kts sync`` tiers it (untimed, on the standing embedded Spark Connect server, into a fresh
database and directory tier), and then, in this order, on that one world:

- ``kts status`` and a no-op ``kts sync`` (subprocesses, as a user runs them): goal no-op ≤ 3 × status;
- one new rolled segment appended to every partition; one tick of each sensor with that work
  waiting (``evaluate_tick`` in-process on the world's instance): goal ≤ 1 % of Dagster's 60 s;
- the copy procedure alone (``benchlib.copy_pass``) over those new segments, into a clone of the
  world's database (same copied state) and a fresh tier: the baseline of
- ``kts sync`` copying the same new segments: goal ≥ 0.3 × the copy alone;
- broker retention set so that every partition's oldest segment is due: one tick of the retention
  sensor (its first: every partition planned) and a retention pass, ``expiry_job`` over every
  partition in the ranges ``kts sync`` uses (in-process, as the daemon's runs execute it);
- the GraphQL query behind the remote_segments partitions page (the UI's ``PartitionHealthQuery``),
  in-process on a workspace of kts's definitions: goal ≤ 5 × the same query at the smallest size;
- the event-log rows (Dagster's ``event_logs``) each pass wrote, per partition, by event type:
  goal constant across sizes.

The machine may be shared: every goal is a ratio of measurements made in the same run; the load
average is recorded beside them. Prints a table on stdout, progress on stderr, and writes JSON
(default bench/results/scale.json).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, format_rows, git_state, progress, write_json
from sync_bench import SYNC_TIMEOUT_S, Databases, make_sync_env, run_sync, sync_phases, timed_copy_pass, versions

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.metadata import database
from kts_assets.cli import server as cli_server
from kts_resources.spark import connect_server as spark_connect

PARTITIONS_PER_TOPIC = 20
RECORDS_PER_SEGMENT = 20
VALUE_BYTES = 200
HOUR_MS = 3_600_000
TICK_BUDGET_S = 60.0  # Dagster's default sensor evaluation timeout
GOALS = {"noop_over_status": 3.0, "sync_vs_copy": 0.3, "tick_share": 0.01, "graphql_growth": 5.0}

# The UI's query for an asset's partitions page (dagster-webserver's PartitionHealthQuery, the
# statuses part kts's dynamic partitions answer).
PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
      }
    }
  }
}
"""


# --- the log dir --------------------------------------------------------------------------------


def topic_partitions(partitions: int) -> list[tuple[str, int]]:
    return [(f"scale.t{i // PARTITIONS_PER_TOPIC:03d}", i % PARTITIONS_PER_TOPIC) for i in range(partitions)]


def append_rolled_segments(root: Path, partitions: int, segments: int, first_timestamp_ms: int) -> None:
    """``segments`` rolled segments appended to every partition (made if new), one batch of
    ``RECORDS_PER_SEGMENT`` records each, the k-th stamped ``first_timestamp_ms`` + k hours; the
    high watermark at the log end, so every rolled segment is copy-eligible."""
    with BrokerLogDir(root, LogConfig(segment_bytes=1 << 20), seed=1) as broker:
        for topic, partition in topic_partitions(partitions):
            log = broker.partition(topic, partition)
            for k in range(segments):
                ts = first_timestamp_ms + k * HOUR_MS
                offset = log.log_end_offset
                records = [NewRecord(ts, f"k{offset + i}".encode(), bytes(VALUE_BYTES)) for i in range(RECORDS_PER_SEGMENT)]
                log.append(build_batch(records, base_offset=0), leader_epoch=0)
                log.roll()
            log.update_high_watermark(log.log_end_offset)
        broker.checkpoint()


# --- the world's database and instance ----------------------------------------------------------


def event_rows(url: str) -> dict[str, int]:
    """Rows of Dagster's event log in the world's database, by event type (NULL: plain log lines)."""
    engine = database.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT coalesce(dagster_event_type, 'LOG'), count(*) FROM dagster.event_logs GROUP BY 1").all()
        return {kind: n for kind, n in rows}
    finally:
        engine.dispose()


def rows_written(before: dict[str, int], after: dict[str, int], partitions: int) -> dict:
    by_kind = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    by_kind = {k: n for k, n in by_kind.items() if n}
    total = sum(by_kind.values())
    return {"rows": total, "per_partition": total / partitions, "by_type": by_kind}


def clone_database(dbs: Databases, url: str) -> str:
    """A copy of the world's database (its copied state), made with PostgreSQL's TEMPLATE."""
    source = make_url(url).database
    name = f"{source}_clone"
    with dbs.admin.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{source}' AND pid <> pg_backend_pid()")
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    dbs.names.append(name)
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def set_broker_retention_ms(url: str, value: int) -> None:
    engine = database.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE broker_configs SET value = %s WHERE name = 'log.retention.ms'", (str(value),))
    finally:
        engine.dispose()


@contextmanager
def world_environment(env):
    """This process's environment is the world's while in-process Dagster work runs in it: kts's
    resources and instance read ``KTS_*`` / ``DAGSTER_HOME`` when used."""
    saved = dict(os.environ)
    os.environ.update(env.environ())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- the measurements ---------------------------------------------------------------------------


def timed_sync(env, url: str, partitions: int) -> dict:
    """One ``kts sync``: what it reported, its phases (``sync_bench.sync_phases``) and the event-log rows it wrote."""
    with env.instance() as instance:
        runs_before = {r.run_id for r in instance.get_runs()}
    before = event_rows(url)
    done = run_sync(env)
    phases = sync_phases(env, done["launched"], done["exited"], runs_before)
    return {"seconds": done["seconds"], "copied_segments": done["copied_segments"], "runs": phases["runs"],
            "phases": phases["phases"], "events": rows_written(before, event_rows(url), partitions)}


def timed_status(env) -> float:
    gc.collect()
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kts_assets.cli", "status", "--json"], env=env.environ(), cwd=env.kts_home,
                          capture_output=True, text=True, timeout=SYNC_TIMEOUT_S, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"kts status exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# What a tick says it went through: "planned 135 of 4,000 known partitions", "looked at 232 of …".
WENT_THROUGH = re.compile(r"(?:planned|looked at) (?:all )?([\d,]+)(?: of ([\d,]+))? known partition")


def sensor_ticks(names: list[str], cursors: dict[str, str | None] | None = None) -> dict[str, dict]:
    """One tick of each named sensor on the world's instance (this process's environment):
    seconds, what it asked for, and how many partitions it planned or looked at (the retention and
    index-rebuild sensors work through as many as their time budget allows)."""
    import dagster as dg

    from kts_assets.definitions import default_resources, defs
    from kts_assets.instance import dagster_instance
    from kts_assets.sensors import index_rebuild

    # Every finished segment's index is checked, as in the steady state (segments finished more
    # than ten minutes ago): the world's segments were all finished by its first sync just now.
    index_rebuild.FINISHED_GRACE_MS = 0
    out = {}
    instance = dagster_instance()
    lines = _Lines()
    try:
        resources = default_resources()
        for name in names:
            sensor = defs.resolve_sensor_def(name)
            context = dg.build_sensor_context(instance=instance, cursor=(cursors or {}).get(name), resources=resources,
                                              definitions=defs)
            lines.lines.clear()
            context.log.addHandler(lines)
            gc.collect()
            t0 = time.perf_counter()
            result = sensor.evaluate_tick(context)
            seconds = time.perf_counter() - t0
            skip = result.skip_message if isinstance(result.skip_message, str) else None
            said = next((m for m in (WENT_THROUGH.search(text) for text in [skip or "", *lines.lines]) if m), None)
            out[name] = {"seconds": seconds, "share_of_budget": seconds / TICK_BUDGET_S,
                         "run_requests": len(result.run_requests or []), "skip": skip,
                         "partitions_worked": int(said[1].replace(",", "")) if said else None}
            progress(f"  tick {name}: {seconds:.3f} s, {out[name]['run_requests']} run requests"
                     + (f", {out[name]['partitions_worked']} partitions planned or looked at" if said else ""))
    finally:
        instance.dispose()
    return out


def _planned(tick: dict) -> str:
    return f", {tick['partitions_worked']:,} partitions worked" if tick.get("partitions_worked") is not None else ""


def copy_alone(url: str, root: Path, dest: Path) -> tuple[float, int]:
    """Seconds of the copy procedure alone over every partition, and the segments it copied."""
    seconds, results = timed_copy_pass(root, url, dest)
    stopped = [r.stopped or r.skipped for r in results if r.stopped or r.skipped]
    if stopped:
        raise SystemExit(f"scale_bench: the copy alone stopped: {stopped[:3]}")
    return seconds, sum(len(r.copied) for r in results)


def retention_pass(keys: list[str]) -> dict:
    """``expiry_job`` over every partition, in the ranges a pass uses, in-process (the world's environment)."""
    from kts_assets.batching import batch_key_ranges
    from kts_assets.definitions import defs
    from kts_assets.instance import dagster_instance
    from kts_assets.jobs import EXPIRY_JOB_NAME
    from kts_assets.partitions import topic_partitions as partitions_def
    from kts_assets.sync import PassOutcome, _quiet_dagster_warnings, run_batch

    _quiet_dagster_warnings()
    instance = dagster_instance()
    try:
        job = defs.resolve_job_def(EXPIRY_JOB_NAME)
        ordered = instance.get_dynamic_partitions(partitions_def.name)
        outcome = PassOutcome()
        run_config = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
        gc.collect()
        t0 = time.perf_counter()
        batches = batch_key_ranges(ordered, keys)
        for batch in batches:
            run_batch(job, instance, batch, run_config, outcome, lambda line: progress(f"  {line}"))
        seconds = time.perf_counter() - t0
    finally:
        instance.dispose()
    if outcome.failed:
        raise SystemExit(f"scale_bench: the retention pass failed partitions: {list(outcome.failed.items())[:3]}")
    return {"seconds": seconds, "runs": len(batches)}


def finished_segments(url: str) -> dict[str, int]:
    engine = database.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT state, count(*) FROM remote_segments GROUP BY 1").all()
        return {state: n for state, n in rows}
    finally:
        engine.dispose()


def partitions_page_query(repeats: int) -> dict:
    """The remote_segments partitions page's query, in-process on a workspace of kts's definitions
    and the world's instance: best of ``repeats`` seconds."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    from kts_assets.instance import dagster_instance

    instance = dagster_instance()
    origin = InProcessCodeLocationOrigin(
        loadable_target_origin=LoadableTargetOrigin(executable_path=sys.executable, python_file=None,
                                                    module_name="kts_assets.definitions", working_directory=str(REPO_ROOT)),
        location_name="kts")
    best, materialized = float("inf"), 0
    try:
        with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process_context:
            for _ in range(repeats):
                context = process_context.create_request_context()
                gc.collect()
                t0 = time.perf_counter()
                result = execute_dagster_graphql(context, PARTITION_HEALTH_QUERY, {"assetKey": {"path": ["remote_segments"]}})
                best = min(best, time.perf_counter() - t0)
                if result.errors:
                    raise SystemExit(f"scale_bench: GraphQL errors: {result.errors}")
                node = result.data["assetNodeOrError"]
                materialized = len(node["assetPartitionStatuses"]["materializedPartitions"])
    finally:
        instance.dispose()
    return {"seconds": best, "materialized_partitions": materialized}


def one_size(partitions: int, segments: int, tmp: Path, dbs: Databases, spark_home: Path, cli_home: Path | None,
             ticks: list[str], full: bool, ticks_only: bool = False, sync_only: bool = False) -> dict:
    """Every measurement on one world of ``partitions``; not ``full``: the first sync, ``kts status``,
    the sensor ticks and the partitions page only (no further passes: each costs minutes there);
    ``ticks_only``: the first sync (untimed) and the sensor ticks alone; ``sync_only``: the syncs'
    rows only (first sync, status, no-op sync, copy alone and the sync of the new segments), no
    ticks, retention pass or partitions page."""
    progress(f"--- {partitions} partitions ---")
    base = tmp / f"world-{partitions}"
    root = base / "logs"
    url = dbs.fresh()
    env = make_sync_env(base, url, root, {}, spark_home, cli_home)
    now_ms = int(time.time() * 1000)
    first_ts = now_ms - 10 * 24 * HOUR_MS  # a week and a half ago: the oldest segment is the one retention will take
    out: dict = {"partitions": partitions, "topics": -(-partitions // PARTITIONS_PER_TOPIC), "segments_per_partition": segments}
    t0 = time.perf_counter()
    append_rolled_segments(root, partitions, segments, first_ts)
    out["write_seconds"] = time.perf_counter() - t0
    keys = sorted(f"{t}-{p}" for t, p in topic_partitions(partitions))

    progress("first kts sync (untimed)")
    out["first_sync"] = first = timed_sync(env, url, partitions)
    progress(f"  {first['seconds']:.1f} s, {first['copied_segments']} segments")

    if ticks_only:
        append_rolled_segments(root, partitions, 1, first_ts + segments * HOUR_MS)
        with world_environment(env):
            out["ticks"] = sensor_ticks(ticks)
        set_broker_retention_ms(url, int(time.time() * 1000) - (first_ts + HOUR_MS // 2))
        with world_environment(env):
            out["ticks"].update(sensor_ticks(["retention_sensor"]))
        return out

    progress("kts status")
    out["status_seconds"] = timed_status(env)
    progress(f"  {out['status_seconds']:.2f} s")
    if full:
        progress("a no-op kts sync")
        out["noop_sync"] = noop = timed_sync(env, url, partitions)
        if noop["copied_segments"]:
            raise SystemExit(f"scale_bench: the no-op sync copied {noop['copied_segments']} segments")
        out["noop_over_status"] = noop["seconds"] / out["status_seconds"]
        progress(f"  {noop['seconds']:.2f} s")

    progress("one new rolled segment in every partition")
    append_rolled_segments(root, partitions, 1, first_ts + segments * HOUR_MS)
    clone = clone_database(dbs, url) if full else None  # the copy alone's store: the world's copied state
    out["ticks"] = {}
    if not sync_only:
        with world_environment(env):
            progress("sensor ticks with that work waiting")
            out["ticks"] = sensor_ticks(ticks)

    if not full:
        set_broker_retention_ms(url, int(time.time() * 1000) - (first_ts + HOUR_MS // 2))
        with world_environment(env):
            out["ticks"].update(sensor_ticks(["retention_sensor"]))
            out["partitions_page"] = partitions_page_query(3)
        progress(f"  partitions page {out['partitions_page']['seconds']:.3f} s")
        return out

    progress("the copy procedure alone over the new segments (a clone of the world's store)")
    copy_s, copied = copy_alone(clone, root, base / "remote-copy-alone")
    dbs.drop(clone)
    progress(f"  {copy_s:.2f} s, {copied} segments")
    sync = timed_sync(env, url, partitions)
    if sync["copied_segments"] != copied:
        raise SystemExit(f"scale_bench: kts sync copied {sync['copied_segments']} segments, the copy alone {copied}")
    out["copy_alone"] = {"seconds": copy_s, "segments": copied}
    out["sync"] = {**sync, "ratio_vs_copy_alone": copy_s / sync["seconds"]}
    progress(f"  kts sync {sync['seconds']:.2f} s: {copy_s / sync['seconds']:.2f} of the copy alone")
    if sync_only:
        return out

    progress("retention: every partition's oldest segment due")
    # The oldest segments' records are stamped first_ts, the next ones an hour later.
    set_broker_retention_ms(url, int(time.time() * 1000) - (first_ts + HOUR_MS // 2))
    before_states = finished_segments(url)
    with world_environment(env):
        out["ticks"].update(sensor_ticks(["retention_sensor"]))
        before = event_rows(url)
        expiry = retention_pass(keys)
    after_states = finished_segments(url)
    expired = before_states.get("COPY_SEGMENT_FINISHED", 0) - after_states.get("COPY_SEGMENT_FINISHED", 0)
    out["retention_pass"] = {**expiry, "expired_segments": expired, "events": rows_written(before, event_rows(url), partitions)}
    progress(f"  {expiry['seconds']:.2f} s, {expired} segments expired in {expiry['runs']} runs")
    if expired != partitions:
        raise SystemExit(f"scale_bench: the retention pass expired {expired} segments, not one per partition ({partitions})")

    progress("the partitions page's GraphQL query")
    with world_environment(env):
        out["partitions_page"] = partitions_page_query(3)
    progress(f"  {out['partitions_page']['seconds']:.3f} s")
    return out


def run(args: argparse.Namespace) -> dict:
    sizes = [int(s) for s in (args.partitions or ("40,200" if args.quick else "400,4000")).split(",")]
    started = time.perf_counter()
    load_before = os.getloadavg()
    git = git_state()
    ticks = ["partition_discovery_sensor", "segment_roll_sensor", "index_rebuild_sensor", "dead_run_sensor", "topic_deletion_sensor"]
    results = []
    with tempfile.TemporaryDirectory(prefix="kts-bench-scale-") as tmp:
        dbs = Databases(Path(tmp))
        spark_home = Path(tmp) / "kts_home" / "spark-connect"
        cli_home = cli_server.state_dir(Path(tmp) / "kts_home") if args.cli_server == "standing" else None
        try:
            # The standing servers every sync runs in, as kts's defaults leave them between syncs:
            # started once, untimed (sync_bench does the same).
            if cli_home is not None:
                progress(f"starting the CLI server under {cli_home.parent}")
                cli_server.ensure_running(cli_home, cli_server.code_fingerprint())
            progress(f"starting an embedded Spark Connect server under {spark_home.parent}")
            spark_connect.ensure_running(spark_home)
            for n in sizes:
                results.append(one_size(n, args.segments, Path(tmp), dbs, spark_home, cli_home, ticks,
                                        full=args.sync_only or args.full_up_to is None or n <= args.full_up_to,
                                        ticks_only=args.ticks_only, sync_only=args.sync_only))
                write_json(args.json, {"partial": True, "sizes": results})  # a later size may take hours
        finally:
            if cli_home is not None and cli_server.stop(cli_home):
                progress("stopped the CLI server")
            dbs.close()
            if spark_connect.stop(spark_home):
                progress("stopped the embedded Spark Connect server")
    smallest = results[0]
    for r in results:
        if "partitions_page" in r:
            r["partitions_page"]["ratio_vs_smallest"] = r["partitions_page"]["seconds"] / smallest["partitions_page"]["seconds"]
    return {"params": {"partitions": sizes, "segments": args.segments, "quick": bool(args.quick), "cli_server": args.cli_server,
                       "ticks_only": bool(args.ticks_only), "sync_only": bool(args.sync_only),
                       "database": dbs.info, **versions(), "git": git, "cpus": os.cpu_count(), "machine": platform.machine(),
                       "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}},
            "goals": GOALS, "sizes": results, "runtime_seconds": time.perf_counter() - started}


def table(result: dict) -> str:
    rows = [("partitions", "measurement", "seconds", "ratio", "goal")]
    for r in result["sizes"]:
        n = str(r["partitions"])
        rows.append((n, f"first kts sync ({r['first_sync']['copied_segments']} segments, {r['first_sync']['runs']} runs)",
                     f"{r['first_sync']['seconds']:.2f}", "", ""))
        if "status_seconds" in r:
            rows.append((n, "kts status", f"{r['status_seconds']:.2f}", "", ""))
        if "noop_sync" in r:
            rows.append((n, "no-op kts sync ÷ kts status", f"{r['noop_sync']['seconds']:.2f}", f"{r['noop_over_status']:.2f}", "≤ 3"))
        if "sync" in r:
            rows.append((n, "copy alone, one new segment a partition", f"{r['copy_alone']['seconds']:.2f}", "", ""))
            rows.append((n, "kts sync of them ÷ copy alone (throughput)", f"{r['sync']['seconds']:.2f}",
                         f"{r['sync']['ratio_vs_copy_alone']:.2f}", "≥ 0.3"))
        for name, tick in r["ticks"].items():
            rows.append((n, f"tick {name} (share of 60 s){_planned(tick)}", f"{tick['seconds']:.3f}", f"{tick['share_of_budget']:.2%}", "≤ 1%"))
        if "retention_pass" in r:
            rows.append((n, f"retention pass, {r['retention_pass']['expired_segments']} segments expired",
                         f"{r['retention_pass']['seconds']:.2f}", "", ""))
        if "partitions_page" in r:
            rows.append((n, "partitions page query ÷ smallest size", f"{r['partitions_page']['seconds']:.3f}",
                         f"{r['partitions_page']['ratio_vs_smallest']:.2f}", "≤ 5"))
        for what in (w for w in ("first_sync", "noop_sync", "sync", "retention_pass") if w in r):
            rows.append((n, f"event-log rows per partition: {what.replace('_', ' ')}", "", f"{r[what]['events']['per_partition']:.2f}",
                         "constant"))
    p = result["params"]
    return "\n".join(format_rows(rows, right={0, 2, 3}) + [
        f"\n{p['segments']} rolled segments a partition; load average {p['load_average']['before']} → {p['load_average']['after']}; "
        f"{result['runtime_seconds']:.0f} s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default=None, help="comma-separated sizes; the first is the yardstick (default 400,4000)")
    parser.add_argument("--segments", type=int, default=3, help="rolled segments per partition before the measurements (default 3)")
    parser.add_argument("--quick", action="store_true", help="40 and 200 partitions: a smoke run, not a measurement")
    parser.add_argument("--cli-server", choices=["standing", "off"], default="standing",
                        help="syncs in kts's standing CLI server (its default) or each in a fresh process")
    parser.add_argument("--full-up-to", type=int, default=None,
                        help="sizes above this get the first sync, status, ticks and the partitions page only")
    parser.add_argument("--ticks-only", action="store_true",
                        help="every size gets its first sync (untimed) and the sensor ticks alone")
    parser.add_argument("--sync-only", action="store_true",
                        help="the syncs' rows only at every size: first sync, status, no-op sync, copy alone, sync of one new segment a partition")
    add_json_argument(parser, "scale")
    args = parser.parse_args(argv)
    result = run(args)
    print(table(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
