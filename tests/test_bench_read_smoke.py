"""``bench/read_bench.py --quick --no-spark`` runs to the end and writes its JSON: requests were
counted at the S3 endpoint, fetches timed on both tiers, the partition replayed. No timing
assertions — but one count: with the remote log index cached, a fetch is about one request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "read_bench.py"


def test_read_bench_quick_runs_and_writes_json(tmp_path, pg_url):
    out = tmp_path / "read.json"
    env = {**os.environ, "KTS_DATABASE_URL": pg_url}
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-spark", "--json", str(out)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    # Only a fetch that crosses a remote segment's end needs a second request.
    assert 1.0 <= data["requests"]["requests_per_fetch_indexed"] < 1.5
    assert data["requests"]["requests_per_fetch_kafka_path"] >= 2.0
    assert data["replay"]["bytes"] > 0 and all(v > 0 for v in data["ratios"].values())
