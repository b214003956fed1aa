"""Where the local segment inventory lives and how a new one replaces the old: Parquet directories
under ``KTS_HOME/inventory/``, swapped in whole so a reader sees the old or the new one, never a
mix. The coming remote-index cache keeps its Parquet the same way."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from kts_resources import settings

LOCAL_SEGMENTS = "local_segments"


def inventory_root(name: str = LOCAL_SEGMENTS) -> Path:
    """``KTS_HOME/inventory/<name>``: one Parquet directory per partition key below it."""
    return settings.kts_home() / "inventory" / name


def inventory_path(key: str, name: str = LOCAL_SEGMENTS) -> Path:
    """``KTS_HOME/inventory/<name>/<key>.parquet`` (a Spark Parquet directory)."""
    return inventory_root(name) / f"{key}.parquet"


def publish(staged: Path, target: Path) -> None:
    """Replace ``target`` with ``staged`` (same file system): two renames, then the old one goes."""
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)
