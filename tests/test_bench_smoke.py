"""``bench/scan_bench.py --quick`` runs to the end and writes its JSON. No timing assertions: the numbers
depend on the machine and on whatever else runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "scan_bench.py"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def test_scan_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "scan.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"params", "files", "baselines", "scan", "decode"} <= data.keys()
    assert {"read", "crc32c"} <= data["baselines"].keys()
    for mode in ("no_crc", "crc"):
        assert {"mb_per_s", "ratio_vs_read", "ratio_vs_crc32c"} <= data["scan"][mode].keys()
    assert set(data["decode"]) == set(CODECS)
    for codec in CODECS:
        assert {"kts_records_per_s", "kafka_python_records_per_s", "ratio_kts_vs_kafka_python"} <= data["decode"][codec].keys()
