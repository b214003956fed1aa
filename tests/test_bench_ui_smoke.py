"""``bench/ui_bench.py --quick`` runs to the end: ``kts ui`` answers with kts's location loaded, and
what the UI's Materialize on remote_segments sends over GraphQL and a copy_job launch for the same
partition both succeed; the JSON carries the first-page seconds and the ratio. No timing
assertions: the numbers depend on the machine and on whatever else runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "ui_bench.py"


def test_ui_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "ui.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(out.read_text())
    assert {"params", "ui_first_page", "launches", "ratio", "goal_ratio", "meets_goal"} <= data.keys()
    assert len(data["ui_first_page"]["seconds"]) == data["params"]["starts"] == 1
    materialize, copy = data["launches"]["materialize"], data["launches"]["copy_job"]
    # Materialize is the copy step with remote_segments' own checks: not the tier-wide scrub.
    assert [r["steps"] for r in materialize["rounds"]] == [["local_and_remote_segments"]]
    assert "remote_tier_scrubbed" not in data["materialize_check_selection"]
    assert copy["rounds"][0]["steps"] == ["local_and_remote_segments", "remote_log_index", "retention_state"]
