"""The UI labels the remote tier by what it is (issue 31: it said S3 for a local directory): the
tier-writing assets carry the kind ``s3`` for an S3 tier and ``filesystem`` for a directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

KINDS = ("import json, kts_assets.definitions as d; "
         "print(json.dumps({s.key.to_user_string(): sorted(s.kinds) for s in d.defs.resolve_all_asset_specs()}))")


@pytest.mark.parametrize("uri, kind", [("s3://bucket/tiered", "s3"), ("file:///var/tmp/kts-tier", "filesystem"), (None, "filesystem")])
def test_the_tier_writing_assets_carry_the_tiers_kind(uri, kind, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KTS_REMOTE_URI"} | {"KTS_HOME": str(tmp_path)}
    if uri is not None:
        env["KTS_REMOTE_URI"] = uri
    out = subprocess.run([sys.executable, "-c", KINDS], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    kinds = json.loads(out.stdout.strip().splitlines()[-1])
    for asset in ("remote_segments", "retention_state", "remote_log_index"):
        assert kind in kinds[asset] and ({"s3", "filesystem"} - {kind}).isdisjoint(kinds[asset]), (asset, kinds[asset])
    assert "s3" not in kinds["local_segments"] and "filesystem" not in kinds["local_segments"]
