"""How fast `kts restore` rebuilds a partition's log dir from the remote tier, against copying the
same objects out of the tier with `cp` — each followed by `sync`, so both land on disk: goal ≥ 0.7×.

    .venv/bin/python bench/restore_bench.py [--mib 256] [--rounds 3] [--quick] [--json PATH]

A simulated partition (``--mib`` of 16 MiB segments) is copied to a directory tier. Each round, in
an order that alternates: ``restore_partition`` into a fresh dir (every object streamed in 8 MiB
reads, its size and CRC-32C checked, fsynced, renamed; then the epoch checkpoint, partition.metadata
and checkpoints), and ``cp`` of exactly the objects the restore reads (every segment's .log, .index,
.timeindex, .txnindex, snapshot) into a fresh dir, then ``sync``. The page cache is not dropped (that
needs root and a quiet machine): both read the tier's files from it. Correctness, untimed: the
restored .log files equal the originals. The machine may be shared, so the result is the ratio of
the best rounds, with every round in the JSON (default bench/results/restore.json).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib import add_json_argument, bench_database, copy_pass, format_rows, git_state, progress, write_json

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.base import stored_objects
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.maintenance.restore import restore_partition

TOPIC = "restore"
MiB = 1024 * 1024
GOAL = 0.7


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 MiB, one round: a smoke run")
    add_json_argument(parser, "restore")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.rounds = 16, 1
    with tempfile.TemporaryDirectory(prefix="kts-restore-bench-") as tmpdir, bench_database(Path(tmpdir)) as (url, db):
        tmp = Path(tmpdir)
        store = RemoteLogMetadataStore.from_url(url)
        storage = remote_storage_from_uri((tmp / "remote").as_uri())
        progress(f"simulating {args.mib} MiB and copying it to a directory tier")
        logs = tmp / "logs"
        simulate(logs, SimulationConfig(seed=4, topics=(TOPIC,), partitions=1, total_bytes=args.mib * MiB,
                                        segment_bytes=min(16 * MiB, args.mib * MiB // 4)))
        copy_pass(LogDir(logs), store, storage)
        tip = next(t for t in store.partitions() if t.topic == TOPIC)
        finished = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
        sources = [Path(storage.root, obj.key) if hasattr(storage, "root") else None
                   for md in finished for suffix, obj in stored_objects(md.custom_metadata).items()
                   if suffix != "leader-epoch-checkpoint"]
        if any(s is None or not s.is_file() for s in sources):
            raise SystemExit("the directory tier's objects are not where the bench looks for them")
        total = sum(s.stat().st_size for s in sources)
        rounds: dict[str, list[float]] = {"restore": [], "cp": []}
        for r in range(args.rounds):
            for name in (("restore", "cp") if r % 2 == 0 else ("cp", "restore")):
                target = tmp / f"{name}-{r}"
                subprocess.run(["sync"], check=True)
                started = time.perf_counter()
                if name == "restore":
                    result = restore_partition(store, storage, TOPIC, 0, target)
                    subprocess.run(["sync"], check=True)
                else:
                    target.mkdir()
                    subprocess.run(["cp", *map(str, sources), str(target)], check=True)
                    subprocess.run(["sync"], check=True)
                rounds[name].append(time.perf_counter() - started)
                progress(f"round {r + 1}: {name} {rounds[name][-1]:.2f} s")
                if name == "restore" and r == 0:
                    for md in finished:
                        restored = result.partition_dir / f"{md.start_offset:020d}.log"
                        original = logs / f"{TOPIC}-0" / restored.name
                        if restored.read_bytes() != original.read_bytes():
                            raise SystemExit(f"{restored} differs from {original}")
                shutil.rmtree(target)
        store.close()
    best = {name: min(seconds) for name, seconds in rounds.items()}
    ratio = best["cp"] / best["restore"]
    rows = [("measurement", "best s", "MB/s", "ratio"),
            ("cp of the objects + sync (baseline)", f"{best['cp']:.2f}", f"{total / best['cp'] / 1e6:,.0f}", "1.00"),
            ("kts restore + sync", f"{best['restore']:.2f}", f"{total / best['restore'] / 1e6:,.0f}", f"{ratio:.2f}"),
            (f"restore throughput / cp (goal ≥ {GOAL})", "", "", f"{ratio:.2f}")]
    print("\n".join(format_rows(rows, right={1, 2, 3})))
    write_json(args.json, {"params": {"mib": args.mib, "rounds": args.rounds, "segments": len(finished), "bytes": total},
                           "rounds_seconds": rounds, "best_seconds": best, "ratio_vs_cp": ratio, "goal": GOAL,
                           "database": db, "git": git_state()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
