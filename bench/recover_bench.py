"""``kts recover`` at scale: the metadata store and remote log indexes rebuilt from a filesystem tier
of many small remote segments (issue 13's goal: 100,000 segments in under 2 minutes here).

    .venv/bin/python bench/recover_bench.py                      # 100,000 segments over 100 partitions
    .venv/bin/python bench/recover_bench.py --segments 20000 --partitions 20
    .venv/bin/python bench/recover_bench.py --quick              # smoke run, 1,000 segments

The tier is written directly (no copy pass, no fsync): per segment a .log of one 10-record batch,
an empty .index and .timeindex, its leader-epoch lineage and its manifest, as the copy writes them.
Then, into a fresh database, ``recover`` runs once (timed per phase: listing, manifests, store,
index) and again (a rerun: nothing to do). The baseline is the floor any recovery pays: listing
the tier and reading every manifest's bytes (``os.walk`` + ``read_bytes``), measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import benchlib

from kts_resources.maintenance import recovery
from kts_resources.kafka.partition import TopicPartition
from kts_resources.kafka.records import NewRecord, build_batch, with_base_offset_and_epoch
from kts_resources.metadata import database
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from kts_resources.remote_storage.base import StoredObject
from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage
from kts_resources.remote_storage.manifest import SegmentManifest, encode_manifest
from crc32c import crc32c

RECORDS_PER_SEGMENT = 10
PREFIX = "tiered"


def write_tier(root: Path, segments: int, partitions: int) -> int:
    """The tier's files, written straight to disk; returns the bytes written."""
    template = build_batch([NewRecord(1_700_000_000_000 + i, b"k%d" % i, b"v" * 100) for i in range(RECORDS_PER_SEGMENT)],
                           base_offset=0)
    storage = FileSystemRemoteStorage(root, PREFIX)
    topic_id = uuid.uuid4()
    total = 0
    per_partition = [segments // partitions + (1 if p < segments % partitions else 0) for p in range(partitions)]
    for p, count in enumerate(per_partition):
        tip = TopicIdPartition(topic_id, TopicPartition("bench", p))
        for i in range(count):
            start = i * RECORDS_PER_SEGMENT
            sid = RemoteLogSegmentId(tip, uuid.uuid4())
            data = {"log": with_base_offset_and_epoch(template, start, 0), "index": b"", "timeindex": b"",
                    "leader-epoch-checkpoint": b"0\n1\n0 0\n"}
            objects = {}
            for suffix, body in data.items():
                key = storage.keys.segment_key(sid, start, suffix)
                path = root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
                objects[suffix] = StoredObject(key, len(body), crc32c(body))
                total += len(body)
            md = RemoteLogSegmentMetadata(sid, start, start + RECORDS_PER_SEGMENT - 1, 1_700_000_000_000 + RECORDS_PER_SEGMENT,
                                          0, 1_700_000_000_000 + i, len(data["log"]), {0: start})
            manifest = encode_manifest(SegmentManifest.of(md, objects, topic_configs={"retention.ms": "-1"}))
            (root / storage.keys.manifest_key(sid, start)).write_bytes(manifest)
            total += len(manifest)
    return total


def floor_seconds(root: Path) -> float:
    """List every file and read every manifest: what any recovery from this tier must do."""
    began = time.perf_counter()
    for path in root.rglob("*"):
        if path.name.endswith(".manifest"):
            path.read_bytes()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="1,000 segments over 10 partitions: a smoke run")
    benchlib.add_json_argument(parser, "recover")
    args = parser.parse_args(argv)
    if args.quick:
        args.segments, args.partitions = 1_000, 10

    with tempfile.TemporaryDirectory(prefix="kts-recover-bench-") as tmp:
        tmpdir = Path(tmp)
        root = tmpdir / "remote"
        benchlib.progress(f"writing {args.segments} segments over {args.partitions} partitions")
        began = time.perf_counter()
        written = write_tier(root, args.segments, args.partitions)
        write_s = time.perf_counter() - began
        floor = floor_seconds(root)
        with benchlib.bench_database(tmpdir) as (url, db_info):
            store = RemoteLogMetadataStore(database.create_engine(url))
            storage = FileSystemRemoteStorage(root, PREFIX)
            phases: dict[str, float] = {}
            began = time.perf_counter()
            mark = [began]

            def progress(line: str) -> None:
                benchlib.progress(f"recover: {line}")

            # Phase times from the module's own steps, wrapped from outside.
            originals = {name: getattr(recovery, name) for name in ("survey_tier", "read_manifests", "rebuild_indexes")}

            def timed(name):
                def run(*a, **k):
                    t = time.perf_counter()
                    try:
                        return originals[name](*a, **k)
                    finally:
                        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
                return run

            for name in originals:
                setattr(recovery, name, timed(name))
            report = recovery.recover(store, storage, tmpdir / "home", progress=progress)
            first_s = time.perf_counter() - began
            for name, fn in originals.items():
                setattr(recovery, name, fn)
            phases["store"] = first_s - sum(phases.values())
            began = time.perf_counter()
            again = recovery.recover(store, storage, tmpdir / "home")
            rerun_s = time.perf_counter() - began
            store.close()
    assert report.segments_recovered == args.segments and report.clean, report.to_json()
    assert again.segments_recovered == 0 and again.segments_present == args.segments
    result = {
        "params": {"segments": args.segments, "partitions": args.partitions, "bytes": written},
        "seconds": {"write_tier": round(write_s, 2), "floor": round(floor, 2), "recover": round(first_s, 2),
                    "rerun": round(rerun_s, 2), **{f"phase_{k}": round(v, 2) for k, v in phases.items()}},
        "ratios": {"recover_over_floor": round(first_s / floor, 1) if floor else None,
                   "segments_per_second": round(args.segments / first_s)},
        "database": db_info,
        "git": benchlib.git_state(),
    }
    rows = [("measurement", "seconds")] + [(k, f"{v:.2f}") for k, v in result["seconds"].items()]
    print("\n".join(benchlib.format_rows(rows, {1})))
    print(f"{args.segments} segments recovered in {first_s:.1f} s ({result['ratios']['segments_per_second']}/s, "
          f"{result['ratios']['recover_over_floor']}x the listing-and-read floor); a rerun took {rerun_s:.1f} s")
    benchlib.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
