"""``bench/sync_bench.py --quick`` runs to the end, writes its JSON, and its correctness check passed
(every eligible segment COPY_SEGMENT_FINISHED after ``kts sync``, two compared byte for byte). No
timing assertions: the numbers depend on the machine and on whatever else runs on it.

One ``kts sync`` subprocess (Python, Dagster, a Spark JVM) is most of its time. It uses
``KTS_DATABASE_URL``'s server when set (creating and dropping databases of its own there), else an
embedded PostgreSQL under a temporary KTS_HOME that it stops at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "sync_bench.py"


def test_sync_bench_quick_runs_verifies_and_writes_json(tmp_path):
    out = tmp_path / "sync.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(out.read_text())
    assert {"params", "log_dir", "copy_alone", "copy_parallel", "sync", "sync_noop", "sync_per_byte",
            "copy_step", "verification", "runtime_seconds"} <= data.keys()
    assert {"load_average", "size_bytes", "repeats", "database", "dagster", "pyspark"} <= data["params"].keys()
    assert {"eligible_segments", "bytes", "log_bytes"} <= data["log_dir"].keys()

    for name in ("copy_alone", "copy_parallel", "sync"):
        assert {"seconds", "median_seconds", "mb_per_s", "rounds_seconds"} <= data[name].keys()
        assert len(data[name]["rounds_seconds"]) == data["params"]["repeats"]
    assert {"ratio_vs_copy_alone", "median_ratio_vs_copy_alone", "phases_median_seconds", "rounds"} <= data["sync"].keys()
    phases = data["sync"]["phases_median_seconds"]
    assert {"startup", "resource_init", "local_and_remote_segments", "retention_state", "other_steps", "exit"} <= phases.keys()
    # The phases come from the run's event log and the subprocess's clock: they account for its wall time.
    assert abs(sum(phases.values()) - data["sync"]["seconds"]) < 0.5
    assert {"median_seconds", "ratio_vs_copy_alone"} <= data["copy_step"].keys()
    assert data["sync_noop"] is None and data["sync_per_byte"] is None  # --quick runs no no-op sync

    verification = data["verification"]
    assert verification["passed"] is True
    assert {"copy_alone", "copy_parallel", "sync"} <= verification.keys()
    sync = verification["sync"]
    assert sync["finished_segments"] == sync["eligible_segments"] == data["log_dir"]["eligible_segments"] > 0
    assert sync["compared_segments"] >= 1 and sync["run_statuses"] == ["SUCCESS"]
