"""kts's environment contract (ARCHITECTURE.md): where things are when nothing is configured."""

from __future__ import annotations

import os
from pathlib import Path


def kts_home() -> Path:
    """``KTS_HOME``, default ``~/.kts``: embedded Postgres, the local remote tier, caches."""
    return Path(os.environ.get("KTS_HOME") or Path.home() / ".kts").expanduser()


def log_dirs() -> list[Path]:
    """``KTS_LOG_DIRS`` (comma-separated broker log dirs), default ``KTS_HOME/logs``."""
    raw = os.environ.get("KTS_LOG_DIRS", "")
    dirs = [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]
    return dirs or [kts_home() / "logs"]


def s3_endpoint_url() -> str | None:
    """``KTS_S3_ENDPOINT_URL``: an S3-compatible endpoint (MinIO, Ceph, moto); None for AWS."""
    return os.environ.get("KTS_S3_ENDPOINT_URL", "").strip() or None
