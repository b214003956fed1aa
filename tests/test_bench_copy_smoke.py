"""``bench/copy_bench.py --quick`` runs to the end and writes its JSON. No timing assertions: the numbers
depend on the machine and on whatever else runs on it.

It uses ``KTS_DATABASE_URL``'s server when set (creating and dropping a database of its own there),
else an embedded PostgreSQL under a temporary KTS_HOME that it stops at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "copy_bench.py"


def test_copy_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "copy.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"params", "copy", "metadata", "runtime_seconds"} <= data.keys()

    copy = data["copy"]
    assert {"log_dir", "baselines", "storage", "copy_log_dir", "crc_scan"} <= copy.keys()
    assert {"cp", "cp_sync"} <= copy["baselines"].keys()
    for baseline in ("cp", "cp_sync"):
        assert {"seconds", "mb_per_s"} <= copy["baselines"][baseline].keys()
    for measured in ("storage", "copy_log_dir"):
        assert {"seconds", "mb_per_s", "ratio_vs_cp", "ratio_vs_cp_sync"} <= copy[measured].keys()
    assert {"upload_s", "metadata_s", "rest_s"} <= copy["copy_log_dir"]["breakdown"].keys()

    metadata = data["metadata"]
    assert {"baselines", "add_finish", "lookup", "bulk_load"} <= metadata.keys()
    assert {"select_1", "commit"} <= metadata["baselines"].keys()
    assert {"per_s", "p50_ms"} <= metadata["baselines"]["select_1"].keys()
    assert {"pairs_per_s", "ratio_vs_select_1", "ratio_vs_commit"} <= metadata["add_finish"].keys()
    assert {"segments", "per_s", "p50_ms", "p99_ms", "ratio_vs_select_1"} <= metadata["lookup"].keys()
    assert {"segments", "verified"} <= metadata["bulk_load"].keys()
