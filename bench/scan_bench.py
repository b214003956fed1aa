"""How fast kts reads segments, as ratios against physical limits measured in the same run.

    .venv/bin/python bench/scan_bench.py [--size 256MiB] [--quick] [--repeats N] [--json PATH]

Writes a deterministic segment (seeded; ~16 KiB batches of 100–1000-byte records with keys and a
header) plus one smaller segment per codec holding the same records, then measures, best of N,
with the page cache warm:

- baseline "read": the file read in 1 MiB chunks into one buffer (what moving the bytes costs);
- baseline "crc32c": one CRC-32C over the whole file through a fresh mmap (what checking costs;
  the same CRC over bytes already in memory is reported too, to show what the page faults cost);
- the kts header-only scan (``scan_batches``) without and with CRC checks, against both;
- full decode, kts (``scan_batches`` + ``decode_batch``) against kafka-python (``MemoryRecords`` /
  ``DefaultRecordBatch``), CRC checked by both, per codec, in records per second.

The machine may be shared, so the results are the ratios; absolute rates are printed beside them
only for orientation. The measurements are interleaved (one round of everything, N rounds) so that
a noisy neighbour slows every measurement alike, and each keeps its best round.

Prints a table on stdout, progress on stderr, and writes JSON (default bench/results/scan.json).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import crc32c
from benchlib import add_json_argument, format_rows, progress, write_json

from kts_assets.cli.common import parse_size
from kts_resources.kafka import codecs, records
from kts_resources.kafka.files import mapped

try:
    from kafka.record.memory_records import MemoryRecords
    from kafka.version import __version__ as KAFKA_PYTHON_VERSION
except ImportError:  # pragma: no cover - a dev dependency
    raise SystemExit("bench/scan_bench.py compares against kafka-python: pip install -e '.[dev]'") from None

MiB = 1024 * 1024
READ_CHUNK = MiB
BATCH_TARGET = 16 * 1024  # uncompressed record bytes per batch, like a producer's batch.size
RECORD_VALUE_SIZES = (100, 1000)
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TIMESTAMP = 1_700_000_000_000

QUICK_SIZE = 8 * MiB
QUICK_CODEC_SIZE = 1 * MiB


# --- test data ----------------------------------------------------------------------------------


def _event_corpus(rng: random.Random, size: int) -> bytes:
    """JSON-ish event lines, so that values compress the way application payloads do."""
    events = ("page_view", "add_to_cart", "checkout", "search", "login", "logout", "click", "purchase")
    paths = ("/", "/products", "/products/{}", "/cart", "/search?q={}", "/account", "/orders/{}")
    agents = ("Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4)",
              "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X)", "okhttp/4.12.0")
    countries = ("DE", "US", "FR", "GB", "JP", "BR", "IN", "NL")
    lines = []
    total = 0
    while total < size:
        line = (
            f'{{"event":"{rng.choice(events)}","user_id":{rng.randrange(1_000_000)},'
            f'"session":"{rng.randbytes(8).hex()}","path":"{rng.choice(paths).format(rng.randrange(10_000))}",'
            f'"country":"{rng.choice(countries)}","amount":{rng.randrange(100_000) / 100},'
            f'"ua":"{rng.choice(agents)}","ts":{BASE_TIMESTAMP + rng.randrange(10**9)}}}\n'
        ).encode()
        lines.append(line)
        total += len(line)
    return b"".join(lines)


def record_batches(seed: int) -> Iterator[list[records.NewRecord]]:
    """An endless, deterministic stream of batches' worth of records (same seed, same records)."""
    rng = random.Random(seed)
    corpus = _event_corpus(rng, 1 * MiB)
    lo, hi = RECORD_VALUE_SIZES
    timestamp = BASE_TIMESTAMP
    while True:
        batch: list[records.NewRecord] = []
        size = 0
        while size < BATCH_TARGET:
            n = rng.randint(lo, hi)
            start = rng.randrange(len(corpus) - n)
            key = b"user-%06d" % rng.randrange(100_000)
            headers = (("trace-id", rng.randbytes(8).hex().encode()),)
            timestamp += rng.randrange(5)
            batch.append(records.NewRecord(timestamp, key, corpus[start : start + n], headers))
            size += n + len(key) + 40  # value, key, header and record framing
        yield batch


def write_segment(path: Path, *, seed: int, codec: int, stop_bytes: int, uncompressed: bool) -> dict:
    """Write batches until ``stop_bytes`` are reached: file bytes, or uncompressed batch bytes when
    ``uncompressed`` (so every codec's file holds the same records)."""
    offset = 0
    batches = 0
    file_bytes = 0
    raw_bytes = 0
    with open(path, "wb") as f:
        for recs in record_batches(seed):
            batch = records.build_batch(recs, base_offset=offset, codec=codec, partition_leader_epoch=0,
                                        producer_id=4242, producer_epoch=0, base_sequence=offset)
            f.write(batch)
            offset += len(recs)
            batches += 1
            file_bytes += len(batch)
            raw_bytes += sum(len(r.value) + len(r.key) for r in recs)
            if (raw_bytes if uncompressed else file_bytes) >= stop_bytes:
                break
    return {"bytes": file_bytes, "batches": batches, "records": offset, "key_value_bytes": raw_bytes}


# --- measurements -------------------------------------------------------------------------------


def measure_read(path: Path) -> int:
    buf = bytearray(READ_CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total


def measure_crc32c(path: Path) -> int:
    with mapped(path) as view:
        crc32c.crc32c(view)
        return len(view)


def measure_scan(path: Path, verify_crc: bool) -> int:
    with mapped(path) as view:
        scan = records.scan_batches(view, verify_crc=verify_crc)
        if scan.invalid is not None or (verify_crc and scan.crc_failures):
            raise SystemExit(f"bench segment does not scan cleanly: {scan.invalid} / {len(scan.crc_failures)} CRC failures")
        return len(view)


def decode_kts(data: bytes) -> int:
    view = memoryview(data)
    decode_batch = records.decode_batch
    n = 0
    for header in records.scan_batches(view, verify_crc=False).batches:
        n += len(decode_batch(view, header, verify_crc=True))
    return n


def decode_kafka_python(data: bytes) -> int:
    batches = MemoryRecords(data)
    n = 0
    while batches.has_next():
        batch = batches.next_batch()
        if not batch.validate_crc():  # what kafka-python's Fetcher does with check_crcs (the default)
            raise SystemExit("kafka-python: bench batch fails its CRC")
        for _ in batch:
            n += 1
    return n


def check_decoders_agree(data: bytes) -> None:
    """Both decoders read the same records (once, untimed): otherwise the comparison means nothing."""
    view = memoryview(data)
    ours = [r for h in records.scan_batches(view, verify_crc=False).batches for r in records.decode_batch(view, h)]
    theirs = []
    batches = MemoryRecords(data)
    while batches.has_next():
        theirs.extend(batches.next_batch())
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for a, b in zip(ours, theirs):
        assert (a.offset, a.timestamp, a.key, a.value, list(a.headers)) == (b.offset, b.timestamp, b.key, b.value, b.headers)


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    units = fn()
    return time.perf_counter() - start, units


# --- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    size = QUICK_SIZE if args.quick and args.size is None else (args.size or 256 * MiB)
    codec_size = args.codec_size or (QUICK_CODEC_SIZE if args.quick else min(max(size // 16, MiB), 16 * MiB))
    repeats = args.repeats or (1 if args.quick else 3)

    with tempfile.TemporaryDirectory(prefix="kts-bench-") as tmp:
        tmpdir = Path(tmp)
        progress(f"writing a {size / MiB:.0f} MiB uncompressed segment (seed {args.seed})")
        t = time.perf_counter()
        main_path = tmpdir / "00000000000000000000.log"
        main_info = write_segment(main_path, seed=args.seed, codec=codecs.NONE, stop_bytes=size, uncompressed=False)
        progress(f"  {main_info['batches']} batches, {main_info['records']} records in {time.perf_counter() - t:.1f} s")
        codec_files: dict[str, dict] = {}
        codec_data: dict[str, bytes] = {}
        for name in CODECS:
            progress(f"writing the {name} segment ({codec_size / MiB:.0f} MiB of keys and values)")
            path = tmpdir / f"{name}.log"
            codec_files[name] = write_segment(path, seed=args.seed + 1, codec=codecs.codec_id(name),
                                              stop_bytes=codec_size, uncompressed=True)
            codec_data[name] = path.read_bytes()
            check_decoders_agree(codec_data[name])

        in_memory = main_path.read_bytes()
        measurements: dict[str, Callable[[], int]] = {
            "read": lambda: measure_read(main_path),
            "crc32c": lambda: measure_crc32c(main_path),
            "crc32c_in_memory": lambda: (crc32c.crc32c(in_memory), len(in_memory))[1],
            "scan_no_crc": lambda: measure_scan(main_path, False),
            "scan_crc": lambda: measure_scan(main_path, True),
        }
        for name in CODECS:
            measurements[f"decode_{name}_kts"] = lambda d=codec_data[name]: decode_kts(d)
            measurements[f"decode_{name}_kafka_python"] = lambda d=codec_data[name]: decode_kafka_python(d)

        for fn in list(measurements.values())[:5]:
            fn()  # warm the page cache and the code paths; not timed
        best: dict[str, tuple[float, int]] = {}
        for round_ in range(repeats):
            progress(f"round {round_ + 1}/{repeats}")
            for key, fn in measurements.items():
                seconds, units = timed(fn)
                if key not in best or seconds < best[key][0]:
                    best[key] = (seconds, units)
        del in_memory

    def rate(key: str) -> float:
        seconds, units = best[key]
        return units / seconds

    read_bps, crc_bps = rate("read"), rate("crc32c")
    result: dict = {
        "params": {
            "size_bytes": main_info["bytes"],
            "codec_key_value_bytes": codec_size,
            "repeats": repeats,
            "quick": bool(args.quick),
            "seed": args.seed,
            "batch_target_bytes": BATCH_TARGET,
            "record_value_bytes": list(RECORD_VALUE_SIZES),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "crc32c_hardware": bool(getattr(crc32c, "hardware_based", False)),
            "kafka_python": KAFKA_PYTHON_VERSION,
        },
        "files": {"scan": main_info, "codecs": codec_files},
        "baselines": {
            "read": {"seconds": best["read"][0], "mb_per_s": read_bps / 1e6},
            "crc32c": {"seconds": best["crc32c"][0], "mb_per_s": crc_bps / 1e6, "ratio_vs_read": crc_bps / read_bps},
            # Not a baseline: the same CRC over bytes already in memory, i.e. without the mmap's page faults.
            "crc32c_in_memory": {"seconds": best["crc32c_in_memory"][0], "mb_per_s": rate("crc32c_in_memory") / 1e6,
                                 "ratio_vs_crc32c": rate("crc32c_in_memory") / crc_bps},
        },
        "scan": {},
        "decode": {},
    }
    for key, label in (("scan_no_crc", "no_crc"), ("scan_crc", "crc")):
        bps = rate(key)
        result["scan"][label] = {
            "seconds": best[key][0],
            "mb_per_s": bps / 1e6,
            "batches_per_s": main_info["batches"] / best[key][0],
            "ratio_vs_read": bps / read_bps,
            "ratio_vs_crc32c": bps / crc_bps,
        }
    for name in CODECS:
        ours, theirs = rate(f"decode_{name}_kts"), rate(f"decode_{name}_kafka_python")
        result["decode"][name] = {
            "records": codec_files[name]["records"],
            "kts_records_per_s": ours,
            "kafka_python_records_per_s": theirs,
            "ratio_kts_vs_kafka_python": ours / theirs,
        }
    result["runtime_seconds"] = time.perf_counter() - started
    return result


def table(result: dict) -> str:
    rows = [("measurement", "rate", "ratio", "vs")]
    b, s = result["baselines"], result["scan"]
    rows.append(("read, 1 MiB chunks", f"{b['read']['mb_per_s']:,.0f} MB/s", "1.00", "(baseline)"))
    rows.append(("CRC-32C over the file (mmap)", f"{b['crc32c']['mb_per_s']:,.0f} MB/s", "1.00", "(baseline)"))
    m = b["crc32c_in_memory"]
    rows.append(("  info: CRC-32C, bytes in memory", f"{m['mb_per_s']:,.0f} MB/s", f"{m['ratio_vs_crc32c']:.2f}", "CRC-32C (mmap)"))
    for label, key in (("scan_batches, no CRC", "no_crc"), ("scan_batches, CRC", "crc")):
        m = s[key]
        rows.append((label, f"{m['mb_per_s']:,.0f} MB/s", f"{m['ratio_vs_crc32c']:.2f}", "CRC-32C"))
        rows.append(("", "", f"{m['ratio_vs_read']:.2f}", "read"))
    for name, d in result["decode"].items():
        rows.append((f"decode {name}: kts", f"{d['kts_records_per_s']:,.0f} rec/s", f"{d['ratio_kts_vs_kafka_python']:.2f}", "kafka-python"))
        rows.append((f"decode {name}: kafka-python", f"{d['kafka_python_records_per_s']:,.0f} rec/s", "1.00", "(baseline)"))
    return "\n".join(format_rows(rows, right={1, 2}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=None, help="uncompressed segment size (default 256MiB; 8MiB with --quick)")
    parser.add_argument("--codec-size", type=parse_size, default=None,
                        help="key+value bytes in each per-codec segment (default size/16 within 1-16 MiB; 1MiB with --quick)")
    parser.add_argument("--quick", action="store_true", help="small files, one round: a smoke run, not a measurement")
    parser.add_argument("--repeats", type=int, default=None, help="rounds; each measurement keeps its best (default 3; 1 with --quick)")
    parser.add_argument("--seed", type=int, default=1)
    add_json_argument(parser, "scan")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")

    result = run(args)
    print(table(result))
    p = result["params"]
    print(f"\n{p['size_bytes'] / MiB:.0f} MiB segment, {result['files']['scan']['batches']} batches; "
          f"best of {p['repeats']}; python {p['python']}, {p['cpus']} CPUs; {result['runtime_seconds']:.0f} s")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
