"""``bench/daemon_run_bench.py --quick`` runs to the end: a copy_job run submitted to the queue,
launched by ``dagster-daemon`` in a process of its own, and a ``kts sync`` on the same work both
tier every eligible segment, and the JSON carries the ratio. No timing assertions: the numbers
depend on the machine and on whatever else runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "daemon_run_bench.py"


def test_daemon_run_bench_quick_runs_verifies_and_writes_json(tmp_path):
    out = tmp_path / "daemon_run.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(out.read_text())
    assert {"params", "log_dir", "sync", "daemon_run", "rounds", "verification", "runtime_seconds"} <= data.keys()
    assert {"ratio_vs_sync", "median_ratio_vs_sync", "goal", "meets_goal", "rounds_seconds"} <= data["daemon_run"].keys()
    assert len(data["daemon_run"]["rounds_seconds"]) == len(data["sync"]["rounds_seconds"]) == data["params"]["repeats"]
    daemon_rounds = [r for r in data["rounds"] if r["measurement"] == "daemon_run"]
    assert daemon_rounds and all(r["status"] == "SUCCESS" for r in daemon_rounds)
    verification = data["verification"]
    assert verification["passed"] is True and {"sync", "daemon_run"} <= verification.keys()
    for name in ("sync", "daemon_run"):
        assert verification[name]["finished_segments"] == verification[name]["eligible_segments"] > 0
