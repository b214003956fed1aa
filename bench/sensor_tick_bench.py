"""How long one tick of the segment roll sensor takes, against Dagster's 60 s tick budget.

    .venv/bin/python bench/sensor_tick_bench.py [--partitions 2000,10000] [--segments 10] [--repeats 5] [--quick] [--json PATH]

For each size it writes a synthetic log dir under a temporary directory: topics of 100 partitions,
each partition ``--segments`` empty segments of a partition-specific size (.log, .index, .timeindex), a producer snapshot, a
leader-epoch-checkpoint, plus the log dir's replication-offset and recovery-point checkpoints — all
the sensor reads, since it never opens a segment. A test Dagster instance (SQLite, temporary)
holds every partition as a dynamic partition; the metadata store is an empty database of the
bench's own (``benchlib.bench_database``), so every closed segment counts as copy lag: the tick
stats every one of them. Then, best of N with the page cache warm:

- baseline "scandir": ``os.scandir`` over every partition dir, names only (the floor: listing);
- "survey": the sensor's pass over the log dir (checkpoints + listings + eligibility), no Dagster;
- "first tick": ``evaluate_tick`` with no cursor, every partition has work → ranged runs + cursor
  (at most MAX_RUNS_PER_TICK runs; the rest wait for later ticks) + copy-lag observations (at most
  MAX_LAG_OBSERVATIONS_PER_TICK), one store query;
- "idle tick": ``evaluate_tick`` with the cursor of every partition requested and its lag
  reported, nothing new (the steady state);
- "retention idle": the retention sensor's tick with every partition planned and none due, no new
  event in the store (its steady state: no partition is planned).

Each is reported in seconds, as a share of the 60 s budget, and as a ratio to the scandir baseline
measured in the same run. Prints a table; writes JSON (default bench/results/sensor_tick.json).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from benchlib import add_json_argument, bench_database, write_json

from kts_assets.partitions import topic_partitions
from kts_assets.sensors import retention_sensor, segment_roll_sensor
from kts_assets.sensors.retention import _encode as encode_retention_cursor
from kts_assets.sensors.cursor import encode_cursor
from kts_assets.sensors.roll import LAG_BYTES, LAG_SEGMENTS, MAX_LAG_OBSERVATIONS_PER_TICK, copy_lags, survey_log_dirs
from kts_resources.kafka.checkpoints import write_offset_checkpoint
from kts_resources.kafka.logdir import offset_file_name
from kts_resources.kafka.partition import TopicPartition
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource

TICK_BUDGET_S = 60.0  # Dagster's default sensor evaluation timeout
PARTITIONS_PER_TOPIC = 100
SEGMENT_OFFSETS = 50_000  # offsets per segment


def write_log_dir(root: Path, partitions: int, segments: int) -> list[str]:
    """A synthetic log dir; returns the partition keys in (topic, partition) order."""
    high_watermarks: dict[TopicPartition, int] = {}
    for i in range(partitions):
        tp = TopicPartition(f"topic-{i // PARTITIONS_PER_TOPIC:04d}", i % PARTITIONS_PER_TOPIC)
        directory = root / tp.dir_name
        directory.mkdir()
        # Segment sizes differ between partitions, so their offsets (and the cursor) do too.
        step = SEGMENT_OFFSETS + (i * 7919) % SEGMENT_OFFSETS
        bases = [s * step for s in range(segments)]
        for base in bases:
            for suffix in (".log", ".index", ".timeindex"):
                open(directory / offset_file_name(base, suffix), "wb").close()
        open(directory / offset_file_name(bases[-1], ".snapshot"), "wb").close()
        (directory / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
        high_watermarks[tp] = bases[-1] + step // 2  # inside the active segment
    write_offset_checkpoint(root / "replication-offset-checkpoint", high_watermarks)
    write_offset_checkpoint(root / "recovery-point-offset-checkpoint", high_watermarks)
    return [tp.dir_name for tp in sorted(high_watermarks)]


def scandir_all(root: Path, keys: list[str]) -> int:
    names = 0
    for key in keys:
        with os.scandir(root / key) as entries:
            for entry in entries:
                names += len(entry.name) > 0
    return names


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure(partitions: int, segments: int, repeats: int) -> dict:
    with (tempfile.TemporaryDirectory(prefix="kts-sensor-bench-") as tmp, dg.instance_for_test() as instance,
          bench_database(Path(tmp)) as (database_url, _)):
        root = Path(tmp) / "logs"
        root.mkdir()
        t0 = time.perf_counter()
        keys = write_log_dir(root, partitions, segments)
        instance.add_dynamic_partitions(topic_partitions.name, keys)
        setup_s = time.perf_counter() - t0
        # The store is empty: nothing copied, so every closed segment is copy lag (the most stats).
        resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(root)),
                     "metadata_store": MetadataStoreResource(database_url=database_url)}

        def tick(cursor=None):
            context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
            return segment_roll_sensor.evaluate_tick(context)

        def retention_tick(cursor):
            context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
            return retention_sensor.evaluate_tick(context)

        # The retention sensor's steady state: every partition planned, none due for a year, no new event.
        # Its state is kept in the instance: one tick over the inline form stores it and hands back the short cursor.
        retention_steady = retention_tick(encode_retention_cursor(
            0, {key: int(time.time() * 1000) + 365 * 86_400_000 for key in keys}, set())).cursor

        scandir_all(root, keys)  # warm the page cache and the dentry cache
        # The steady state: every partition's eligible segment already requested, its lag reported.
        survey = survey_log_dirs([root], keys)
        lags = copy_lags(survey, {key: -1 for key in survey.directories})
        state = encode_cursor(survey.eligible, {LAG_SEGMENTS: {k: n for k, (n, _) in lags.items()},
                                                LAG_BYTES: {k: b for k, (_, b) in lags.items()}})
        steady = tick(state).cursor  # the state kept in the instance, the short cursor naming it
        # Interleaved rounds, so that a busy neighbour slows every measurement alike.
        timings: dict[str, float] = {"scandir": float("inf"), "survey": float("inf"),
                                     "first_tick": float("inf"), "idle_tick": float("inf"), "retention_idle": float("inf")}
        first = idle = None
        for _ in range(repeats):
            for name, fn in (("scandir", lambda: scandir_all(root, keys)),
                             ("survey", lambda: survey_log_dirs([root], keys)),
                             ("first_tick", tick)):
                elapsed, result = best_of(1, fn)
                timings[name] = min(timings[name], elapsed)
                if name == "first_tick":
                    first = result
            elapsed, idle = best_of(1, lambda: tick(steady))
            timings["idle_tick"] = min(timings["idle_tick"], elapsed)
            elapsed, retention_idle = best_of(1, lambda: retention_tick(retention_steady))
            timings["retention_idle"] = min(timings["retention_idle"], elapsed)
            assert retention_idle.run_requests == []
        assert first is not None and idle is not None
        assert sum(int(r.tags["kts/partitions_requested"]) for r in first.run_requests) <= partitions
        assert idle.run_requests == [] and not idle.asset_events
        assert len(first.asset_events) == min(partitions, MAX_LAG_OBSERVATIONS_PER_TICK)
        return {
            "partitions": partitions,
            "segments_per_partition": segments,
            "files": partitions * (3 * segments + 2),
            "setup_s": round(setup_s, 2),
            "seconds": {k: round(v, 5) for k, v in timings.items()},
            "share_of_60s_budget": {k: round(v / TICK_BUDGET_S, 6) for k, v in timings.items() if k != "scandir"},
            "ratio_vs_scandir": {k: round(v / timings["scandir"], 2) for k, v in timings.items()},
            "first_tick_runs": len(first.run_requests),
            "first_tick_partitions": sum(int(r.tags["kts/partitions_requested"]) for r in first.run_requests),
            "cursor_bytes": len(steady),
            "state_bytes": len(state),
        }


def print_table(results: list[dict]) -> None:
    print(f"{'partitions':>10}  {'measurement':<12} {'seconds':>9}  {'of 60 s':>8}  {'vs scandir':>10}")
    print("-" * 56)
    for r in results:
        for name in ("scandir", "survey", "first_tick", "idle_tick", "retention_idle"):
            seconds = r["seconds"][name]
            share = "" if name == "scandir" else f"{100 * seconds / TICK_BUDGET_S:7.3f}%"
            ratio = "(baseline)" if name == "scandir" else f"{r['ratio_vs_scandir'][name]:10.2f}"
            print(f"{r['partitions']:>10}  {name:<12} {seconds:9.4f}  {share:>8}  {ratio:>10}")
        print(f"{'':>10}  first tick: {r['first_tick_runs']} runs over {r['first_tick_partitions']:,} partitions;"
              f" steady cursor {r['cursor_bytes']:,} bytes (its state in the instance {r['state_bytes']:,});"
              f" {r['files']:,} files")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="2000,10000", help="comma-separated sizes")
    parser.add_argument("--segments", type=int, default=10, help="segments per partition")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 and 1000 partitions, 3 segments, 1 round")
    add_json_argument(parser, "sensor_tick")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.partitions.split(",") if s.strip()]
    segments, repeats = args.segments, args.repeats
    if args.quick:
        sizes, segments, repeats = [200, 1000], 3, 1

    started = time.perf_counter()
    results = []
    for size in sizes:
        print(f"{size} partitions × {segments} segments …", file=sys.stderr)
        results.append(measure(size, segments, repeats))
    print_table(results)
    elapsed = time.perf_counter() - started
    print(f"\nbest of {repeats}; python {platform.python_version()}, {os.cpu_count()} CPUs; {elapsed:.0f} s")
    write_json(args.json, {
        "params": {"partitions": sizes, "segments": segments, "repeats": repeats, "quick": args.quick,
                   "tick_budget_s": TICK_BUDGET_S, "python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
