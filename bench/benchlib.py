"""What every bench script shares: the repository on ``sys.path``, progress lines, the ``--json``
option and where results go, the git state measured, and the text tables.

A bench runs as ``.venv/bin/python bench/<name>_bench.py``; Python puts ``bench/`` first on
``sys.path``, which is safe because no file here is named like a standard module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

RESULTS = REPO_ROOT / "bench" / "results"

import sqlalchemy as sa  # noqa: E402  (after the repository is on sys.path, as kts's imports)
from sqlalchemy.engine import make_url  # noqa: E402

from kts_resources import settings  # noqa: E402
from kts_resources.metadata import database, embedded  # noqa: E402


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def default_json(name: str) -> Path:
    """``bench/results/<name>.json`` (git-ignored)."""
    return RESULTS / f"{name}.json"


def add_json_argument(parser: argparse.ArgumentParser, name: str) -> None:
    default = default_json(name)
    parser.add_argument("--json", type=Path, default=default,
                        help=f"where to write the results (default {default.relative_to(REPO_ROOT)})")


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    progress(f"wrote {path}")


def git_state() -> dict:
    """The commit measured and the tracked files that differed from it (others may be editing
    the working tree: the numbers are for the code as it was on disk)."""
    def git(*argv: str) -> str:
        r = subprocess.run(["git", *argv], cwd=REPO_ROOT, check=False, capture_output=True, text=True)
        return r.stdout.rstrip("\n") if r.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None,
            "modified": [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]}


def format_rows(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """A text table: the first row is the header, underlined; columns in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [f"{c:>{widths[j]}}" if j in right else f"{c:<{widths[j]}}" for j, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("-" * len(lines[0]))
    return lines


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def keep_simulated_data(engine: sa.Engine) -> None:
    """Simulated records carry a fixed 2023 clock; Kafka's default 7-day retention would expire
    them in the pipeline's retention step. Benches measure the rest: retention off by default."""
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO broker_configs (name, value) VALUES ('log.retention.ms', '-1')")


@contextlib.contextmanager
def bench_database(tmpdir: Path) -> Iterator[tuple[str, dict]]:
    """(URL of a fresh, migrated database of the bench's own, description). On
    ``KTS_DATABASE_URL``'s server when set, else on an embedded server under a temporary KTS_HOME
    that is stopped at the end. The database is dropped at the end either way."""
    configured = settings.database_url()
    home: Path | None = None
    admin: sa.Engine | None = None
    name = f"kts_bench_{uuid.uuid4().hex[:12]}"
    try:
        if configured:
            server_url = database.normalize_url(configured)
            info = {"source": "KTS_DATABASE_URL", "server": database.describe_url(server_url)}
        else:
            home = tmpdir / "kts_home" / "postgres"
            progress(f"starting an embedded PostgreSQL under {home.parent}")
            server = embedded.ensure_running(home)  # the settings kts itself starts it with
            server_url = server.url_for("postgres")
            info = {"source": "embedded", "server": database.describe_url(server_url)}
        admin = database.create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            url = _with_database(server_url, name)
            engine = database.create_engine(url, poolclass=sa.pool.NullPool)
            database.migrate(engine)
            keep_simulated_data(engine)
            with engine.connect() as conn:
                info["server_version"] = conn.exec_driver_sql("SHOW server_version").scalar()
                info["fsync"] = conn.exec_driver_sql("SHOW fsync").scalar()
                info["synchronous_commit"] = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
            engine.dispose()
            yield url, info
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        if admin is not None:
            admin.dispose()
        if home is not None:
            progress("stopping the embedded PostgreSQL")
            embedded.discard(home)  # under root its cluster is outside tmpdir


def copy_pass(log_dir, store, storage, *, threads: int | None = None, **options) -> list:
    """One copy pass over a log dir's partitions as the copy step (``remote_segments``) runs it,
    without Dagster: ``copy_partition`` for each, ``threads`` side by side (the step's default,
    ``PARALLEL_PARTITIONS``, unless given); results in the log dir's partition order."""
    from concurrent.futures import ThreadPoolExecutor

    from kts_resources.tiering.copier import PARALLEL_PARTITIONS, copy_partition

    partitions = log_dir.partitions()
    threads = PARALLEL_PARTITIONS if threads is None else threads
    if threads <= 1 or len(partitions) <= 1:
        return [copy_partition(p, log_dir, store, storage, **options) for p in partitions]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kts-bench-copy") as pool:
        return list(pool.map(lambda p: copy_partition(p, log_dir, store, storage, **options), partitions))
