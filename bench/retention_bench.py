"""Retention at scale: a plan over a partition with 1,000,000 remote segment rows in the store, and
expiry throughput (segments deleted per second) on a directory tier and on S3 (moto's HTTP server).

    .venv/bin/python bench/retention_bench.py [--rows 1000000] [--expire-share 0.1] [--segments 1000] [--rounds 3]
                                              [--only plan|expiry] [--quick] [--json PATH]

Plan: ``expiry.plan_partition`` for a partition whose finished segments are bulk-inserted rows
(``--expire-share`` of them old enough for retention.ms). Baselines from the same run: a raw
psycopg2 read of the four columns retention needs for every row (what any full-scan plan pays at
least), and the store's full listing (``list_remote_log_segments``, what the plan read before it
streamed). Goal (issue 12): ≤ 2 s for the plan.

Expiry: ``--segments`` real segments copied to a tier, then expired by ``expire_partition`` (in
batches through DELETE_SEGMENT_STARTED → objects → DELETE_SEGMENT_FINISHED), planned and carried out;
baseline: deleting the same objects with one ``delete_objects`` call (the tier's own batched delete, no
bookkeeping), right after. ``--rounds`` rounds (a partition each); the ratio reported is their median.
Goal (issue 33): expiry ≤ 2 × the baseline on both tiers.

Prints a table on stdout, progress on stderr, and writes JSON (default bench/results/retention.json).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from benchlib import add_json_argument, bench_database, copy_pass, format_rows, git_state, progress, write_json

from kts_resources.tiering.expiry import expire_partition, plan_partition
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.tiering.quotas import ManualClock
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.factory import remote_storage_from_uri

T0 = 1_700_000_000_000
RETENTION_MS = 7 * 24 * 3_600_000


def fill(store: RemoteLogMetadataStore, rows: int) -> TopicIdPartition:
    """One partition with ``rows`` COPY_SEGMENT_FINISHED segments of 100 offsets, one per second."""
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition("retention.bench", 0))
    store.ensure_topic(tip.topic, tip.topic_id, {"retention.ms": RETENTION_MS})
    with store.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO partitions (topic_id, partition, topic, highest_copied_offset) VALUES (%s, 0, %s, %s)",
                             (tip.topic_id, tip.topic, rows * 100 - 1))
        conn.exec_driver_sql(
            """INSERT INTO remote_segments (segment_id, topic_id, partition, start_offset, end_offset, max_timestamp_ms,
                                            size_bytes, leader_epochs, state, broker_id, event_timestamp_ms)
               SELECT md5(%(t)s || i)::uuid, %(id)s, 0, i * 100, i * 100 + 99, %(t0)s + i * 1000, 1048576,
                      jsonb_build_object('0', i * 100), 'COPY_SEGMENT_FINISHED', 0, %(t0)s
               FROM generate_series(0, %(n)s - 1) AS i""",
            {"t": str(tip.topic_id), "id": tip.topic_id, "t0": T0, "n": rows})
        conn.exec_driver_sql(
            """INSERT INTO remote_segment_leader_epochs (segment_id, leader_epoch, topic_id, partition, start_offset,
                                                         end_offset, referenced, copied)
               SELECT md5(%(t)s || i)::uuid, 0, %(id)s, 0, i * 100, i * 100 + 99, true, true
               FROM generate_series(0, %(n)s - 1) AS i""",
            {"t": str(tip.topic_id), "id": tip.topic_id, "n": rows})
        conn.exec_driver_sql("ANALYZE remote_segments; ANALYZE remote_segment_leader_epochs")
    return tip


def best(fn, repeats: int) -> tuple[float, object]:
    seconds, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        seconds = min(seconds, time.perf_counter() - started)
    return seconds, result


def plan_bench(url: str, rows: int, share: float, repeats: int) -> dict:
    store = RemoteLogMetadataStore.from_url(url)
    try:
        progress(f"inserting {rows:,} remote segment rows")
        tip = fill(store, rows)
        now = T0 + int(rows * share) * 1000 + RETENTION_MS - 1
        plan_s, plan = best(lambda: plan_partition(None, tip, store, now_ms=now), repeats)
        expected = int(rows * share)
        if len(plan.remote.expired) != expected:
            raise SystemExit(f"retention_bench: the plan expires {len(plan.remote.expired)} segments, expected {expected}")

        def raw_scan() -> int:
            raw = store.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute("SELECT start_offset, end_offset, max_timestamp_ms, size_bytes FROM remote_segments "
                            "WHERE topic_id = %s AND partition = 0 AND state = 'COPY_SEGMENT_FINISHED' ORDER BY start_offset",
                            (str(tip.topic_id),))
                return len(cur.fetchall())
            finally:
                raw.close()

        raw_s, _ = best(raw_scan, repeats)
        progress("listing every row through the store (the pre-streaming plan's read)")
        list_s, listed = best(lambda: store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED}), 1)
        assert len(listed) == rows
        return {"rows": rows, "expired": expected, "plan_s": plan_s, "raw_scan_s": raw_s, "full_listing_s": list_s}
    finally:
        store.close()


def expiry_bench(url: str, tmp: Path, tier: str, segments: int, rounds: int) -> dict:
    """Seconds to expire ``segments`` copied segments vs one batched delete of the same objects,
    in ``rounds`` rounds (one partition each), the two measured back to back in each round so that
    a machine's load changing between rounds changes both alike."""
    store = RemoteLogMetadataStore.from_url(url)
    server = None
    try:
        if tier == "s3":
            import boto3
            from moto.server import ThreadedMotoServer

            from kts_resources.remote_storage.factory import s3_client
            from kts_resources.remote_storage.s3 import S3RemoteStorage

            # moto accepts any credentials; boto3 needs some to sign with.
            for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
                os.environ.setdefault(name, value)
            import logging

            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                         aws_secret_access_key="bench").create_bucket(Bucket="kts-bench")
            storage = S3RemoteStorage(s3_client(endpoint), "kts-bench", "tiered")
            baseline = S3RemoteStorage(s3_client(endpoint), "kts-bench", "baseline")
        else:
            storage = remote_storage_from_uri((tmp / f"remote-{tier}").as_uri())
            baseline = remote_storage_from_uri((tmp / f"baseline-{tier}").as_uri())
        root = tmp / f"logs-{tier}"
        topic = f"expiry-{tier}"
        simulate(root, SimulationConfig(seed=2, topics=(topic,), partitions=rounds, total_bytes=rounds * segments * 8 * 1024,
                                        segment_bytes=8 * 1024, record_size=256, codecs=("none",), transactional_producers=0))
        progress(f"copying {rounds} × ~{segments} segments to the {tier} tier")
        for copied in copy_pass(LogDir(root), store, storage):
            if copied.stopped:
                raise SystemExit(f"retention_bench: the copy to the {tier} tier failed: {copied.stopped}")
        tips = sorted((t for t in store.partitions() if t.topic == topic), key=lambda t: t.partition)
        # The baseline's copy of each partition's objects, under its own prefix.
        keys: dict[int, list[str]] = {t.partition: [] for t in tips}
        for tip in tips:
            for obj in storage.list_objects(storage.keys.partition_prefix(tip)):
                key = baseline.keys.root + obj.key[len(storage.keys.root):]
                baseline.put_object(key, storage.fetch_object(obj.key))
                keys[tip.partition].append(key)
        store.set_topic_config(topic, "retention.ms", 1)
        runs = []
        for tip in tips:
            finished = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
            started = time.perf_counter()
            # Planned and carried out, as retention_state does (the plan once, on the driver).
            result = expire_partition(plan_partition(None, tip, store, now_ms=T0 * 2), None, store, storage, clock=ManualClock(T0 * 2))
            expiry_s = time.perf_counter() - started
            assert len(result.remote_deleted) == len(finished), (len(result.remote_deleted), len(finished))
            started = time.perf_counter()
            baseline.delete_objects(keys[tip.partition])
            delete_s = time.perf_counter() - started
            runs.append({"segments": len(finished), "objects": len(keys[tip.partition]), "expiry_s": expiry_s,
                         "batched_delete_s": delete_s, "ratio": expiry_s / delete_s})
        ratios = sorted(r["ratio"] for r in runs)
        return {"rounds": runs, "median_ratio": ratios[len(ratios) // 2], "min_ratio": ratios[0], "max_ratio": ratios[-1],
                "segments_per_s": sum(r["segments"] for r in runs) / sum(r["expiry_s"] for r in runs)}
    finally:
        store.close()
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--expire-share", type=float, default=0.1)
    parser.add_argument("--segments", type=int, default=1000, help="segments expired per round")
    parser.add_argument("--rounds", type=int, default=3, help="expiry rounds per tier (one partition each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("plan", "expiry"), help="run one of the two parts")
    parser.add_argument("--quick", action="store_true", help="20,000 rows and 20 segments: a smoke run")
    add_json_argument(parser, "retention")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.segments, args.repeats, args.rounds = 20_000, 20, 1, 1
    with tempfile.TemporaryDirectory(prefix="kts-retention-bench-") as tmpdir, bench_database(Path(tmpdir)) as (url, db):
        plan = plan_bench(url, args.rows, args.expire_share, args.repeats) if args.only != "expiry" else None
        expiry = {tier: expiry_bench(url, Path(tmpdir), tier, args.segments, args.rounds)
                  for tier in ("filesystem", "s3")} if args.only != "plan" else {}
    ratios = {f"expiry_over_batched_delete_{t}": e["median_ratio"] for t, e in expiry.items()}
    rows = [("measure", "value")]
    if plan is not None:
        ratios |= {"plan_over_raw_scan": plan["plan_s"] / plan["raw_scan_s"],
                   "full_listing_over_plan": plan["full_listing_s"] / plan["plan_s"]}
        rows.append((f"plan over {plan['rows']:,} rows ({plan['expired']:,} expire), s (goal ≤ 2)", f"{plan['plan_s']:.3f}"))
        rows.append(("plan / raw read of every row's 4 columns", f"{ratios['plan_over_raw_scan']:.2f}"))
        rows.append(("full listing through the store / plan", f"{ratios['full_listing_over_plan']:.1f}"))
    for tier, e in expiry.items():
        rows.append((f"expiry, {tier}: segments deleted per second", f"{e['segments_per_s']:.0f}"))
        rows.append((f"expiry / one batched delete of the same objects, {tier}: median (min–max) of {len(e['rounds'])} (goal ≤ 2)",
                     f"{e['median_ratio']:.2f} ({e['min_ratio']:.2f}–{e['max_ratio']:.2f})"))
    print("\n".join(format_rows(rows, right={1})))
    write_json(args.json, {"params": vars(args) | {"json": str(args.json)}, "plan": plan, "expiry": expiry,
                           "ratios": ratios, "database": db, "git": git_state()})


if __name__ == "__main__":
    main()
