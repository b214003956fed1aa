"""Where the local segment inventory lives and how a new one replaces the old: Parquet directories
under ``KTS_HOME/inventory/``, swapped in whole so a reader sees the old or the new one, never a
mix. The coming remote-index cache keeps its Parquet the same way."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from kts_resources import settings

if TYPE_CHECKING:
    import pyarrow as pa

LOCAL_SEGMENTS = "local_segments"


def inventory_root(name: str = LOCAL_SEGMENTS) -> Path:
    """``KTS_HOME/inventory/<name>``: one Parquet directory per partition key below it."""
    return settings.kts_home() / "inventory" / name


# A file name may have 255 bytes; a Kafka topic 249 characters, so a key 260. Longer keys are cut
# and told apart by a hash, leaving room for publish()'s ".<name>.old-xxxxxxxx" beside it.
MAX_KEY_BYTES_IN_A_NAME = 200


def key_digest(key: str) -> str:
    """A short, file-name-safe stand-in for a partition key (Spark's partition directories use it:
    ``sha1(key)``'s first 16 hex digits, as ``F.substring(F.sha1(key), 1, 16)`` computes it)."""
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def inventory_path(key: str, name: str = LOCAL_SEGMENTS) -> Path:
    """``KTS_HOME/inventory/<name>/<key>.parquet`` (a Spark Parquet directory); a key too long for a
    file name keeps its first characters and gains its digest."""
    if len(key.encode()) > MAX_KEY_BYTES_IN_A_NAME:
        key = f"{key.encode()[:MAX_KEY_BYTES_IN_A_NAME - 17].decode(errors='ignore')}~{key_digest(key)}"
    return inventory_root(name) / f"{key}.parquet"


def publish(staged: Path, target: Path) -> None:
    """Replace ``target`` with ``staged`` (same file system): two renames, then the old one goes."""
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


def write_inventory_table(directory: Path, records: list[dict], schema: "pa.Schema") -> None:
    """One partition's inventory rows as a Parquet directory (one part file), as readers of a
    Spark-written one find it. Written on the driver: the rows are a few hundred bytes a segment,
    already collected, and a Spark write of them cost a sync ~2 s of job, tasks and commit (and
    would land on an executor's disk, not under the driver's KTS_HOME, on a cluster)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    part = directory / "part-00000.parquet"
    try:
        pq.write_table(pa.Table.from_pylist(records, schema=schema), part, compression="snappy")
    except OSError as e:
        if not e.errno or e.filename is not None:
            raise
        # pyarrow names no file ("Error writing bytes to file"): a full KTS_HOME must say where.
        raise OSError(e.errno, os.strerror(e.errno), os.fspath(part)) from e


def read_inventory_table(path: os.PathLike | str, columns: list[str] | None = None) -> "pa.Table":
    """One stored inventory (a Spark Parquet directory) read on the driver: its part files in name
    order, concatenated. File by file rather than through pyarrow's dataset API, whose first use
    in a process costs ~0.5 s, a routine copy pass's largest single cost for a few kB of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted(entry.path for entry in os.scandir(path) if entry.is_file() and not entry.name.startswith((".", "_")))
    tables = [pq.ParquetFile(part).read(columns=columns) for part in parts]
    if not tables:
        return pa.table({name: [] for name in columns or []})
    return pa.concat_tables(tables, promote_options="default")
