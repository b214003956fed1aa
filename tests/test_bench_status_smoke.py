"""``bench/status_bench.py --quick`` runs to the end and writes its JSON: both commands ran and
exited 0 over a copied log dir. No timing assertions: the numbers depend on the machine and on
whatever else runs on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "status_bench.py"


def test_status_bench_quick_runs_and_writes_json(tmp_path, pg_url):
    out = tmp_path / "status.json"
    env = {**os.environ, "KTS_DATABASE_URL": pg_url}  # the bench makes and drops a database of its own there
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"params", "seconds", "ratios", "database", "git"} <= data.keys()
    assert data["params"]["partitions"] == 20 and data["params"]["remote_segments"] > 0
    assert set(data["seconds"]) == {"python", "segments", "status"}
    assert data["ratios"]["status_over_segments"] > 0
