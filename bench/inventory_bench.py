"""The CRC-checked inventory over small batches: `kts segments --json` and the Spark inventory
against raw CRC-32C over the same bytes.

    .venv/bin/python bench/inventory_bench.py [--segments 8] [--segment-size 96MiB] [--rounds 5] [--no-spark] [--quick] [--json PATH]

Writes one partition of ``--segments`` closed segments of ~1.6 KB magic-2 batches (ten ~150-byte
records each: what producers with linger.ms=0 write; seeded), then measures, page cache warm,
rounds interleaved so that a noisy neighbour slows every measurement alike, each keeping its best:

- baseline "raw CRC-32C": each .log read in 8 MiB reads and CRC-32C'd, one core (the same
  baseline as bench/read_bench.py's replay);
- ``kts segments --json DIR`` as a user runs it (a fresh interpreter: start-up and imports
  included), one core, against it (goal ≥ 0.5);
- the same tally in this process (``summarize_segment`` of every file): the scan alone;
- the Spark inventory (``segment_inventory`` + ``collect``) on local[2], both cores, against the
  single-core baseline (goal ≥ 0.5); one warm-up run first (the JVM, the Python workers);
- info: CRC-32C in 1 MiB reads into one buffer that stays in cache (the floor of a CRC pass), and
  CRC-32C of each batch on its own (one library call per batch, no parsing: the most any scan that
  calls the library per batch can reach), as time per batch.

Prints a table on stdout, progress on stderr, and writes JSON (default bench/results/inventory.json).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import add_json_argument, format_rows, git_state, progress, write_json
from crc32c import crc32c

from kts_assets.cli.common import parse_size
from kts_resources.kafka import records
from kts_resources.kafka.segment import summarize_segment

MiB = 1024 * 1024
RECORDS_PER_BATCH = 10
VALUE_BYTES = 140
BASE_TIMESTAMP = 1_700_000_000_000
REPO = Path(__file__).resolve().parent.parent


def write_partition(pdir: Path, segments: int, segment_bytes: int, seed: int) -> dict:
    """``segments`` closed segments of about ``segment_bytes`` each, plus an empty active one."""
    rng = random.Random(seed)
    pdir.mkdir(parents=True)
    offset, timestamp, batches, total = 0, BASE_TIMESTAMP, 0, 0
    for _ in range(segments + 1):
        parts, size, base = [], 0, offset
        while size + 1700 < (segment_bytes if _ < segments else 0):
            recs = [records.NewRecord(timestamp + i, b"user-%06d" % rng.randrange(100_000), rng.randbytes(VALUE_BYTES))
                    for i in range(RECORDS_PER_BATCH)]
            batch = records.build_batch(recs, base_offset=offset, partition_leader_epoch=0, producer_id=4242,
                                        producer_epoch=0, base_sequence=offset)
            parts.append(batch)
            size += len(batch)
            offset += RECORDS_PER_BATCH
            timestamp += RECORDS_PER_BATCH
        (pdir / f"{base:020d}.log").write_bytes(b"".join(parts))
        batches += len(parts)
        total += size
    return {"segments": segments, "bytes": total, "batches": batches, "records": offset}


def raw_crc(files: list[Path]) -> int:
    size = 0
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(8 * MiB):
                crc32c(chunk)
                size += len(chunk)
    return size


def crc_in_cache(files: list[Path]) -> int:
    buf = bytearray(MiB)
    view = memoryview(buf)
    size = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                crc32c(view[:n])
                size += n
    return size


def kts_segments(pdir: Path, segments: int) -> None:
    out = subprocess.run([sys.executable, "-m", "kts_assets.cli", "segments", "--json", str(pdir)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    if out.returncode != 0 or out.stdout.count(b'"health":"ok"') != segments:
        raise SystemExit(f"kts segments failed ({out.returncode}): {out.stderr.decode()[-500:]}")


def tally_in_process(files: list[Path]) -> int:
    batches = 0
    for f in files:
        s = summarize_segment(f, 0, active=False)
        if not s.healthy:
            raise SystemExit(f"bench segment does not scan cleanly: {s.problems()}")
        batches += s.batch_count
    return batches


def per_batch_crc_seconds(path: Path) -> tuple[float, int]:
    """CRC-32C of each batch's covered bytes, one call each, the slices made in the loop: no parse."""
    view = memoryview(path.read_bytes())
    bounds = [(b.position + records.V2_CRC_START, b.position + b.size) for b in records.scan_batches(view, verify_crc=False).batches]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for start, end in bounds:
            crc32c(view[start:end])
        best = min(best, time.perf_counter() - started)
    return best, len(bounds)


def timed(fn) -> float:
    gc.collect()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kts-bench-") as tmp:
        pdir = Path(tmp) / "small-0"
        progress(f"writing {args.segments} segments of {args.segment_size / MiB:.0f} MiB in ~1.6 KB batches (seed {args.seed})")
        info = write_partition(pdir, args.segments, args.segment_size, args.seed)
        files = sorted(pdir.glob("*.log"))
        progress(f"  {info['batches']:,} batches, {info['bytes'] / MiB:.0f} MiB")
        measurements = {
            "raw_crc": lambda: raw_crc(files),
            "kts_segments": lambda: kts_segments(pdir, len(files)),
            "tally_in_process": lambda: tally_in_process(files),
            "crc_in_cache": lambda: crc_in_cache(files),
        }
        spark = None
        if not args.no_spark:
            from kts_resources.kafka.logdir import PartitionDir
            from kts_resources.spark.session import build_spark_session, segment_inventory

            progress("starting Spark (local[2]) and warming it with one inventory")
            spark = build_spark_session("kts-inventory-bench", master="local[2]")
            partition = PartitionDir.at(pdir)

            def spark_inventory() -> None:
                rows = segment_inventory(spark, [partition])[0].collect()
                if len(rows) != len(files) or any(r.health != "ok" for r in rows):
                    raise SystemExit(f"Spark inventory: {len(rows)} rows, {[r.health for r in rows]}")

            spark_inventory()
            measurements["spark_inventory"] = spark_inventory
        for fn in (measurements["raw_crc"], measurements["tally_in_process"]):
            fn()  # the page cache and the code paths; not timed
        rounds: dict[str, list[float]] = {key: [] for key in measurements}
        for round_ in range(args.rounds):
            progress(f"round {round_ + 1}/{args.rounds}")
            for key, fn in measurements.items():
                rounds[key].append(timed(fn))
        per_batch_s, per_batch_n = per_batch_crc_seconds(files[0])
        if spark is not None:
            spark.stop()

    best = {key: min(values) for key, values in rounds.items()}
    raw = best["raw_crc"]
    ratios = {
        "kts_segments_over_raw_crc": raw / best["kts_segments"],
        "tally_in_process_over_raw_crc": raw / best["tally_in_process"],
        "crc_in_cache_over_raw_crc": raw / best["crc_in_cache"],
        "kts_segments_over_crc_in_cache": best["crc_in_cache"] / best["kts_segments"],
        "tally_in_process_over_crc_in_cache": best["crc_in_cache"] / best["tally_in_process"],
    }
    if "spark_inventory" in best:
        ratios["spark_inventory_over_raw_crc"] = raw / best["spark_inventory"]
    n = info["batches"]
    return {
        "params": {"segments": args.segments, "segment_size": args.segment_size, "rounds": args.rounds, "seed": args.seed,
                   "spark": not args.no_spark, "python": platform.python_version(), "cpus": os.cpu_count(),
                   "crc32c_hardware": bool(getattr(__import__("crc32c"), "hardware_based", False)),
                   "load_average": os.getloadavg()},
        "files": info,
        "seconds": best,
        "rounds_s": rounds,
        "per_batch_us": {
            "raw_crc": raw / n * 1e6,
            "crc_in_cache": best["crc_in_cache"] / n * 1e6,
            "tally_in_process": best["tally_in_process"] / n * 1e6,
            "crc_call_per_batch": per_batch_s / per_batch_n * 1e6,
        },
        "ratios": ratios,
        "git": git_state(),
        "runtime_seconds": time.perf_counter() - started,
    }


def table(result: dict) -> str:
    s, r, b = result["seconds"], result["ratios"], result["per_batch_us"]
    rows = [("measurement", "seconds", "ratio", "vs")]
    rows.append(("raw CRC-32C, 8 MiB reads, one core", f"{s['raw_crc']:.3f}", "1.00", "(baseline)"))
    rows.append(("kts segments --json (a fresh process)", f"{s['kts_segments']:.3f}", f"{r['kts_segments_over_raw_crc']:.2f}", "raw CRC-32C (goal ≥ 0.5)"))
    rows.append(("the tally in process (summarize_segment)", f"{s['tally_in_process']:.3f}", f"{r['tally_in_process_over_raw_crc']:.2f}", "raw CRC-32C"))
    if "spark_inventory" in s:
        rows.append(("Spark inventory, local[2]", f"{s['spark_inventory']:.3f}", f"{r['spark_inventory_over_raw_crc']:.2f}", "raw CRC-32C (goal ≥ 0.5)"))
    rows.append(("info: CRC-32C, 1 MiB reads in cache", f"{s['crc_in_cache']:.3f}", f"{r['crc_in_cache_over_raw_crc']:.2f}", "raw CRC-32C"))
    rows.append(("", "", f"{r['kts_segments_over_crc_in_cache']:.2f}", "kts segments vs it"))
    rows.append(("", "", f"{r['tally_in_process_over_crc_in_cache']:.2f}", "the tally vs it"))
    table_ = "\n".join(format_rows(rows, right={1, 2}))
    return (f"{table_}\n\nper batch: raw CRC-32C {b['raw_crc']:.3f} µs, in cache {b['crc_in_cache']:.3f} µs, "
            f"one CRC-32C call per batch (no parse) {b['crc_call_per_batch']:.3f} µs, the tally {b['tally_in_process']:.3f} µs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=None, help="closed segments (default 8; 2 with --quick)")
    parser.add_argument("--segment-size", type=parse_size, default=None, help="bytes each (default 96MiB; 4MiB with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds, best of each kept (default 5; 1 with --quick)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark inventory")
    parser.add_argument("--quick", action="store_true", help="small files, one round: a smoke run, not a measurement")
    parser.add_argument("--seed", type=int, default=1)
    add_json_argument(parser, "inventory")
    args = parser.parse_args(argv)
    args.segments = args.segments or (2 if args.quick else 8)
    args.segment_size = args.segment_size or (4 * MiB if args.quick else 96 * MiB)
    args.rounds = args.rounds or (1 if args.quick else 5)
    if args.rounds < 1 or args.segments < 1:
        parser.error("--rounds and --segments must be at least 1")
    result = run(args)
    print(table(result))
    f = result["files"]
    print(f"\n{f['segments']} segments, {f['bytes'] / MiB:.0f} MiB, {f['batches']:,} batches; best of {args.rounds} "
          f"interleaved rounds; python {result['params']['python']}, {result['params']['cpus']} CPUs, load "
          f"{result['params']['load_average'][0]:.1f}; {result['runtime_seconds']:.0f} s")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
