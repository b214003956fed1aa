"""How fast kts copies segments to the remote tier and keeps their metadata, as ratios against
baselines measured in the same run.

    .venv/bin/python bench/copy_bench.py [--size 512MiB] [--segment-size 64MiB] [--partitions 4]
                                   [--lookup-segments 100000] [--quick] [--repeats N]
                                   [--metadata-repeats N] [--json PATH]

1. Copy throughput to the filesystem backend. A deterministic (seeded) broker log dir is simulated
   so that ``--size`` bytes of .log sit in closed, copy-eligible segments. Exactly the files the
   copy procedure uploads (.log, .index, .timeindex, .txnindex when present, the producer snapshot
   at the next base offset) are then copied, each measurement into a fresh directory:

   - baseline "cp": ``cp`` of those files, one ``cp`` process per partition (GNU cp, which copies
     in the kernel with copy_file_range). The data is left dirty in the page cache;
   - baseline "cp + sync": the same, then ``sync`` of every copied file and directory. kts fsyncs
     every object and the directory it is renamed into, so this is the like-for-like baseline;
   - baseline "cp + sync, partitions side by side": all the ``cp`` processes at once, then the
     same ``sync``: ``copy_pass`` copies four partitions at a time, so ``cp`` gets to as well;
   - "storage": ``FileSystemRemoteStorage.copy_log_segment_data`` for every segment (temporary
     name, CRC-32C of every byte, fsync, rename, fsync the directory; plus the leader-epoch
     lineage, a small extra object that ``cp`` has no counterpart for);
   - "storage_known": the same, handed each .log's CRC-32C as the copy procedure hands it over
     after verifying the segment (the upload compares its own CRC-32C with it);
   - "copy_log_dir": the whole copy procedure (``copy_pass``, four partitions at a time, its
     default and the pipeline's) against the metadata store: partition lock, candidates, CRC check
     of every batch, COPY_SEGMENT_STARTED, upload, COPY_SEGMENT_FINISHED; the store's tables are
     emptied before each round;
   - info "verify": ``verify_segment_file`` (every batch CRC + the file's CRC-32C, read as the copy reads it) over the same .log
     files, to show how much of the procedure's time the check is; and one extra pass of
     ``copy_pass`` with its store and storage wrapped in timers: seconds in the upload, in the
     store, and in the rest (waiting for the verification, listing, checkpoints, lock).

   The simulated log has one leader change per 10,000 batches and partition
   (``--leader-change-ratio``), about 2.5 leader epochs per 64 MiB segment: the simulator's
   default (0.002) gives dozens, which no broker sees, and the store does per-epoch work.

   The page cache is not dropped (that needs root and disturbs whoever else uses the machine);
   instead the source files are read right before every measurement, so every one starts with
   them cached, and ``sync`` runs (untimed) before every measurement so that none inherits
   another's dirty pages.

2. Metadata operations, on the same PostgreSQL:

   - baselines: ``SELECT 1`` round trips on one connection of the store's engine, and one-row
     INSERT + COMMIT (what a durable commit costs on this server);
   - add + finish pairs per second through the API (``add_remote_log_segment_metadata`` +
     ``update_remote_log_segment_metadata(.., COPY_SEGMENT_FINISHED)``, as the copy does);
   - lookup by offset (``remote_log_segment_metadata(tip, epoch, offset)``) in one partition of
     ``--lookup-segments`` finished segments, random offsets with the epoch that wrote them,
     p50/p99 latency; and, as info, the very statement the store sends (captured from the
     engine) run on the raw autocommit cursor: the server's share of a lookup.

   The lookup's segments are bulk-loaded with COPY in exactly the rows the API writes (through
   the API they would take ~10 minutes); before that, a sample is loaded both through the API
   and in bulk, and every table row and every lookup answer are compared, so the bulk path
   cannot drift from the API.

The database is ``KTS_DATABASE_URL``'s server when set (the bench creates its own database there,
so its user needs CREATEDB, and drops it at the end); else an embedded server under a temporary
KTS_HOME, with the settings kts itself starts it with, stopped at the end.

The machine may be shared, so the results are the ratios; absolute rates are printed beside them
only for orientation. Measurements are interleaved (one round of everything, N rounds, in a fresh
shuffled order every round) and each keeps its best round; the JSON also has every round and the ratios
of the median rounds. Prints a table on stdout, progress on stderr, and writes JSON (default
bench/results/copy.json).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import io
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from benchlib import add_json_argument, bench_database, copy_pass, format_rows, progress, write_json

import sqlalchemy as sa
from crc32c import crc32c

from kts_assets.cli.common import parse_size
from kts_resources.kafka.checkpoints import epochs_up_to, format_leader_epoch_checkpoint
from kts_resources.kafka.files import mapped
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.segment import verify_segment_file
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata import database
from kts_resources.metadata.store import RemoteLogMetadataStore, _epoch_ranges
from kts_resources.remote_log import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    VerifiedChecksum,
)
from kts_resources.remote_storage import (
    FileSystemRemoteStorage,
    StoredObject,
    segment_custom_metadata,
)
from kts_resources.remote_storage.keys import LOG_SUFFIX, ObjectKeys, suffix_for_index
from kts_resources.tiering.tiers import copy_candidates

MiB = 1024 * 1024
READ_CHUNK = MiB
BASE_TIMESTAMP = 1_700_000_000_000
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
STORE_TABLES = ("topics", "partitions", "remote_segments", "remote_segment_leader_epochs", "remote_log_events", "quota_samples",
                "lost_ranges", "verified_objects")

# Sizes: (full, --quick).
DEFAULTS = {
    "size": (512 * MiB, 32 * MiB),
    "segment_size": (64 * MiB, 4 * MiB),
    "partitions": (4, 4),
    "repeats": (11, 1),  # copy rounds: cheap, and the copy times are the noisiest
    "metadata_repeats": (5, 1),
    "lookup_segments": (100_000, 2_000),
    "lookups": (2_000, 200),
    "pairs": (600, 100),  # add + finish pairs per round
    "round_trips": (5_000, 500),  # SELECT 1 per round
    "commits": (500, 50),  # INSERT + COMMIT per round
    "verify_segments": (300, 100),
}


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


# --- the database -------------------------------------------------------------------------------


def truncate_store(store: RemoteLogMetadataStore) -> None:
    """Empty the bench database's kts tables (never anybody else's: the database is the bench's)."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {', '.join(STORE_TABLES)}")


# --- 1. copy throughput -------------------------------------------------------------------------


@dataclass
class Segment:
    partition_dir: str  # the partition directory's name, e.g. "orders-0"
    tip: TopicIdPartition
    data: LogSegmentData
    start_offset: int
    end_offset: int
    log_bytes: int
    epochs: int  # leader epochs in the segment, from the lineage
    verified: VerifiedChecksum  # the .log's CRC-32C, as the copy's verification finds it

    @property
    def files(self) -> list[Path]:
        """The local files that travel with the segment, as the copy procedure picks them."""
        d = self.data
        return [p for p in (d.log_segment, d.offset_index, d.time_index, d.transaction_index, d.producer_snapshot) if p is not None]


def simulate_log_dir(root: Path, size: int, segment_size: int, partitions: int, seed: int, leader_change_ratio: float) -> dict:
    """A log dir whose closed segments hold about ``size`` bytes of .log: each partition gets
    whole segments plus half a segment more, which stays in its active segment."""
    topics = ("orders", "page.views")
    per_topic = max(1, -(-partitions // len(topics)))
    config = SimulationConfig(seed=seed, topics=topics[: min(partitions, len(topics))], partitions=per_topic,
                              total_bytes=size + per_topic * min(partitions, len(topics)) * segment_size // 2,
                              segment_bytes=segment_size, leader_epoch_change_ratio=leader_change_ratio)
    summary = simulate(root, config)
    return {"bytes_written": summary.bytes_written, "batches_written": summary.batches_written,
            "records_written": summary.records_written, "partitions": len(config.topic_partitions())}


def eligible_segments(root: Path) -> list[Segment]:
    """What ``copy_pass`` will copy, picked with its own rule (``copy_candidates``)."""
    log_dir = LogDir(root)
    out = []
    for partition in log_dir.partitions():
        tp = partition.topic_partition
        segments = partition.segments()
        start = log_dir.log_start_offset(tp)
        candidates = copy_candidates(
            segments, high_watermark=log_dir.high_watermark(tp), recovery_point=log_dir.recovery_point(tp),
            log_start_offset=segments[0].base_offset if start is None else start, highest_copied_offset=-1,
        )
        metadata = partition.metadata()
        assert metadata is not None, f"{partition.path} has no partition.metadata"
        tip = TopicIdPartition(metadata.topic_id, tp)
        lineage = partition.leader_epochs()
        for seg in candidates:
            assert seg.next_base_offset is not None
            end = seg.next_base_offset - 1
            snapshot = partition.producer_snapshot_path(seg.next_base_offset)
            data = LogSegmentData(
                log_segment=seg.log, offset_index=seg.offset_index, time_index=seg.time_index,
                transaction_index=seg.txn_index, producer_snapshot=snapshot if snapshot.exists() else None,
                leader_epoch_index=format_leader_epoch_checkpoint(epochs_up_to(lineage, end)),
            )
            with open(seg.log, "rb") as f, mapped(f) as view:
                st = os.fstat(f.fileno())
                verified = VerifiedChecksum(crc32c(view), st.st_size, st.st_mtime_ns)
            epochs = 1 + sum(seg.base_offset < e.start_offset <= end for e in lineage)
            out.append(Segment(partition.path.name, tip, data, seg.base_offset, end, seg.log.stat().st_size, epochs, verified))
    return out


def warm(paths: list[Path]) -> None:
    buf = bytearray(READ_CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def copy_with_cp(segments: list[Segment], dest: Path, sync: bool, sync_seconds: list[float] | None = None,
                 side_by_side: bool = False) -> None:
    """One ``cp`` per partition, one after the other or (``side_by_side``) all at once, as
    ``copy_pass`` copies partitions; then, with ``sync``, ``sync`` of everything copied."""
    by_partition: dict[str, list[str]] = {}
    for seg in segments:
        by_partition.setdefault(seg.partition_dir, []).extend(str(p) for p in seg.files)
    copied: list[str] = []
    running = []
    for name, files in by_partition.items():
        running.append(subprocess.Popen(["cp", "--", *files, str(dest / name)]))
        if not side_by_side:
            running[-1].wait()
        copied.extend(str(dest / name / Path(f).name) for f in files)
    if any(process.wait() != 0 for process in running):
        raise SystemExit("cp failed")
    if sync:
        # With file arguments GNU sync fsyncs each of them: the files, their directories, the root.
        t0 = time.perf_counter()
        subprocess.run(["sync", "--", *copied, *(str(dest / name) for name in by_partition), str(dest)], check=True)
        if sync_seconds is not None:
            sync_seconds.append(time.perf_counter() - t0)


def copy_with_storage(segments: list[Segment], dest: Path, checksum_known: bool = False) -> None:
    """The storage layer alone. ``checksum_known``: as ``copy_pass`` calls it, with the .log's
    CRC-32C from its verification, which the upload's own must match."""
    storage = FileSystemRemoteStorage(dest)
    for seg in segments:
        md = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId.generate(seg.tip), start_offset=seg.start_offset, end_offset=seg.end_offset,
            max_timestamp_ms=BASE_TIMESTAMP, broker_id=0, event_timestamp_ms=BASE_TIMESTAMP,
            segment_size_in_bytes=seg.log_bytes, segment_leader_epochs={0: seg.start_offset},
        )
        data = replace(seg.data, log_segment_checksum=seg.verified) if checksum_known else seg.data
        storage.copy_log_segment_data(md, data)


def copy_procedure(root: Path, store: RemoteLogMetadataStore, dest: Path, expected: list[Segment]) -> None:
    results = copy_pass(LogDir(root), store, FileSystemRemoteStorage(dest))
    copied = sum(len(r.copied) for r in results)
    stopped = [r.stopped or r.skipped for r in results if r.stopped or r.skipped]
    if stopped or copied != len(expected) or sum(r.copied_bytes for r in results) != sum(s.log_bytes for s in expected):
        raise SystemExit(f"the copy pass did not copy the {len(expected)} eligible segments: {copied} copied; {stopped}")


class Timed:
    """A stand-in for ``target`` that adds the time of every method call to ``totals[bucket]``
    (the breakdown pass; the timed rounds use the real objects)."""

    def __init__(self, target: object, bucket: str, totals: dict[str, float]):
        self._target, self._bucket, self._totals = target, bucket, totals

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def timed_call(*a, **k):
            t0 = time.perf_counter()
            try:
                return attr(*a, **k)
            finally:
                self._totals[self._bucket] += time.perf_counter() - t0

        return timed_call


def copy_breakdown(root: Path, store: RemoteLogMetadataStore, dest: Path) -> dict[str, float]:
    """One ``copy_pass`` with its store and storage timed: seconds in the metadata
    store, in the upload, and in the rest (waiting for the verification, segment listing,
    checkpoints, lock). One partition at a time, so that the parts add up to the whole."""
    totals = {"metadata": 0.0, "upload": 0.0}
    t0 = time.perf_counter()
    copy_pass(LogDir(root), Timed(store, "metadata", totals), Timed(FileSystemRemoteStorage(dest), "upload", totals),
              threads=1)
    total = time.perf_counter() - t0
    return {"seconds": total, "upload_s": totals["upload"], "metadata_s": totals["metadata"],
            "rest_s": total - totals["upload"] - totals["metadata"]}


def crc_scan(segments: list[Segment]) -> None:
    """The copy's verification pass alone (``verify_segment_file``: every batch CRC + the file's
    CRC-32C, the file read in windows as the copy reads it)."""
    for seg in segments:
        found = verify_segment_file(seg.data.log_segment)
        if found.problem is not None or found.crc32c != seg.verified.crc32c:
            raise SystemExit(f"{seg.data.log_segment} does not verify cleanly: {found.problem}")


def measure_copy(args: argparse.Namespace, tmpdir: Path, store: RemoteLogMetadataStore) -> dict:
    root = tmpdir / "logs"
    progress(f"simulating a log dir: {args.size / MiB:.0f} MiB in closed {args.segment_size / MiB:.0f} MiB segments "
             f"over {args.partitions} partitions (seed {args.seed})")
    t = time.perf_counter()
    sim = simulate_log_dir(root, args.size, args.segment_size, args.partitions, args.seed, args.leader_change_ratio)
    segments = eligible_segments(root)
    files = [p for seg in segments for p in seg.files]
    total_bytes = sum(p.stat().st_size for p in files)
    log_bytes = sum(seg.log_bytes for seg in segments)
    progress(f"  {len(segments)} eligible segments, {len(files)} files, {total_bytes / MiB:.0f} MiB "
             f"({log_bytes / MiB:.0f} MiB of .log) in {time.perf_counter() - t:.1f} s")
    if not segments:
        raise SystemExit("the simulated log dir has no eligible segment: raise --size or lower --segment-size")

    dest = tmpdir / "remote"
    sync_seconds: list[float] = []  # the sync part of each "cp + sync"
    partition_dirs = sorted({seg.partition_dir for seg in segments})

    def fresh_destination(make_partition_dirs: bool) -> None:
        shutil.rmtree(dest, ignore_errors=True)
        os.sync()  # nobody inherits the previous measurement's dirty pages (untimed)
        dest.mkdir()
        if make_partition_dirs:
            for name in partition_dirs:
                (dest / name).mkdir()
        warm(files)  # every measurement starts with the source in the page cache

    measurements: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        # name: (untimed set-up, timed work)
        "cp": (lambda: fresh_destination(True), lambda: copy_with_cp(segments, dest, sync=False)),
        "cp_sync": (lambda: fresh_destination(True), lambda: copy_with_cp(segments, dest, sync=True, sync_seconds=sync_seconds)),
        "cp_sync_side_by_side": (lambda: fresh_destination(True), lambda: copy_with_cp(segments, dest, sync=True, side_by_side=True)),
        "storage": (lambda: fresh_destination(False), lambda: copy_with_storage(segments, dest)),
        "storage_known": (lambda: fresh_destination(False), lambda: copy_with_storage(segments, dest, checksum_known=True)),
        "copy_log_dir": (lambda: (truncate_store(store), fresh_destination(False)),
                         lambda: copy_procedure(root, store, dest, segments)),
        "crc_scan": (lambda: fresh_destination(False), lambda: crc_scan(segments)),
    }
    names = list(measurements)
    progress("copy: warm-up round (untimed)")
    for setup, work in measurements.values():
        setup()
        work()
    sync_seconds.clear()
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.repeats):
        # A fresh order every round: rotating one order gave each measurement the same
        # predecessor every time, and what it left behind (freed blocks, writeback) showed.
        order = random.Random(round_).sample(names, len(names))
        progress(f"copy: round {round_ + 1}/{args.repeats}")
        for name in order:
            setup, work = measurements[name]
            setup()
            rounds[name].append(timed(work))
    best = {name: min(seconds) for name, seconds in rounds.items()}
    median = {name: sorted(seconds)[len(seconds) // 2] for name, seconds in rounds.items()}
    progress("copy: one more copy pass, its store and storage timed (the breakdown)")
    truncate_store(store)
    fresh_destination(False)
    breakdown = copy_breakdown(root, store, dest)
    shutil.rmtree(dest, ignore_errors=True)
    truncate_store(store)

    def entry(name: str, nbytes: int = total_bytes) -> dict:
        return {"seconds": best[name], "mb_per_s": nbytes / best[name] / 1e6, "median_seconds": median[name], "rounds_seconds": rounds[name]}

    result: dict = {
        "log_dir": {**sim, "eligible_segments": len(segments), "files": len(files), "bytes": total_bytes, "log_bytes": log_bytes,
                    "segment_size": args.segment_size, "leader_change_ratio": args.leader_change_ratio,
                    "leader_epochs_per_segment": sum(seg.epochs for seg in segments) / len(segments)},
        "baselines": {"cp": entry("cp"), "cp_sync": {**entry("cp_sync"), "sync_part_rounds_seconds": sync_seconds},
                      "cp_sync_side_by_side": entry("cp_sync_side_by_side")},
        # Info, not a copy: the CRC check over the .log bytes, timed alone.
        "crc_scan": {**entry("crc_scan", log_bytes), "share_of_copy_log_dir": best["crc_scan"] / best["copy_log_dir"]},
    }
    for name in ("storage", "storage_known", "copy_log_dir"):
        result[name] = {**entry(name), "ratio_vs_cp": best["cp"] / best[name], "ratio_vs_cp_sync": best["cp_sync"] / best[name],
                        "ratio_vs_cp_sync_side_by_side": best["cp_sync_side_by_side"] / best[name],
                        # The same ratios from the median rounds: how much the best-of-N ones owe to one lucky round.
                        "median_ratio_vs_cp": median["cp"] / median[name], "median_ratio_vs_cp_sync": median["cp_sync"] / median[name]}
    # Info: where one (separate, untimed-round) copy pass spent its time.
    result["copy_log_dir"]["breakdown"] = {**breakdown, **{
        f"{k[:-2]}_share": v / breakdown["seconds"] for k, v in breakdown.items() if k.endswith("_s")}}
    return result


# --- 2. metadata operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedSegment:
    """One finished remote segment as the copy would record it."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    epochs: dict[int, int]  # epoch → first offset in the segment
    size_bytes: int
    max_timestamp_ms: int
    added_ms: int
    finished_ms: int
    has_txn_index: bool


def plan_segments(n: int, seed: int) -> list[PlannedSegment]:
    """``n`` consecutive segments of one partition, deterministic: 200k-300k offsets each, and a
    leader change now and then, inside a segment (two epochs in it) or at its first offset."""
    rng = random.Random(seed)
    out = []
    start, epoch = 0, 0
    ts = BASE_TIMESTAMP
    for _ in range(n):
        end = start + rng.randint(200_000, 300_000) - 1
        epochs = {epoch: start}
        roll = rng.random()
        if roll < 0.02:
            epoch += rng.randint(1, 3)
            epochs = {epoch: start}
        elif roll < 0.07:
            epoch += rng.randint(1, 3)
            epochs[epoch] = rng.randint(start + 1, end)
        ts += rng.randint(30_000, 90_000)
        out.append(PlannedSegment(
            segment_id=uuid.UUID(int=rng.getrandbits(128), version=4), start_offset=start, end_offset=end,
            epochs=epochs, size_bytes=rng.randint(60 * MiB, 64 * MiB), max_timestamp_ms=ts,
            added_ms=ts + 1_000, finished_ms=ts + 1_500, has_txn_index=rng.random() < 0.3,
        ))
        start = end + 1
    return out


def planned_metadata(p: PlannedSegment, tip: TopicIdPartition) -> RemoteLogSegmentMetadata:
    """What the copy hands to ``add_remote_log_segment_metadata``."""
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, p.segment_id), start_offset=p.start_offset, end_offset=p.end_offset,
        max_timestamp_ms=p.max_timestamp_ms, broker_id=1, event_timestamp_ms=p.added_ms,
        segment_size_in_bytes=p.size_bytes, segment_leader_epochs=p.epochs,
    )


def planned_custom_metadata(p: PlannedSegment, tip: TopicIdPartition, segment_id: uuid.UUID | None = None) -> dict[str, str]:
    """What the filesystem backend returns for the copy: key, size and CRC of each object."""
    keys = ObjectKeys("")
    sid = RemoteLogSegmentId(tip, segment_id or p.segment_id)
    rng = random.Random(p.segment_id.int)
    index_types = [IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.PRODUCER_SNAPSHOT, IndexType.LEADER_EPOCH]
    if p.has_txn_index:
        index_types.append(IndexType.TRANSACTION)
    objects = {LOG_SUFFIX: StoredObject(keys.segment_key(sid, p.start_offset, LOG_SUFFIX), p.size_bytes, rng.getrandbits(32))}
    for t in index_types:
        suffix = suffix_for_index(t)
        objects[suffix] = StoredObject(keys.segment_key(sid, p.start_offset, suffix), rng.randint(100, 200_000), rng.getrandbits(32))
    return segment_custom_metadata(objects)


def load_through_api(store: RemoteLogMetadataStore, tip: TopicIdPartition, plan: list[PlannedSegment]) -> None:
    for p in plan:
        store.add_remote_log_segment_metadata(planned_metadata(p, tip))
        store.update_remote_log_segment_metadata(p.segment_id, FINISHED, p.finished_ms, custom_metadata=planned_custom_metadata(p, tip))


def _copy_rows(cur, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)  # None → unquoted empty field → NULL
    buf.seek(0)
    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)", buf)


def load_in_bulk(store: RemoteLogMetadataStore, tip: TopicIdPartition, plan: list[PlannedSegment]) -> None:
    """The rows ``load_through_api`` writes, with COPY in one transaction. The topic and partition
    rows must exist (made through the API); segments must follow the partition's highest copied
    offset and not overlap each other, so that no earlier entry of an epoch is superseded."""
    dump = json.dumps
    segments, epochs, events = [], [], []
    for p in plan:
        md = planned_metadata(p, tip)
        ranges = _epoch_ranges(md)
        leader_epochs = {str(e): start for e, (start, _end) in ranges.items()}
        segments.append((p.segment_id, tip.topic_id, tip.partition, p.start_offset, p.end_offset, p.max_timestamp_ms,
                         p.size_bytes, dump(leader_epochs), FINISHED.name, md.broker_id, p.finished_ms,
                         dump(planned_custom_metadata(p, tip))))
        for e, (start, end) in ranges.items():
            epochs.append((p.segment_id, e, tip.topic_id, tip.partition, start, end, True, True))
        events.append((tip.topic_id, tip.partition, p.segment_id, "SEGMENT_ADDED", None, RemoteLogSegmentState.COPY_SEGMENT_STARTED.name,
                       dump({"start_offset": p.start_offset, "end_offset": p.end_offset, "size_bytes": p.size_bytes,
                             "leader_epochs": leader_epochs, "broker_id": md.broker_id, "event_timestamp_ms": p.added_ms})))
        events.append((tip.topic_id, tip.partition, p.segment_id, "SEGMENT_STATE_CHANGED", RemoteLogSegmentState.COPY_SEGMENT_STARTED.name,
                       FINISHED.name, dump({"event_timestamp_ms": p.finished_ms, "highest_copied_offset": p.end_offset})))
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SELECT highest_copied_offset FROM partitions WHERE topic_id = %s AND partition = %s FOR UPDATE",
                    (str(tip.topic_id), tip.partition))
        (highest,) = cur.fetchone()
        if plan and plan[0].start_offset <= highest:
            raise ValueError("bulk-loaded segments must lie above the partition's highest copied offset")
        _copy_rows(cur, "remote_segments", ("segment_id", "topic_id", "partition", "start_offset", "end_offset", "max_timestamp_ms",
                                            "size_bytes", "leader_epochs", "state", "broker_id", "event_timestamp_ms", "custom_metadata"),
                   segments)
        _copy_rows(cur, "remote_segment_leader_epochs", ("segment_id", "leader_epoch", "topic_id", "partition", "start_offset",
                                                         "end_offset", "referenced", "copied"), epochs)
        _copy_rows(cur, "remote_log_events", ("topic_id", "partition", "segment_id", "kind", "old_state", "new_state", "details"), events)
        if plan:
            cur.execute("UPDATE partitions SET highest_copied_offset = %s, updated_at = now() WHERE topic_id = %s AND partition = %s",
                        (plan[-1].end_offset, str(tip.topic_id), tip.partition))
        raw.commit()
        cur.execute("ANALYZE")  # what autovacuum does after a load this size; the API path gets it too
        raw.commit()
    finally:
        raw.close()


def dump_store(store: RemoteLogMetadataStore) -> dict[str, list]:
    """Every row of the store's segment tables, minus wall-clock timestamps and event ids."""
    queries = {
        "topics": "SELECT name, topic_id, configs FROM topics ORDER BY name",
        "partitions": "SELECT topic_id, partition, topic, log_start_offset, highest_copied_offset, delete_state FROM partitions ORDER BY 1, 2",
        "remote_segments": "SELECT segment_id, topic_id, partition, start_offset, end_offset, max_timestamp_ms, size_bytes, leader_epochs, "
                           "state, broker_id, event_timestamp_ms, custom_metadata FROM remote_segments ORDER BY segment_id",
        "remote_segment_leader_epochs": "SELECT segment_id, leader_epoch, topic_id, partition, start_offset, end_offset, referenced, copied "
                                        "FROM remote_segment_leader_epochs ORDER BY segment_id, leader_epoch",
        "remote_log_events": "SELECT topic_id, partition, segment_id, kind, old_state, new_state, details FROM remote_log_events ORDER BY id",
    }
    with store.engine.connect() as conn:
        return {table: [tuple(row) for row in conn.exec_driver_sql(sql)] for table, sql in queries.items()}


def lineage_of(plan: list[PlannedSegment]) -> list[tuple[int, int]]:
    """(first offset, epoch) of every epoch, ascending."""
    out: list[tuple[int, int]] = []
    for p in plan:
        for epoch, start in sorted(p.epochs.items()):
            if not out or out[-1][1] != epoch:
                out.append((start, epoch))
    return out


def epoch_at(lineage: list[tuple[int, int]], offset: int) -> int:
    lo, hi = 0, len(lineage) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if lineage[mid][0] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lineage[lo][1]


def verification_queries(plan: list[PlannedSegment], rng: random.Random) -> list[tuple[int, int]]:
    """(epoch, offset) pairs that hit, miss by epoch, and fall outside: every boundary and some random."""
    lineage = lineage_of(plan)
    last = plan[-1].end_offset
    offsets = {0, last, last + 1}
    for p in plan:
        offsets.update({p.start_offset, p.end_offset, *p.epochs.values()})
        offsets.update(s - 1 for s in p.epochs.values() if s > 0)
    offsets.update(rng.randint(0, last) for _ in range(200))
    queries = []
    for o in sorted(offsets):
        e = epoch_at(lineage, min(o, last))
        queries += [(e, o), (e + 1, o)]
        if e > 0:
            queries.append((e - 1, o))
    return queries


def verify_bulk_load(store: RemoteLogMetadataStore, n: int, seed: int) -> dict:
    """Load ``n`` segments through the API, record every table row and lookup answer, empty the
    store, bulk-load the same segments (same ids), and require identical rows and answers."""
    plan = plan_segments(n, seed)
    topic_id = uuid.UUID(int=random.Random(seed).getrandbits(128), version=4)
    tip = TopicIdPartition(topic_id, TopicPartition("bench-verify", 0))
    queries = verification_queries(plan, random.Random(seed + 1))

    def answers() -> list:
        return [store.remote_log_segment_metadata(tip, e, o) for e, o in queries]

    truncate_store(store)
    store.ensure_topic(tip.topic, topic_id)
    store.update_log_start_offset(tip, 0)  # creates the partition row, as the first add would
    load_through_api(store, tip, plan)
    api_rows, api_answers = dump_store(store), answers()
    truncate_store(store)
    store.ensure_topic(tip.topic, topic_id)
    store.update_log_start_offset(tip, 0)
    load_in_bulk(store, tip, plan)
    bulk_rows, bulk_answers = dump_store(store), answers()
    truncate_store(store)
    for table in api_rows:
        if api_rows[table] != bulk_rows[table]:
            diff = next(i for i, (a, b) in enumerate(zip(api_rows[table] + [None], bulk_rows[table] + [None])) if a != b)
            raise SystemExit(f"bulk load drifted from the API in {table}, row {diff}: "
                             f"API {(api_rows[table] + [None])[diff]} vs bulk {(bulk_rows[table] + [None])[diff]}")
    if api_answers != bulk_answers:
        raise SystemExit("bulk load drifted from the API: lookups answer differently")
    hits = sum(a is not None for a in api_answers)
    if hits == 0 or hits == len(api_answers):
        raise SystemExit("the verification lookups should both hit and miss")
    return {"segments": n, "multi_epoch_segments": sum(len(p.epochs) > 1 for p in plan),
            "lookups": len(queries), "hits": hits, "rows_compared": {t: len(r) for t, r in api_rows.items()}}


@contextlib.contextmanager
def sql_sent(store: RemoteLogMetadataStore) -> Iterator[dict]:
    """What the store sends inside the block: {"statements": [(sql, params)], "commits": n}.
    (The pool's pre-ping and psycopg2's implicit BEGIN are not seen here: one each per transaction.)"""
    seen: dict = {"statements": [], "commits": 0}

    def statement(conn, cursor, sql, params, context, executemany):
        seen["statements"].append((sql, params))

    def commit(conn):
        seen["commits"] += 1

    sa.event.listen(store.engine, "before_cursor_execute", statement)
    sa.event.listen(store.engine, "commit", commit)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", statement)
        sa.event.remove(store.engine, "commit", commit)


def lookup_sql(store: RemoteLogMetadataStore, tip: TopicIdPartition, epoch: int, offset: int) -> tuple[str, dict, str, str] | None:
    """The lookup's own SQL, as the store sends it, with the names of its epoch and offset
    parameters (to replay it on a raw cursor); None when they cannot be told apart."""
    with sql_sent(store) as seen:
        store.remote_log_segment_metadata(tip, epoch, offset)
    if len(seen["statements"]) != 1:
        return None
    sql, params = seen["statements"][0]
    epoch_keys = [k for k, v in params.items() if v == epoch]
    offset_keys = [k for k, v in params.items() if v == offset]
    if len(epoch_keys) != 1 or len(offset_keys) != 1 or epoch_keys == offset_keys:
        return None
    return sql, dict(params), epoch_keys[0], offset_keys[0]


def measure_metadata(args: argparse.Namespace, store: RemoteLogMetadataStore) -> dict:
    progress(f"metadata: verifying the bulk load against the API on {args.verify_segments} segments")
    t = time.perf_counter()
    verified = verify_bulk_load(store, args.verify_segments, args.seed + 100)
    progress(f"  identical rows and {verified['lookups']} identical lookup answers in {time.perf_counter() - t:.1f} s")

    progress(f"metadata: bulk-loading {args.lookup_segments:,} segments into one partition")
    t = time.perf_counter()
    plan = plan_segments(args.lookup_segments, args.seed + 200)
    lookup_topic_id = uuid.UUID(int=random.Random(args.seed + 200).getrandbits(128), version=4)
    lookup_tip = TopicIdPartition(lookup_topic_id, TopicPartition("bench-lookup", 0))
    store.ensure_topic(lookup_tip.topic, lookup_topic_id)
    store.update_log_start_offset(lookup_tip, 0)
    load_in_bulk(store, lookup_tip, plan)
    load_seconds = time.perf_counter() - t
    progress(f"  in {load_seconds:.1f} s")

    lineage = lineage_of(plan)
    rng = random.Random(args.seed + 300)
    last = plan[-1].end_offset
    pair_topic_id = uuid.UUID(int=random.Random(args.seed + 400).getrandbits(128), version=4)
    store.ensure_topic("bench-pairs", pair_topic_id)
    pair_plan = plan_segments(args.pairs, args.seed + 500)

    # What one pair and one lookup send (untimed): statements and transactions.
    count_tip = TopicIdPartition(pair_topic_id, TopicPartition("bench-pairs", args.metadata_repeats + 1))
    store.update_log_start_offset(count_tip, 0)
    one_epoch = next(p for p in pair_plan if len(p.epochs) == 1)
    with sql_sent(store) as pair_sent:
        load_through_api(store, count_tip, [one_epoch])
    captured = lookup_sql(store, lookup_tip, plan[-1].epochs[max(plan[-1].epochs)], plan[-1].end_offset)
    with sql_sent(store) as lookup_sent:
        store.remote_log_segment_metadata(lookup_tip, *lineage[0][::-1])

    raw = store.engine.raw_connection()  # the baselines' one connection, from the store's own engine
    raw.autocommit = True
    cur = raw.cursor()
    cur.execute("CREATE TABLE kts_bench_commit (n bigint)")  # in the bench's own database

    def select_1() -> list[float]:
        latencies = []
        clock = time.perf_counter
        for _ in range(args.round_trips):
            t0 = clock()
            cur.execute("SELECT 1")
            cur.fetchone()
            latencies.append(clock() - t0)
        return latencies

    def commits() -> list[float]:
        latencies = []
        for i in range(args.commits):
            t0 = time.perf_counter()
            cur.execute("INSERT INTO kts_bench_commit VALUES (%s)", (i,))  # autocommit: one durable commit
            latencies.append(time.perf_counter() - t0)
        return latencies

    pair_round = [0]

    def pairs() -> list[float]:
        # A fresh partition per round, so every round adds to an empty one alike.
        tip = TopicIdPartition(pair_topic_id, TopicPartition("bench-pairs", pair_round[0]))
        pair_round[0] += 1
        store.update_log_start_offset(tip, 0)  # the partition row, made before the clock starts
        latencies = []
        for p in pair_plan:
            # Each round's pairs are new copy attempts: fresh UUIDs.
            md = replace(planned_metadata(p, tip), segment_id=RemoteLogSegmentId.generate(tip))
            custom_metadata = planned_custom_metadata(p, tip, md.segment_id.id)
            t0 = time.perf_counter()
            store.add_remote_log_segment_metadata(md)
            store.update_remote_log_segment_metadata(md.segment_id, FINISHED, p.finished_ms, custom_metadata=custom_metadata)
            latencies.append(time.perf_counter() - t0)
        return latencies

    def lookups() -> list[float]:
        queries = [(epoch_at(lineage, o), o) for o in (rng.randint(0, last) for _ in range(args.lookups))]
        latencies, answers = [], []
        for e, o in queries:
            t0 = time.perf_counter()
            answers.append(store.remote_log_segment_metadata(lookup_tip, e, o))
            latencies.append(time.perf_counter() - t0)
        for (_e, o), md in zip(queries, answers):
            if md is None or not md.start_offset <= o <= md.end_offset:
                raise SystemExit(f"lookup of offset {o} answered {md}")
        return latencies

    def lookups_sql_alone() -> list[float]:
        # Info: the same statement the store sends, on the raw autocommit cursor: server + one round trip.
        assert captured is not None
        sql, params, epoch_key, offset_key = captured
        queries = [(epoch_at(lineage, o), o) for o in (rng.randint(0, last) for _ in range(args.lookups))]
        latencies = []
        for e, o in queries:
            t0 = time.perf_counter()
            cur.execute(sql, {**params, epoch_key: e, offset_key: o})
            cur.fetchall()
            latencies.append(time.perf_counter() - t0)
        return latencies

    measurements: dict[str, Callable[[], list[float]]] = {
        "select_1": select_1, "commit": commits, "add_finish": pairs, "lookup": lookups,
    }
    if captured is not None:
        measurements["lookup_sql"] = lookups_sql_alone
    names = list(measurements)
    best: dict[str, tuple[float, list[float]]] = {}  # name → (total seconds, sorted latencies) of the best round
    try:
        select_1(), lookups()  # warm the connection, the pool and the lookup index (untimed)
        for round_ in range(args.metadata_repeats):
            order = random.Random(round_).sample(names, len(names))
            progress(f"metadata: round {round_ + 1}/{args.metadata_repeats}")
            for name in order:
                gc.collect()
                latencies = measurements[name]()
                total = sum(latencies)
                if name not in best or total < best[name][0]:
                    best[name] = (total, sorted(latencies))
    finally:
        cur.execute("DROP TABLE IF EXISTS kts_bench_commit")
        raw.close()

    def rate(name: str) -> float:
        total, latencies = best[name]
        return len(latencies) / total

    def ms(name: str, q: float) -> float:
        return percentile(best[name][1], q) * 1e3

    select_rate, commit_rate = rate("select_1"), rate("commit")
    return {
        "baselines": {
            "select_1": {"per_s": select_rate, "p50_ms": ms("select_1", 50), "p99_ms": ms("select_1", 99), "count": args.round_trips},
            "commit": {"per_s": commit_rate, "p50_ms": ms("commit", 50), "p99_ms": ms("commit", 99), "count": args.commits},
        },
        "add_finish": {
            "pairs_per_s": rate("add_finish"), "pairs": args.pairs, "p50_ms": ms("add_finish", 50), "p99_ms": ms("add_finish", 99),
            "ratio_vs_select_1": rate("add_finish") / select_rate, "ratio_vs_commit": rate("add_finish") / commit_rate,
            "select_1_round_trips_per_pair": select_rate / rate("add_finish"),
            # For a one-epoch segment; each more epoch adds a statement to the finish.
            "statements_per_pair": len(pair_sent["statements"]), "transactions_per_pair": pair_sent["commits"],
        },
        "lookup": {
            "segments": args.lookup_segments, "lookups": args.lookups, "per_s": rate("lookup"),
            "p50_ms": ms("lookup", 50), "p99_ms": ms("lookup", 99),
            "ratio_vs_select_1": rate("lookup") / select_rate,
            "p50_in_select_1_p50s": ms("lookup", 50) / ms("select_1", 50),
            "statements": len(lookup_sent["statements"]), "transactions": lookup_sent["commits"],
            # Info: the lookup's own SQL on the raw cursor (no pool, no transaction, no SQLAlchemy).
            "sql_alone": None if captured is None else {
                "per_s": rate("lookup_sql"), "p50_ms": ms("lookup_sql", 50), "p99_ms": ms("lookup_sql", 99),
                "ratio_vs_select_1": rate("lookup_sql") / select_rate, "share_of_lookup_p50": ms("lookup_sql", 50) / ms("lookup", 50),
            },
        },
        "bulk_load": {"segments": args.lookup_segments, "seconds": load_seconds, "verified": verified},
    }


# --- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kts-bench-copy-") as tmp:
        tmpdir = Path(tmp)
        with bench_database(tmpdir) as (url, db_info):
            store = RemoteLogMetadataStore(database.create_engine(url))
            try:
                copy = measure_copy(args, tmpdir, store)
                metadata = measure_metadata(args, store)
            finally:
                store.close()
    return {
        "params": {
            "size_bytes": args.size, "segment_size_bytes": args.segment_size, "partitions": args.partitions,
            "repeats": args.repeats, "metadata_repeats": args.metadata_repeats, "quick": bool(args.quick), "seed": args.seed,
            "lookup_segments": args.lookup_segments, "lookups": args.lookups, "pairs_per_round": args.pairs,
            "page_cache": "warm: source files read before every copy measurement; sync before every one, untimed",
            "database": db_info,
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "cp": subprocess.run(["cp", "--version"], check=False, capture_output=True, text=True).stdout.splitlines()[0],
            # The machine may be shared: 1-minute load average before and after the run.
            "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "copy": copy,
        "metadata": metadata,
        "runtime_seconds": time.perf_counter() - started,
    }


def table(result: dict) -> str:
    c, m = result["copy"], result["metadata"]
    rows = [("measurement", "rate", "ratio", "vs")]
    rows.append(("copy: cp", f"{c['baselines']['cp']['mb_per_s']:,.0f} MB/s", "1.00", "(baseline)"))
    rows.append(("copy: cp + sync", f"{c['baselines']['cp_sync']['mb_per_s']:,.0f} MB/s", "1.00", "(baseline)"))
    rows.append(("copy: cp + sync, partitions side by side", f"{c['baselines']['cp_sync_side_by_side']['mb_per_s']:,.0f} MB/s",
                 "1.00", "(baseline)"))
    for label, key in (("copy: storage layer, reads + checksums every byte", "storage"),
                       ("copy: storage layer, checksum known (compared)", "storage_known"),
                       ("copy: full procedure (copy_log_dir)", "copy_log_dir")):
        e = c[key]
        rows.append((label, f"{e['mb_per_s']:,.0f} MB/s", f"{e['ratio_vs_cp_sync']:.2f}", "cp + sync"))
        if key == "copy_log_dir":
            rows.append(("", "", f"{e['ratio_vs_cp_sync_side_by_side']:.2f}", "cp + sync side by side"))
        rows.append(("", "", f"{e['ratio_vs_cp']:.2f}", "cp"))
    s = c["crc_scan"]
    rows.append(("  info: verify_segment_file of the .log files", f"{s['mb_per_s']:,.0f} MB/s", f"{s['share_of_copy_log_dir']:.2f}",
                 "of copy_log_dir's time"))
    d = c["copy_log_dir"]["breakdown"]
    rows.append(("  info: one partition at a time: upload / store / rest", f"{d['upload_s']:.2f} / {d['metadata_s']:.2f} / {d['rest_s']:.2f} s",
                 f"{d['upload_share']:.2f}", "upload's share (one timed pass)"))
    b = m["baselines"]
    rows.append(("metadata: SELECT 1 round trip", f"{b['select_1']['per_s']:,.0f} /s", "1.00", "(baseline)"))
    rows.append(("metadata: one-row INSERT + COMMIT", f"{b['commit']['per_s']:,.0f} /s", "1.00", "(baseline)"))
    a = m["add_finish"]
    rows.append(("metadata: add + finish pair", f"{a['pairs_per_s']:,.0f} pairs/s", f"{a['ratio_vs_select_1']:.3f}", "SELECT 1"))
    rows.append(("", "", f"{a['ratio_vs_commit']:.3f}", "commit"))
    lk = m["lookup"]
    rows.append((f"metadata: lookup by offset, {lk['segments']:,} segments", f"{lk['per_s']:,.0f} /s", f"{lk['ratio_vs_select_1']:.3f}", "SELECT 1"))
    rows.append(("  lookup latency p50 / p99", f"{lk['p50_ms']:.2f} / {lk['p99_ms']:.2f} ms", f"{lk['p50_in_select_1_p50s']:.1f}x",
                 f"SELECT 1 p50 ({b['select_1']['p50_ms']:.3f} ms)"))
    if lk["sql_alone"] is not None:
        q = lk["sql_alone"]
        rows.append(("  info: the lookup's SQL alone, raw cursor", f"{q['p50_ms']:.2f} / {q['p99_ms']:.2f} ms",
                     f"{q['share_of_lookup_p50']:.2f}", "of the lookup's p50"))
    return "\n".join(format_rows(rows, right={1, 2}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=None, help=".log bytes in closed segments to copy (default 512MiB; 32MiB with --quick)")
    parser.add_argument("--segment-size", type=parse_size, default=None, help="segment.bytes (default 64MiB; 4MiB with --quick)")
    parser.add_argument("--partitions", type=int, default=None, help="partitions the bytes are spread over (default 4)")
    parser.add_argument("--leader-change-ratio", type=float, default=0.0001,
                        help="leader changes per batch per partition in the simulated log (default 0.0001, ~1-2 per 64 MiB segment)")
    parser.add_argument("--lookup-segments", type=int, default=None, help="segments in the lookup partition (default 100000; 2000 with --quick)")
    parser.add_argument("--lookups", type=int, default=None, help="random lookups per round (default 2000; 200 with --quick)")
    parser.add_argument("--pairs", type=int, default=None, help="add + finish pairs per round (default 600; 100 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run, not a measurement")
    parser.add_argument("--repeats", type=int, default=None, help="copy rounds; each measurement keeps its best (default 11; 1 with --quick)")
    parser.add_argument("--metadata-repeats", type=int, default=None, help="metadata rounds, likewise (default 5; 1 with --quick)")
    parser.add_argument("--seed", type=int, default=1)
    add_json_argument(parser, "copy")
    args = parser.parse_args(argv)
    pick = 1 if args.quick else 0
    for name, values in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, values[pick])
    for name in ("repeats", "metadata_repeats", "partitions", "lookup_segments", "lookups", "pairs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.segment_size < 64 * 1024:
        parser.error("--segment-size must be at least 64KiB")

    result = run(args)
    print(table(result))
    p, c = result["params"], result["copy"]["log_dir"]
    print(f"\n{c['bytes'] / MiB:.0f} MiB in {c['files']} files ({c['eligible_segments']} segments of {p['segment_size_bytes'] / MiB:.0f} MiB "
          f"over {p['partitions']} partitions); best of {p['repeats']} (metadata {p['metadata_repeats']}); PostgreSQL {p['database'].get('server_version')} "
          f"({p['database']['source']}, fsync={p['database'].get('fsync')}, synchronous_commit={p['database'].get('synchronous_commit')}); "
          f"python {p['python']}, {p['cpus']} CPUs, load {p['load_average'][0]:.1f}→{p['load_average'][1]:.1f}; "
          f"{result['runtime_seconds']:.0f} s")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
