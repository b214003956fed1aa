"""How long ``kts status`` takes over 100 partitions, against ``kts segments`` of one partition:
what it costs to look at every partition's two tiers, as a ratio measured in the same run.

    .venv/bin/python bench/status_bench.py [--partitions 100] [--repeats 5] [--quick] [--json PATH]

Simulates a log dir of ``--partitions`` partitions (4 topics, a few small segments each), copies
it once to a remote tier in a directory (so that status reads rows from the metadata store, a
database of the bench's own: ``KTS_DATABASE_URL``'s server, else an embedded one it stops), then
times each command as the user runs it — a fresh ``kts`` process, wall clock, best of the rounds.
Both commands import neither Dagster nor PySpark; Python's own start-up is timed as the floor.

Prints a table on stdout, progress on stderr, and writes JSON (default bench/results/status.json).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, bench_database, copy_pass, format_rows, git_state, progress, write_json

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_storage import FileSystemRemoteStorage

TOPICS = ("orders", "clicks", "page.views", "payments")
KTS = Path(sys.executable).parent / "kts"


def wall(argv: list[str], env: dict[str, str], repeats: int) -> float:
    """Best wall-clock seconds of ``argv`` run to completion ``repeats`` times (it must exit 0)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"status_bench: {' '.join(map(str, argv))} exited {done.returncode}: {done.stderr.strip()[-400:]}")
        best = min(best, elapsed)
    return best


def run(args: argparse.Namespace) -> dict:
    partitions = args.partitions or (20 if args.quick else 100)
    repeats = args.repeats or (1 if args.quick else 5)
    if partitions % len(TOPICS):
        raise SystemExit(f"status_bench: --partitions {partitions} is not a multiple of {len(TOPICS)} topics")
    with tempfile.TemporaryDirectory(prefix="kts-status-bench-") as tmp, bench_database(Path(tmp)) as (url, db_info):
        root = Path(tmp) / "logs"
        progress(f"simulating {partitions} partitions under {root}")
        simulate(root, SimulationConfig(seed=args.seed, topics=TOPICS, partitions=partitions // len(TOPICS),
                                        total_bytes=partitions * 64 * 1024, segment_bytes=16 * 1024))
        with RemoteLogMetadataStore.from_url(url, migrate=True) as store:
            copied = copy_pass(LogDir(root), store, FileSystemRemoteStorage(Path(tmp) / "remote"))
        segments = sum(len(p.segments()) for p in LogDir(root).partitions())
        env = {**os.environ, "KTS_HOME": str(Path(tmp) / "home"), "KTS_LOG_DIRS": str(root), "KTS_DATABASE_URL": url,
               "KTS_REMOTE_URI": (Path(tmp) / "remote").as_uri()}
        one = root / f"{TOPICS[0]}-0"
        progress(f"timing, best of {repeats}")
        times = {
            "python": wall([sys.executable, "-c", "pass"], env, repeats),
            "segments": wall([str(KTS), "segments", str(one), "--json"], env, repeats),
            "status": wall([str(KTS), "status", "--json"], env, repeats),
        }
    return {
        "params": {"partitions": partitions, "segments": segments, "remote_segments": sum(len(r.copied) for r in copied),
                   "repeats": repeats, "quick": args.quick, "seed": args.seed},
        "seconds": times,
        "ratios": {"status_over_segments": times["status"] / times["segments"],
                   "segments_over_python_startup": times["segments"] / times["python"]},
        "database": db_info, "git": git_state(), "python": platform.python_version(), "cpus": os.cpu_count(),
    }


def table(result: dict) -> str:
    p, t, r = result["params"], result["seconds"], result["ratios"]
    rows = [("measurement", "ratio"),
            (f"kts status over {p['partitions']} partitions / kts segments of one partition", f"{r['status_over_segments']:.2f}"),
            ("kts segments of one partition / python -c pass", f"{r['segments_over_python_startup']:.2f}")]
    return "\n".join(format_rows(rows, right={1}) + [
        f"\n{p['partitions']} partitions, {p['segments']} local segments, {p['remote_segments']} remote; best of {p['repeats']}; "
        f"status {t['status']:.2f} s, segments {t['segments']:.2f} s, python {t['python']:.2f} s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=None, help="partitions over 4 topics (default 100; 20 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds; each command keeps its best (default 5; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="20 partitions, one round: a smoke run, not a measurement")
    parser.add_argument("--seed", type=int, default=1)
    add_json_argument(parser, "status")
    args = parser.parse_args(argv)
    result = run(args)
    print(table(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
