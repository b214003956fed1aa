"""``bench/inventory_bench.py --quick --no-spark`` runs to the end and writes its JSON: `kts segments`
and the tally read every small-batch segment as healthy. No timing assertions: the numbers depend
on the machine and on whatever else runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "inventory_bench.py"


def test_inventory_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "inventory.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-spark", "--segment-size", "1MiB", "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["files"]["segments"] == 2 and data["files"]["batches"] > 1000
    assert set(data["seconds"]) == {"raw_crc", "kts_segments", "tally_in_process", "crc_in_cache"}
    assert data["ratios"]["kts_segments_over_raw_crc"] > 0 and "spark_inventory_over_raw_crc" not in data["ratios"]
