"""Is the environment fit for a pass? Checked before Spark or Dagster start, in seconds.

Each check returns the problems it found as one line each (empty: fine): the remote tier parses,
answers and takes a write; the metadata store answers; the log dirs exist and hold partitions.
A wrong setting then costs the user a line and a few seconds, not a Spark start and a traceback.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

# Budget per network probe: a closed port or a dead endpoint answers (or not) well inside it.
PROBE_TIMEOUT_S = 2.0
PROBE_PREFIX = ".kts-preflight-"  # at the top of the tier: no directory left behind


def missing_log_dirs(log_dirs: Sequence[Path]) -> list[str]:
    """One line per log dir that does not exist or is not a directory: a wrong KTS_LOG_DIRS, which
    every command that reports on the log dirs must say rather than show an empty log."""
    return [f"log dir {p}: {'not a directory' if p.exists() else 'no such directory'} (KTS_LOG_DIRS)"
            for p in log_dirs if not p.is_dir()]


def check_log_dirs(log_dirs: Sequence[Path]) -> list[str]:
    """Every log dir exists and is a directory, and together they hold at least one partition.
    A missing log dir is the line to fix first: that the rest hold no partition is then no news."""
    from kts_resources.kafka.logdir import LogDir

    problems = missing_log_dirs(log_dirs)
    if not problems and not any(LogDir(p).partitions() for p in log_dirs):
        problems.append(f"no partitions in the log dirs ({', '.join(map(str, log_dirs))}); set KTS_LOG_DIRS")
    return problems


def check_remote_tier(uri: str) -> list[str]:
    """The URI parses, its endpoint answers, and a small probe object can be written and deleted."""
    from kts_resources import settings

    endpoint_url = settings.s3_endpoint_url()
    if uri.startswith("s3://") and endpoint_url:
        # Before boto3 is even imported: a dead endpoint is the commonest fault, and boto3 retries it long.
        endpoint = _host_port(endpoint_url)
        unreachable = _tcp_unreachable(endpoint)
        if unreachable:
            return [f"remote tier {uri}: endpoint {endpoint} is unreachable: {unreachable}"]
    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    try:
        storage = remote_storage_from_uri(uri)
    except ValueError as e:
        return [f"KTS_REMOTE_URI: {e}"]
    try:
        storage.check_access()
        probe = f"{storage.keys.root}{PROBE_PREFIX}{secrets.token_hex(8)}"
        storage.put_object(probe, b"kts preflight probe\n")
        storage.delete_objects([probe])
    except RemoteStorageError as e:
        return [f"remote tier: {_first_line(e)}"]
    except (OSError, ValueError) as e:
        return [f"remote tier {uri}: {_first_line(e)}"]
    finally:
        storage.close()
    return []


def check_metadata_store(url_factory) -> list[str]:
    """The metadata store's server answers a query. ``url_factory()`` names it (for the embedded
    server it starts it, which the pass needs anyway)."""
    import sqlalchemy as sa

    from kts_resources.metadata import database

    try:
        url = url_factory()
        engine = database.create_engine(url, connect_args={"connect_timeout": max(1, int(PROBE_TIMEOUT_S))})
    except Exception as e:  # noqa: BLE001 - a bad URL of any kind is one line
        return [f"metadata store (KTS_DATABASE_URL): {_first_line(e)}"]
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as e:  # noqa: BLE001
        return [f"metadata store at {database.describe_url(engine.url)} is unreachable: {_first_line(getattr(e, 'orig', None) or e)}"]
    finally:
        engine.dispose()
    return []


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _tcp_unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to ``host:port`` fails within the probe budget, or None when it opens.
    (boto3 retries a dead endpoint for far longer than a pre-flight may take.)"""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
