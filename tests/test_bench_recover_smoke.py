"""``bench/recover_bench.py --quick`` runs to the end and writes its JSON: the tier it writes is
recovered whole, and a rerun recovers nothing. No timing assertions: the numbers depend on the
machine and on whatever else runs on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "recover_bench.py"


def test_recover_bench_quick_runs_and_writes_json(tmp_path, pg_url):
    out = tmp_path / "recover.json"
    env = {**os.environ, "KTS_DATABASE_URL": pg_url}  # the bench makes and drops a database of its own there
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"params", "seconds", "ratios", "database", "git"} <= data.keys()
    assert data["params"]["segments"] == 1000 and data["params"]["partitions"] == 10
    assert {"recover", "rerun", "floor", "phase_store", "phase_rebuild_indexes"} <= set(data["seconds"])
    assert data["ratios"]["segments_per_second"] > 0
