"""A segment truncated by another process while kts reads it (the broker truncating its log after
a leader change, or anything else) fails that segment's copy with one line, never kills kts with
SIGBUS, leaves nothing half-written in the tier, and the next pass goes on (issue 34, finding 9).

The truncations are real ones of the file on disk: a remote storage wrapper truncates the segment
right after the upload took its first chunk, or a file read truncates it right after the
verification's first read, each in a process of its own (a SIGBUS would kill pytest itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kts_resources.tiering.copier import copy_partition
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.segment import scan_segment_file
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.factory import remote_storage_from_uri

REPO_ROOT = Path(__file__).resolve().parent.parent
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED

# One copy pass in its own process; argv: log dir, remote root, where to truncate ("upload" or
# "verify"), the segment's base offset, the size to truncate it to. Prints the result as JSON.
DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from kts_resources.tiering.copier import copy_partition
    from kts_resources.kafka.logdir import LogDir
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage

    log_dir, remote, where, victim_base, truncate_to = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    victim = Path(log_dir) / "orders-0" / f"{victim_base:020d}.log"

    class TruncatingOnFirstChunk(FileSystemRemoteStorage):
        # The broker truncates the segment right after the upload read its first chunk.
        def _put_object(self, key, source):
            if where == "upload" and getattr(source, "description", None) == str(victim):
                chunks = source.chunks
                def truncating(size):
                    for i, chunk in enumerate(chunks(size)):
                        if i == 0:
                            os.truncate(victim, truncate_to)
                        yield chunk
                source.chunks = truncating
            return super()._put_object(key, source)

    if where == "verify":
        # The broker truncates the segment once the verification has opened it and taken its size,
        # whether it then reads (preadv) or maps (mmap) the file.
        import mmap
        def truncate_once(fd):
            if os.path.samestat(os.fstat(fd), os.stat(victim)) and os.stat(victim).st_size > truncate_to:
                os.truncate(victim, truncate_to)
        real_preadv, real_mmap = os.preadv, mmap.mmap
        def preadv(fd, buffers, offset, *rest):
            truncate_once(fd)
            return real_preadv(fd, buffers, offset, *rest)
        def mapping(fileno, *args, **kwargs):
            mapped = real_mmap(fileno, *args, **kwargs)
            truncate_once(fileno)
            return mapped
        os.preadv, mmap.mmap = preadv, mapping

    store = RemoteLogMetadataStore.from_env()
    storage = FileSystemRemoteStorage(remote)
    if where == "upload":
        storage = TruncatingOnFirstChunk(remote)
    [partition] = LogDir(log_dir).partitions()
    result = copy_partition(partition, LogDir(log_dir), store, storage)
    print(json.dumps({"copied": [md.start_offset for md in result.copied], "stopped": result.stopped}))
""")


@pytest.fixture
def log_dir(tmp_path) -> Path:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=5, topics=("orders",), partitions=1, total_bytes=400 * 1024, segment_bytes=96 * 1024))
    return root


def _batch_boundary(segment_log: Path) -> tuple[int, int]:
    """A batch boundary half-way through the segment, where a broker truncates: (its byte
    position, the last offset before it)."""
    _size, scan = scan_segment_file(segment_log)
    assert len(scan.batches) > 4
    half = len(scan.batches) // 2
    return scan.batches[half].position, scan.batches[half - 1].last_offset


def _copy_in_a_process(log_dir: Path, remote: Path, pg_url: str, where: str, victim_base: int, truncate_to: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTS_DATABASE_URL": pg_url}
    return subprocess.run([sys.executable, "-c", DRIVER, str(log_dir), str(remote), where, str(victim_base), str(truncate_to)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("where", ["upload", "verify"])
def test_a_segment_truncated_while_it_is_copied_fails_its_copy_with_one_line_and_the_next_pass_goes_on(
        where, log_dir, tmp_path, pg_url, metadata_store):
    remote = tmp_path / "remote"
    [partition] = LogDir(log_dir).partitions()
    segments = partition.segments()
    victim = segments[1]
    size = victim.log.stat().st_size
    truncate_to, kept_last_offset = _batch_boundary(victim.log)

    run = _copy_in_a_process(log_dir, remote, pg_url, where, victim.base_offset, truncate_to)
    assert run.returncode == 0, f"exit {run.returncode} (SIGBUS is -7): {run.stderr[-3000:]}"
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["copied"] == [segments[0].base_offset]
    stopped = result["stopped"]
    assert "\n" not in stopped and str(victim.log) in stopped
    assert f"{size}" in stopped and f"{truncate_to}" in stopped, stopped  # the size expected and the size found

    # Nothing half-written: only the finished segment's objects are in the tier, no row is left STARTED.
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
    storage = remote_storage_from_uri(remote.as_uri())
    rows = metadata_store.list_remote_log_segments(tip, states=set(RemoteLogSegmentState))
    assert {md.state for md in rows} <= {FINISHED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED}
    [finished] = [md for md in rows if md.state is FINISHED]
    assert {obj.key for obj in storage.list_objects()} <= set(storage.segment_object_keys(finished).values())

    # The next pass copies the truncated segment as what it now holds and goes on past it; the
    # offsets the truncation took are in neither tier, and say so.
    again = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert again.stopped is None
    assert [(md.start_offset, md.end_offset) for md in again.copied][:2] == [
        (victim.base_offset, kept_last_offset), (segments[2].base_offset, again.copied[1].end_offset)]
    assert again.lost == [(kept_last_offset + 1, segments[2].base_offset - 1)]
