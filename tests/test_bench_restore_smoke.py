"""``bench/restore_bench.py --quick`` runs to the end (restore and cp of the same objects, the
restored .log files compared with the originals) and writes its JSON. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "restore_bench.py"


def test_restore_bench_quick_runs_verifies_and_writes_json(tmp_path):
    out = tmp_path / "restore.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(out.read_text())
    assert {"params", "rounds_seconds", "best_seconds", "ratio_vs_cp", "goal"} <= data.keys()
    assert len(data["rounds_seconds"]["restore"]) == len(data["rounds_seconds"]["cp"]) == data["params"]["rounds"]
    assert data["params"]["segments"] > 0 and data["params"]["bytes"] > 0
