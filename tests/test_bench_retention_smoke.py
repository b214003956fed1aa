"""``bench/retention_bench.py --quick`` runs to the end and writes its JSON: the plan expired what
retention.ms says and both tiers' expiry rounds deleted every due segment. No timing assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "retention_bench.py"


def test_retention_bench_quick_runs_and_writes_json(tmp_path, pg_url):
    out = tmp_path / "retention.json"
    env = {**os.environ, "KTS_DATABASE_URL": pg_url}
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["plan"]["rows"] == 20_000 and data["plan"]["expired"] == 2_000
    assert set(data["expiry"]) == {"filesystem", "s3"}
    for expiry in data["expiry"].values():  # rounds of one partition each, every due segment expired
        assert expiry["rounds"] and all(r["segments"] > 0 and r["objects"] >= r["segments"] for r in expiry["rounds"])
        assert expiry["min_ratio"] <= expiry["median_ratio"] <= expiry["max_ratio"]
    assert all(v > 0 for v in data["ratios"].values())
