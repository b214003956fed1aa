"""The remote tier (Kafka's RemoteStorageManager): one suite run against the filesystem backend and
against S3 through a real HTTP endpoint (moto server), plus each backend's own failure modes —
a file-size limit hit mid-write or a process killed mid-write (filesystem), the network cut
mid-multipart-upload and an unreachable endpoint (S3)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from crc32c import crc32c

from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
    VerifiedChecksum,
)
from kts_resources.remote_storage import (
    ChecksumMismatch,
    FileSystemRemoteStorage,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
    SourceChangedError,
    remote_storage_from_uri,
    stored_objects,
)
from kts_resources.remote_storage import factory
from kts_resources.remote_storage.base import FileSource
from kts_resources.remote_storage.filesystem import TMP_SUFFIX
from kts_resources.remote_storage.keys import SEGMENT_SUFFIXES
from kts_resources.remote_storage.s3 import S3RemoteStorage
from tests.fixtures_s3 import TEST_PREFIX, MiB, free_loopback_port, make_s3_storage

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Segment:
    metadata: RemoteLogSegmentMetadata
    data: LogSegmentData
    local: dict[str, bytes]  # suffix → the local bytes

    def copied(self, custom_metadata: dict[str, str]) -> RemoteLogSegmentMetadata:
        return dataclasses.replace(self.metadata, custom_metadata=custom_metadata)


def make_segment(
    directory: Path,
    *,
    log_size: int = 20_000,
    index_size: int = 8 * 100,
    time_index_size: int = 12 * 100,
    txn: bool = True,
    snapshot: bool = True,
    topic: str = "orders",
    start_offset: int = 1000,
    seed: int = 0,
) -> Segment:
    """A segment's files with random bytes (the remote tier does not read them as Kafka data)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    end_offset = start_offset + 99
    base = f"{start_offset:020d}"
    local = {
        "log": rng.randbytes(log_size),
        "index": rng.randbytes(index_size),
        "timeindex": rng.randbytes(time_index_size),
        "leader-epoch-checkpoint": f"0\n1\n3 {start_offset}\n".encode(),
    }
    if txn:
        local["txnindex"] = rng.randbytes(34 * 3)
    if snapshot:
        local["snapshot"] = rng.randbytes(200)
    paths = {}
    for suffix in ("log", "index", "timeindex", "txnindex"):
        if suffix in local:
            paths[suffix] = directory / f"{base}.{suffix}"
            paths[suffix].write_bytes(local[suffix])
    if snapshot:
        paths["snapshot"] = directory / f"{end_offset + 1:020d}.snapshot"
        paths["snapshot"].write_bytes(local["snapshot"])
    tip = TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), TopicPartition(topic, 3))
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, uuid.UUID(int=rng.getrandbits(128))),
        start_offset=start_offset,
        end_offset=end_offset,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_500,
        segment_size_in_bytes=log_size,
        segment_leader_epochs={3: start_offset},
    )
    data = LogSegmentData(
        log_segment=paths["log"],
        offset_index=paths["index"],
        time_index=paths["timeindex"],
        transaction_index=paths.get("txnindex"),
        producer_snapshot=paths.get("snapshot"),
        leader_epoch_index=local["leader-epoch-checkpoint"],
    )
    return Segment(metadata, data, local)


def verified(seg: Segment) -> Segment:
    """The segment as the copy procedure hands it over: its .log's CRC-32C already known."""
    st = seg.data.log_segment.stat()
    checksum = VerifiedChecksum(crc32c(seg.local["log"]), st.st_size, st.st_mtime_ns)
    return dataclasses.replace(seg, data=dataclasses.replace(seg.data, log_segment_checksum=checksum))


def tamper(storage: RemoteStorageManager, key: str, data: bytes) -> None:
    """Replace an object's bytes behind the store's back (bit rot, an operator's mistake)."""
    if isinstance(storage, FileSystemRemoteStorage):
        (storage.root / key).write_bytes(data)
    else:
        storage.client.put_object(Bucket=storage.bucket, Key=key, Body=data)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()) if root.exists() else []


# --- the shared suite: both backends -----------------------------------------------------------


def test_copy_returns_key_size_and_crc32c_of_every_object(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    custom = remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    objects = stored_objects(custom)
    assert set(objects) == set(SEGMENT_SUFFIXES)
    assert set(custom) == {f"{s}.{field}" for s in SEGMENT_SUFFIXES for field in ("key", "size", "crc32c")}
    for suffix, obj in objects.items():
        assert obj.key == remote_storage.keys.segment_key(seg.metadata.segment_id, 1000, suffix)
        assert obj.key.startswith(f"{TEST_PREFIX}/orders-")
        assert obj.size == len(seg.local[suffix])
        assert obj.crc32c == crc32c(seg.local[suffix])
        assert custom[f"{suffix}.crc32c"] == f"{crc32c(seg.local[suffix]):08x}"
    assert sorted((o.key, o.size) for o in remote_storage.list_objects()) == sorted((o.key, o.size) for o in objects.values())


def test_fetched_log_ranges_equal_the_local_bytes(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log", log_size=50_000)
    meta = seg.copied(remote_storage.copy_log_segment_data(seg.metadata, seg.data))
    log = seg.local["log"]
    # Kafka's positions: start inclusive, end inclusive; None reads to the end.
    for start, end in [(0, None), (0, 0), (0, 49_999), (123, 4567), (49_999, None), (40_000, 10**9), (7, 7)]:
        expected = log[start : None if end is None else end + 1]
        assert remote_storage.fetch_log_segment(meta, start, end) == expected, (start, end)
    assert remote_storage.fetch_log_segment(meta, 50_000) == b""
    assert remote_storage.fetch_log_segment(meta, 60_000, 70_000) == b""
    # Without custom metadata the keys are derived from the segment id: the same object.
    assert remote_storage.fetch_log_segment(seg.metadata, 10, 19) == log[10:20]


def test_streamed_log_reads_equal_the_local_bytes(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log", log_size=300_000)
    meta = seg.copied(remote_storage.copy_log_segment_data(seg.metadata, seg.data))
    with remote_storage.fetch_log_segment_stream(meta, 1000, 250_000) as stream:
        chunks = []
        while chunk := stream.read(7_777):
            chunks.append(chunk)
    assert b"".join(chunks) == seg.local["log"][1000:250_001]
    with remote_storage.fetch_log_segment_stream(meta, 299_990) as stream:
        assert stream.read() == seg.local["log"][299_990:]
    with remote_storage.fetch_log_segment_stream(meta, 400_000) as stream:
        assert stream.read() == b""


def test_indexes_snapshot_and_epoch_lineage_round_trip(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    meta = seg.copied(remote_storage.copy_log_segment_data(seg.metadata, seg.data))
    for index_type, suffix in [
        (IndexType.OFFSET, "index"),
        (IndexType.TIMESTAMP, "timeindex"),
        (IndexType.TRANSACTION, "txnindex"),
        (IndexType.PRODUCER_SNAPSHOT, "snapshot"),
        (IndexType.LEADER_EPOCH, "leader-epoch-checkpoint"),
    ]:
        assert remote_storage.fetch_index(meta, index_type) == seg.local[suffix]


def test_a_segment_without_txnindex_or_snapshot_has_no_such_objects(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log", txn=False, snapshot=False)
    custom = remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    assert set(stored_objects(custom)) == {"log", "index", "timeindex", "leader-epoch-checkpoint"}
    meta = seg.copied(custom)
    for index_type in (IndexType.TRANSACTION, IndexType.PRODUCER_SNAPSHOT):
        with pytest.raises(RemoteResourceNotFoundError):
            remote_storage.fetch_index(meta, index_type)
        with pytest.raises(RemoteResourceNotFoundError):  # also without custom metadata: a real lookup
            remote_storage.fetch_index(seg.metadata, index_type)


def test_a_multi_part_segment_round_trips(remote_storage, tmp_path):
    # 12 MiB + 3: three S3 parts (5 MiB parts) / thirteen filesystem copy chunks, CRC across all.
    seg = make_segment(tmp_path / "log", log_size=12 * MiB + 3, index_size=6 * MiB)
    custom = remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    meta = seg.copied(custom)
    assert custom["log.crc32c"] == f"{crc32c(seg.local['log']):08x}"
    assert custom["log.size"] == str(12 * MiB + 3)
    boundary = 5 * MiB
    assert remote_storage.fetch_log_segment(meta, boundary - 10, boundary + 9) == seg.local["log"][boundary - 10 : boundary + 10]
    assert remote_storage.fetch_object(custom["log.key"], custom["log.crc32c"]) == seg.local["log"]
    assert remote_storage.fetch_index(meta, IndexType.OFFSET) == seg.local["index"]
    if isinstance(remote_storage, S3RemoteStorage):
        client = remote_storage.client
        assert client.list_multipart_uploads(Bucket=remote_storage.bucket).get("Uploads", []) == []
        head = client.head_object(Bucket=remote_storage.bucket, Key=custom["log.key"], PartNumber=1)
        assert head["PartsCount"] == 3


def test_a_verified_log_is_copied_with_the_checksum_its_verification_computed(remote_storage, tmp_path):
    seg = verified(make_segment(tmp_path / "log", log_size=3 * MiB + 5))
    custom = remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    assert custom["log.crc32c"] == f"{crc32c(seg.local['log']):08x}"
    assert remote_storage.fetch_object(custom["log.key"], custom["log.crc32c"]) == seg.local["log"]
    assert remote_storage.fetch_index(seg.copied(custom), IndexType.OFFSET) == seg.local["index"]


@pytest.mark.parametrize("log_size", [64 * 1024, 12 * MiB + 3], ids=["one put", "multipart"])
def test_a_log_rewritten_in_place_since_its_verification_is_not_copied(remote_storage, tmp_path, log_size):
    # Same size, same modification time (restored): only the bytes tell, and the upload's CRC-32C does.
    storage = remote_storage
    seg = verified(make_segment(tmp_path / "log", log_size=log_size))
    path, st = seg.data.log_segment, seg.data.log_segment.stat()
    data = bytearray(seg.local["log"])
    data[100] ^= 0xFF
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(SourceChangedError, match="changed since it was verified"):
        storage.copy_log_segment_data(seg.metadata, seg.data)
    assert list(storage.list_objects()) == []
    if isinstance(storage, FileSystemRemoteStorage):
        assert files_under(storage.root) == []
    else:
        assert storage.client.list_multipart_uploads(Bucket=storage.bucket).get("Uploads", []) == []


def test_a_log_changed_since_its_verification_is_not_copied(remote_storage, tmp_path):
    seg = verified(make_segment(tmp_path / "log"))
    with open(seg.data.log_segment, "ab") as f:  # the broker (wrongly) appends to a rolled segment
        f.write(b"late")
    with pytest.raises(SourceChangedError, match="changed since it was verified"):
        remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    assert list(remote_storage.list_objects()) == []


def test_whole_reads_are_verified_against_the_recorded_checksum(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    custom = remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    meta = seg.copied(custom)
    assert remote_storage.fetch_object(custom["log.key"], custom["log.crc32c"]) == seg.local["log"]
    assert remote_storage.fetch_object(custom["log.key"]) == seg.local["log"]

    flipped = bytearray(seg.local["timeindex"])
    flipped[17] ^= 0x01
    tamper(remote_storage, custom["timeindex.key"], bytes(flipped))
    with pytest.raises(ChecksumMismatch) as e:
        remote_storage.fetch_index(meta, IndexType.TIMESTAMP)
    assert e.value.key == custom["timeindex.key"]
    assert custom["timeindex.key"] in str(e.value) and custom["timeindex.crc32c"] in str(e.value)
    with pytest.raises(ChecksumMismatch):
        remote_storage.fetch_object(custom["timeindex.key"], custom["timeindex.crc32c"])
    with pytest.raises(ValueError):
        remote_storage.fetch_object(custom["log.key"], "not-hex!")


def test_delete_is_idempotent_and_leaves_nothing(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    other = make_segment(tmp_path / "other", seed=1)
    meta = seg.copied(remote_storage.copy_log_segment_data(seg.metadata, seg.data))
    other_custom = remote_storage.copy_log_segment_data(other.metadata, other.data)
    remote_storage.delete_log_segment_data(meta)
    remote_storage.delete_log_segment_data(meta)  # twice: fine
    remote_storage.delete_log_segment_data(seg.metadata)  # without custom metadata: fine
    assert sorted(o.key for o in remote_storage.list_objects()) == sorted(o.key for o in stored_objects(other_custom).values())
    with pytest.raises(RemoteResourceNotFoundError):
        remote_storage.fetch_log_segment(meta, 0, 10)


def test_deleting_a_segment_that_was_never_copied_is_fine(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    remote_storage.delete_log_segment_data(seg.metadata)
    assert list(remote_storage.list_objects()) == []


def test_an_unreadable_file_fails_the_copy_before_anything_is_uploaded(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    broken = dataclasses.replace(seg.data, transaction_index=tmp_path / "log")  # a directory
    with pytest.raises(RemoteStorageError) as e:
        remote_storage.copy_log_segment_data(seg.metadata, broken)
    assert str(e.value).startswith(remote_storage.location(remote_storage.keys.segment_key(seg.metadata.segment_id, 1000, "txnindex")))
    assert list(remote_storage.list_objects()) == []
    missing = dataclasses.replace(seg.data, producer_snapshot=tmp_path / "gone.snapshot")
    with pytest.raises(RemoteStorageError, match="gone.snapshot"):
        remote_storage.copy_log_segment_data(seg.metadata, missing)
    assert list(remote_storage.list_objects()) == []


def test_a_log_whose_size_differs_from_the_metadata_is_not_copied(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    wrong = dataclasses.replace(seg.metadata, segment_size_in_bytes=19_999)
    with pytest.raises(RemoteStorageError, match="19999"):
        remote_storage.copy_log_segment_data(wrong, seg.data)
    assert list(remote_storage.list_objects()) == []


def test_a_topic_name_that_could_escape_the_prefix_is_rejected_before_any_io(remote_storage, tmp_path):
    for topic in ("../x", "a/b", "..", ""):
        seg = make_segment(tmp_path / "log", topic=topic)
        with pytest.raises(ValueError):
            remote_storage.copy_log_segment_data(seg.metadata, seg.data)
        with pytest.raises(ValueError):
            remote_storage.delete_log_segment_data(seg.metadata)
    assert list(remote_storage.list_objects()) == []
    if isinstance(remote_storage, FileSystemRemoteStorage):
        assert not remote_storage.root.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["log"]


def test_list_objects_lists_keys_that_parse_back_to_their_segments(remote_storage, tmp_path):
    segments = [make_segment(tmp_path / f"log{i}", seed=i, start_offset=1000 * (i + 1)) for i in range(3)]
    for seg in segments:
        remote_storage.copy_log_segment_data(seg.metadata, seg.data)
    listed = list(remote_storage.list_objects())
    assert len(listed) == 18
    parsed = {remote_storage.keys.parse(o.key) for o in listed}
    assert None not in parsed
    assert {p.remote_log_segment_id for p in parsed} == {s.metadata.segment_id for s in segments}
    assert all(o.last_modified is not None and abs(o.last_modified - time.time()) < 300 for o in listed)
    one = segments[1].metadata.segment_id
    partition_prefix = remote_storage.keys.partition_prefix(one.topic_id_partition)
    assert {o.key for o in remote_storage.list_objects(partition_prefix)} == {
        remote_storage.keys.segment_key(one, 2000, s) for s in SEGMENT_SUFFIXES
    }
    with pytest.raises(ValueError):
        list(remote_storage.list_objects("elsewhere/"))


def test_objects_copied_under_an_earlier_prefix_stay_readable_and_deletable(remote_storage, tmp_path):
    seg = make_segment(tmp_path / "log")
    meta = seg.copied(remote_storage.copy_log_segment_data(seg.metadata, seg.data))
    if isinstance(remote_storage, FileSystemRemoteStorage):
        moved = FileSystemRemoteStorage(remote_storage.root, "new-prefix")
    else:
        moved = S3RemoteStorage(remote_storage.client, remote_storage.bucket, "new-prefix")
    assert moved.fetch_log_segment(meta, 5, 9) == seg.local["log"][5:10]
    assert moved.fetch_index(meta, IndexType.OFFSET) == seg.local["index"]
    moved.delete_log_segment_data(meta)
    assert list(remote_storage.list_objects()) == []


def test_single_objects_put_fetch_and_delete_within_the_prefix(remote_storage, tmp_path):
    stored = remote_storage.put_object(f"{TEST_PREFIX}/remote-log-index/orders-3.idx", b"index bytes")
    assert (stored.size, stored.checksum) == (11, f"{crc32c(b'index bytes'):08x}")
    (tmp_path / "f").write_bytes(b"from a file")
    remote_storage.put_object(f"{TEST_PREFIX}/remote-log-index/orders-3.time", tmp_path / "f")
    assert remote_storage.fetch_object(stored.key, stored.checksum) == b"index bytes"
    for outside in ("other/x", f"{TEST_PREFIX}/../x", "/etc/passwd", f"{TEST_PREFIX}//x"):
        with pytest.raises(ValueError):
            remote_storage.put_object(outside, b"x")
    remote_storage.delete_objects([stored.key, stored.key + ".missing"])
    assert [o.key for o in remote_storage.list_objects()] == [f"{TEST_PREFIX}/remote-log-index/orders-3.time"]


def test_check_access_passes_on_a_usable_store(remote_storage):
    remote_storage.check_access()


def test_a_file_that_changes_while_being_read_is_detected(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 1000)
    source = FileSource(path)
    with open(path, "ab") as f:  # the broker (wrongly) appends to a rolled segment
        f.write(b"y" * 10)
    data = source.read(source.size + 1)
    with pytest.raises(SourceChangedError, match="changed while being uploaded"):
        source.finish(len(data))
    source.close()


# --- filesystem backend ------------------------------------------------------------------------

_CHILD_COPY = """
import json, resource, signal, sys, uuid
from pathlib import Path
from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition, VerifiedChecksum
from kts_resources.remote_storage import FileSystemRemoteStorage, RemoteStorageError

a = json.loads(sys.argv[1])
tip = TopicIdPartition(uuid.UUID(a["topic_id"]), TopicPartition(a["topic"], a["partition"]))
meta = RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, uuid.UUID(a["segment_id"])), a["start"], a["end"], 0, 1, 0,
                                a["size"], {3: a["start"]})
verified = VerifiedChecksum(**a["verified"]) if a["verified"] else None
data = LogSegmentData(Path(a["log"]), Path(a["index"]), Path(a["timeindex"]), None, None, b"0\\n1\\n3 1000\\n", verified)
storage = FileSystemRemoteStorage(a["root"], a["prefix"])
# Ignored (Python's own default), a write past the limit fails with EFBIG; at SIG_DFL it kills.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN if a["ignore_sigxfsz"] else signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (a["limit"], a["limit"]))
try:
    storage.copy_log_segment_data(meta, data)
except RemoteStorageError as e:
    print(e)
    sys.exit(3)
"""


def copy_in_child(storage: FileSystemRemoteStorage, seg: Segment, *, file_size_limit: int, ignore_sigxfsz: bool):
    """Copy ``seg`` in a child process that may not write files larger than ``file_size_limit``:
    a real write failure (EFBIG) or, with SIGXFSZ's default action, a real crash mid-write."""
    m = seg.metadata
    args = {
        "topic_id": str(m.topic_id_partition.topic_id), "topic": m.topic_id_partition.topic,
        "partition": m.topic_id_partition.partition, "segment_id": str(m.segment_id.id),
        "start": m.start_offset, "end": m.end_offset, "size": m.segment_size_in_bytes,
        "log": str(seg.data.log_segment), "index": str(seg.data.offset_index), "timeindex": str(seg.data.time_index),
        "root": str(storage.root), "prefix": storage.keys.prefix, "limit": file_size_limit, "ignore_sigxfsz": ignore_sigxfsz,
        "verified": dataclasses.asdict(seg.data.log_segment_checksum) if seg.data.log_segment_checksum else None,
    }  # fmt: skip
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", _CHILD_COPY, json.dumps(args)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_filesystem_write_failing_mid_object_removes_everything_the_copy_wrote(tmp_path):
    storage = FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX)
    # The .log and .index fit under the limit; the .timeindex fails half way through.
    seg = make_segment(tmp_path / "log", log_size=1 * MiB, index_size=1 * MiB, time_index_size=4 * MiB, txn=False, snapshot=False)
    done = copy_in_child(storage, seg, file_size_limit=2 * MiB, ignore_sigxfsz=True)
    assert done.returncode == 3, done.stderr
    assert ".timeindex" in done.stdout and "too large" in done.stdout.lower()
    assert list(storage.list_objects()) == []
    assert files_under(storage.root) == []  # no object, no temporary file


def test_filesystem_copy_of_a_verified_log_failing_mid_object_removes_everything(tmp_path):
    storage = FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX)
    seg = verified(make_segment(tmp_path / "log", log_size=3 * MiB, txn=False, snapshot=False))
    done = copy_in_child(storage, seg, file_size_limit=2 * MiB, ignore_sigxfsz=True)
    assert done.returncode == 3, done.stderr
    assert ".log" in done.stdout and "too large" in done.stdout.lower()
    assert files_under(storage.root) == []


@pytest.mark.parametrize("checksum", ["computed", "known from the verification"])
def test_filesystem_crash_mid_write_leaves_only_an_invisible_temporary_file(tmp_path, checksum):
    storage = FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX)
    seg = make_segment(tmp_path / "log", log_size=3 * MiB, txn=False, snapshot=False)
    if checksum == "known from the verification":
        seg = verified(seg)
    crashed = copy_in_child(storage, seg, file_size_limit=1 * MiB, ignore_sigxfsz=False)
    assert crashed.returncode == -signal.SIGXFSZ, crashed.stderr
    leftovers = files_under(storage.root)
    assert len(leftovers) == 1 and leftovers[0].endswith(TMP_SUFFIX)
    assert list(storage.list_objects()) == []  # nothing visible under any final key
    with pytest.raises(RemoteResourceNotFoundError):
        storage.fetch_log_segment(seg.metadata, 0, 10)
    assert storage.abort_incomplete_uploads(older_than_s=3600) == 0  # too young: may be a live copy
    storage.delete_log_segment_data(seg.metadata)  # the repair path of a COPY_SEGMENT_STARTED segment
    assert files_under(storage.root) == []


def test_filesystem_abort_incomplete_uploads_removes_old_temporary_files(tmp_path):
    storage = FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX)
    seg = make_segment(tmp_path / "log")
    custom = storage.copy_log_segment_data(seg.metadata, seg.data)
    tmp = storage.root / custom["log.key"]
    stale = tmp.with_name(f".{tmp.name}.0123456789abcdef{TMP_SUFFIX}")
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert storage.abort_incomplete_uploads(older_than_s=3600) == 1
    assert not stale.exists() and len(list(storage.list_objects())) == 6


def test_filesystem_never_follows_a_link_out_of_the_root(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    storage = FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX)
    seg = make_segment(tmp_path / "log")
    partition_dir = storage.root / storage.keys.partition_prefix(seg.metadata.topic_id_partition)
    partition_dir.parent.mkdir(parents=True)
    partition_dir.symlink_to(outside, target_is_directory=True)
    with pytest.raises(RemoteStorageError, match="never follows links"):
        storage.copy_log_segment_data(seg.metadata, seg.data)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    # Reads, listings and deletes do not pass through the link either.
    link_key = storage.keys.partition_prefix(seg.metadata.topic_id_partition) + "secret"
    with pytest.raises(RemoteStorageError):
        storage.fetch_object(link_key)
    assert list(storage.list_objects()) == []
    with pytest.raises(RemoteStorageError, match="never follows links"):
        storage.delete_objects([link_key])
    assert (outside / "secret").exists()
    # A link to a file in place of an object is not an object.
    partition_dir.unlink()
    partition_dir.mkdir()
    (partition_dir / "alias.log").symlink_to(outside / "secret")
    assert list(storage.list_objects()) == []
    with pytest.raises(RemoteStorageError):
        storage.fetch_object(link_key.rsplit("/", 1)[0] + "/alias.log")


def test_filesystem_check_access_names_a_root_that_cannot_be_used(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(RemoteStorageError, match="not writable"):
        FileSystemRemoteStorage(tmp_path / "file" / "remote").check_access()


# --- S3 backend --------------------------------------------------------------------------------


def test_s3_network_cut_mid_multipart_upload_leaves_no_object_and_is_cleaned_up(
    s3_cutting_proxy, s3_endpoint, s3_bucket, s3_client, tmp_path
):
    storage = make_s3_storage(s3_cutting_proxy.url, s3_bucket, max_concurrency=1)
    seg = make_segment(tmp_path / "log", log_size=12 * MiB)
    log_key = storage.keys.segment_key(seg.metadata.segment_id, 1000, "log")
    s3_cutting_proxy.cut_after = 8 * MiB  # part 1 arrives, part 2 is cut half way
    started = time.monotonic()
    with pytest.raises(RemoteStorageError) as e:
        storage.copy_log_segment_data(seg.metadata, seg.data)
    # Hang-only: the client's timeouts and retries are checked as configuration below (test_s3_client_…).
    assert time.monotonic() - started < 300
    assert str(e.value).startswith(f"s3://{s3_bucket}/{log_key}: ")
    assert "could not abort multipart upload" in "\n".join(getattr(e.value, "__notes__", []))

    s3_cutting_proxy.heal()
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0  # nothing visible
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == [log_key]  # invisible, but billed until aborted
    storage.delete_log_segment_data(seg.metadata)  # the repair path aborts it
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_s3_abort_incomplete_uploads_aborts_only_under_the_prefix(s3_endpoint, s3_bucket, s3_client):
    storage = make_s3_storage(s3_endpoint, s3_bucket)
    mine = s3_client.create_multipart_upload(Bucket=s3_bucket, Key=f"{TEST_PREFIX}/t-x/0/crashed.log")
    s3_client.upload_part(Bucket=s3_bucket, Key=mine["Key"], UploadId=mine["UploadId"], PartNumber=1, Body=b"part")
    s3_client.create_multipart_upload(Bucket=s3_bucket, Key="someone-else/object")
    assert storage.abort_incomplete_uploads(older_than_s=0) == 1
    assert [u["Key"] for u in s3_client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]] == ["someone-else/object"]


def test_s3_unreachable_endpoint_is_one_clear_error_quickly(fake_aws_credentials, tmp_path):
    storage = S3RemoteStorage(factory.s3_client(f"http://127.0.0.1:{free_loopback_port()}"), "kts-bucket", "p")
    seg = make_segment(tmp_path / "log")
    started = time.monotonic()
    with pytest.raises(RemoteStorageError, match=r"^s3://kts-bucket/: cannot reach the S3 endpoint http://127\.0\.0\.1"):
        storage.check_access()
    with pytest.raises(RemoteStorageError, match=r"^s3://kts-bucket/p/orders-.*\.log: cannot reach the S3 endpoint"):
        storage.copy_log_segment_data(seg.metadata, seg.data)
    with pytest.raises(RemoteStorageError, match="cannot reach"):
        storage.fetch_log_segment(seg.metadata, 0, 10)
    assert time.monotonic() - started < 300  # hang-only, as above


def test_s3_missing_bucket_is_named(s3_endpoint, tmp_path):
    storage = make_s3_storage(s3_endpoint, "kts-no-such-bucket")
    with pytest.raises(RemoteStorageError, match="bucket 'kts-no-such-bucket' does not exist"):
        storage.check_access()
    seg = make_segment(tmp_path / "log")
    with pytest.raises(RemoteStorageError, match="does not exist"):
        storage.copy_log_segment_data(seg.metadata, seg.data)


def test_an_s3_uri_honours_kts_s3_endpoint_url(s3_endpoint, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_S3_ENDPOINT_URL", s3_endpoint)
    storage = remote_storage_from_uri(f"s3://{s3_bucket}/kafka/tiered")
    assert (storage.bucket, storage.keys.prefix) == (s3_bucket, "kafka/tiered")
    seg = make_segment(tmp_path / "log")
    meta = seg.copied(storage.copy_log_segment_data(seg.metadata, seg.data))
    assert storage.fetch_log_segment(meta, 100, 199) == seg.local["log"][100:200]
    monkeypatch.setenv("KTS_REMOTE_URI", f"s3://{s3_bucket}/kafka/tiered")
    assert remote_storage_from_uri().fetch_index(meta, IndexType.OFFSET) == seg.local["index"]


def test_s3_works_over_the_client_of_dagster_aws_s3resource(s3_endpoint, s3_bucket, tmp_path):
    from dagster_aws.s3 import S3Resource

    client = S3Resource(endpoint_url=s3_endpoint, region_name="us-east-1").get_client()
    storage = S3RemoteStorage(client, s3_bucket, "via-dagster")
    seg = make_segment(tmp_path / "log")
    meta = seg.copied(storage.copy_log_segment_data(seg.metadata, seg.data))
    assert storage.fetch_object(meta.custom_metadata["log.key"], meta.custom_metadata["log.crc32c"]) == seg.local["log"]


# --- factory -----------------------------------------------------------------------------------


def test_factory_picks_the_backend_from_the_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("KTS_REMOTE_URI", raising=False)
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "home"))
    default = remote_storage_from_uri()
    assert isinstance(default, FileSystemRemoteStorage) and default.root == tmp_path / "home" / "remote"
    explicit = remote_storage_from_uri((tmp_path / "tier with space").as_uri())
    assert isinstance(explicit, FileSystemRemoteStorage) and explicit.root == tmp_path / "tier with space"
    monkeypatch.setenv("KTS_REMOTE_URI", "s3://some-bucket/a/b")
    s3 = remote_storage_from_uri()
    assert isinstance(s3, S3RemoteStorage) and (s3.bucket, s3.keys.prefix) == ("some-bucket", "a/b")
    for bad in ("http://x/y", "file://host/path", "s3:///prefix", "s3://b/../x", "/plain/path"):
        with pytest.raises(ValueError):
            remote_storage_from_uri(bad)


@pytest.mark.parametrize("uri", ["file:relative", "file:rel/tier", "file:./tier", "file:../tier", "file:"])
def test_a_relative_file_uri_is_refused(uri, tmp_path, monkeypatch):
    """Issue 34 finding 7: a relative tier is a different tier in every working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="absolute"):
        remote_storage_from_uri(uri)
    assert list(tmp_path.iterdir()) == []


def test_an_absolute_file_uri_without_an_authority_is_accepted(tmp_path):
    storage = remote_storage_from_uri(f"file:{tmp_path / 'tier'}")
    assert isinstance(storage, FileSystemRemoteStorage) and storage.root == tmp_path / "tier"


# --- the one S3 client builder -----------------------------------------------------------------


def _client_settings(client) -> dict:
    """What decides how a client talks to a bucket."""
    config = client.meta.config
    return {
        "endpoint": client.meta.endpoint_url,
        "retries": config.retries,
        "connect_timeout": config.connect_timeout,
        "read_timeout": config.read_timeout,
        "addressing_style": (config.s3 or {}).get("addressing_style"),
        "max_pool_connections": config.max_pool_connections,
    }


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", None], ids=["s3-compatible", "aws"])
def test_the_cli_and_the_pipeline_build_the_same_s3_client(monkeypatch, fake_aws_credentials, endpoint):
    """`kts` (remote_storage_from_uri) and the Dagster resource (dagster-aws's S3Resource) talk to a
    bucket identically: same endpoint, retries, timeouts and addressing style."""
    from kts_resources.resources import KtsS3Resource, RemoteTierResource

    monkeypatch.setenv("KTS_REMOTE_URI", "s3://some-bucket/tiered")
    if endpoint:
        monkeypatch.setenv("KTS_S3_ENDPOINT_URL", endpoint)
    else:
        monkeypatch.delenv("KTS_S3_ENDPOINT_URL", raising=False)
    cli = _client_settings(remote_storage_from_uri().client)
    pipeline = _client_settings(RemoteTierResource().storage().client)
    via_s3_resource = _client_settings(KtsS3Resource(endpoint_url=endpoint).get_client())
    assert cli == pipeline == via_s3_resource
    assert cli["retries"] == {"mode": "standard", "total_max_attempts": factory.S3_MAX_ATTEMPTS}
    assert (cli["connect_timeout"], cli["read_timeout"]) == (factory.S3_CONNECT_TIMEOUT_S, factory.S3_READ_TIMEOUT_S)
    if endpoint:
        assert cli["endpoint"] == endpoint and cli["addressing_style"] == "path"
    else:
        assert "amazonaws.com" in cli["endpoint"] and cli["addressing_style"] is None


def test_only_the_factory_builds_s3_clients():
    """Every S3 client of the package comes from remote_storage.factory.s3_client: no other module
    calls boto3 or dagster-aws's S3Resource for one."""
    import re

    root = Path(__file__).resolve().parent.parent
    builder = root / "kts_resources" / "remote_storage" / "factory.py"
    pattern = re.compile(r"boto3\.(client|resource|session)|\.client\(\s*['\"]s3|\.resource\(\s*['\"]s3|\bS3Resource\(|construct_s3_client|\bSession\(")
    modules = [p for package in ("kts_assets", "kts_resources") for p in sorted((root / package).rglob("*.py"))]
    assert builder in modules and pattern.search(builder.read_text())  # the pattern finds the builder itself
    offences = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in modules if p != builder
                for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offences == [], "build S3 clients with remote_storage.factory.s3_client:\n" + "\n".join(offences)


# -- the file tier's modes (issue 14.5) -----------------------------------------------------------


def _modes_under(root: Path) -> tuple[set[int], set[int]]:
    dirs, files = set(), set()
    for path in root.rglob("*"):
        (dirs if path.is_dir() else files).add(path.stat().st_mode & 0o777)
    return dirs, files


def test_filesystem_tier_creates_dirs_0700_and_files_0600_whatever_the_umask_and_source_mode(tmp_path):
    seg = make_segment(tmp_path / "log")
    for path in seg.data.log_segment, seg.data.offset_index, seg.data.time_index:
        path.chmod(0o644)  # a broker's umask 022
    old_umask = os.umask(0)  # the loosest umask: nothing would be masked off
    try:
        storage = remote_storage_from_uri((tmp_path / "remote" / "tier").as_uri())
        storage.copy_log_segment_data(seg.metadata, seg.data)
    finally:
        os.umask(old_umask)
    dirs, files = _modes_under(tmp_path / "remote")
    assert (tmp_path / "remote").stat().st_mode & 0o777 == 0o700  # created by the tier, so its mode too
    assert (dirs, files) == ({0o700}, {0o600})


def test_filesystem_tier_modes_can_be_configured_in_the_uri(tmp_path):
    seg = make_segment(tmp_path / "log")
    old_umask = os.umask(0o077)  # the strictest: the configured modes still hold exactly
    try:
        storage = remote_storage_from_uri((tmp_path / "remote").as_uri() + "?dir_mode=0750&file_mode=0640")
        storage.copy_log_segment_data(seg.metadata, seg.data)
    finally:
        os.umask(old_umask)
    assert _modes_under(tmp_path / "remote") == ({0o750}, {0o640})


def test_filesystem_tier_keeps_the_mode_of_a_root_it_did_not_create(tmp_path):
    root = tmp_path / "shared-root"
    root.mkdir()
    root.chmod(0o755)
    storage = FileSystemRemoteStorage(root, TEST_PREFIX)
    storage.copy_log_segment_data(make_segment(tmp_path / "log").metadata, make_segment(tmp_path / "log").data)
    assert root.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("query, message", [
    ("dir_mode=0600", "owner needs rwx"),
    ("file_mode=0400", "owner needs rw"),
    ("file_mode=rw", "not an octal mode"),
    ("mode=0700", "unknown parameter 'mode'"),
])
def test_filesystem_tier_refuses_a_bad_mode_in_the_uri(tmp_path, query, message):
    with pytest.raises(ValueError, match=message):
        remote_storage_from_uri((tmp_path / "remote").as_uri() + "?" + query)


RELATIVE_TIER_COMMANDS = [
    ("sync",), ("fetch", "orders", "0", "--offset", "0"), ("offsets", "orders", "0", "--earliest"),
    ("scrub",), ("recover",), ("restore", "orders", "0", "--to", "restored"), ("topic", "delete", "orders"),
    ("delete-records", "orders", "0", "--before", "1"),
]


@pytest.mark.parametrize("command", RELATIVE_TIER_COMMANDS, ids=lambda c: c[0])
def test_every_command_that_opens_the_tier_refuses_a_relative_file_uri(command, pg_url, tmp_path):
    """One line naming KTS_REMOTE_URI, exit 2, and nothing created where the relative path points."""
    import os
    import subprocess
    import sys

    from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

    simulate(tmp_path / "logs", SimulationConfig(seed=1, topics=("orders",), partitions=1, total_bytes=16 * 1024))
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(tmp_path / "logs"),
           "KTS_HOME": str(tmp_path / "home"), "KTS_REMOTE_URI": "file:relative"}
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", *command], env=env, cwd=work, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "KTS_REMOTE_URI" in lines[0] and "absolute" in lines[0], lines
    assert list(work.iterdir()) == []
