"""One remote log index per partition, beside every broker of a cluster (issue 30, item 5): broker
A's kts copies and indexes; the tier then holds versioned file sets (the seeds' bytes) named by a
pointer written last; a later build writes new keys only, and builders beside two brokers take
turns under the partition lock; a reader with broker B's empty KTS_HOME (and no log dir) refreshes
its cache from the tier and serves a fetch in the middle of a remote segment with one ranged GET —
also after A indexed segments B had not seen; the flat layout of earlier kts versions is read, and
replaced by the first build."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.manifest import INDEX_FILE_KINDS, encode_index_pointer
from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
TOPIC = "orders"
FETCH_BYTES = 4096  # within one segment: a fetch with more goes on into the next segments, one request each
ROTATE = 400  # bytes of remoteLogIndex per file set: several sets, so unchanged ones can be told from rewritten ones


class BrokerA:
    """A broker's log dir and KTS_HOME, copying into the shared store and tier in two passes (its
    newest segments held back from the first, as if not rolled yet)."""

    def __init__(self, tmp_path: Path, store, storage) -> None:
        self.root, self.home, self.store, self.storage = tmp_path / "a-logs", tmp_path / "a-home", store, storage
        simulate(self.root, SimulationConfig(seed=7, topics=(TOPIC,), partitions=1, total_bytes=240 * 1024,
                                             segment_bytes=24 * 1024, transactional_ratio=0.0))
        self.partition_dir = self.root / f"{TOPIC}-0"
        bases = sorted(int(p.stem) for p in self.partition_dir.glob("*.log"))
        self._held = tmp_path / "a-held"
        self._held.mkdir()
        for base in bases[len(bases) // 2:]:
            for f in self.partition_dir.glob(f"{base:020d}.*"):
                f.rename(self._held / f.name)

    def roll_the_rest(self) -> None:
        for f in self._held.iterdir():
            f.rename(self.partition_dir / f.name)

    def copy(self) -> None:
        [result] = copy_each_partition(LogDir(self.root), self.store, self.storage, index_cache_home=self.home)
        assert result.stopped is None and result.copied

    @property
    def tip(self) -> TopicIdPartition:
        return next(iter(self.store.partitions()))

    @property
    def directory(self) -> Path:
        return index_cache.cache_directory(self.home, self.tip)

    def index(self, home: Path | None = None) -> index_tier.IndexUpdate:
        """What the remote_log_index step does for the partition (its Spark reads aside)."""
        return index_tier.update_partition_index(
            self.store, self.storage, index_cache.cache_directory(home or self.home, self.tip), self.tip,
            lambda md: index_cache.read_segment_entries(self.storage, md), rotate_bytes=ROTATE)

    def finished(self) -> list:
        return sorted(self.store.list_remote_log_segments(self.tip, states={FINISHED}), key=lambda md: md.start_offset)


@pytest.fixture
def broker_a(tmp_path, metadata_store, remote_storage) -> BrokerA:
    return BrokerA(tmp_path, metadata_store, remote_storage)


def _broker_b_reader(tmp_path: Path, broker_a: BrokerA) -> TieredLogReader:
    """A reader beside broker B: its own (empty) KTS_HOME and a log dir without the partition."""
    (tmp_path / "b-logs").mkdir(exist_ok=True)
    return TieredLogReader(log_dirs=[tmp_path / "b-logs"], store=broker_a.store, rsm=broker_a.storage, home=tmp_path / "b-home")


def _index_listing(storage, tip) -> dict[str, bytes]:
    return {o.key: storage.fetch_object(o.key) for o in storage.list_objects(storage.keys.remote_index_prefix(tip))}


def _local_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if ri.file_base_offset(p.name) is not None}


def _records_at(broker_a: BrokerA, offset: int) -> list:
    with TieredLogReader(log_dirs=[broker_a.root], store=None, rsm=None) as local:
        return [(r.offset, r.value) for r in local.fetch(TOPIC, 0, offset, FETCH_BYTES).records]


def _middle(md) -> int:
    return (md.start_offset + md.end_offset) // 2


def test_a_build_publishes_the_seeds_files_under_a_new_version_and_names_them_last(broker_a):
    broker_a.roll_the_rest()
    broker_a.copy()
    update = broker_a.index()
    storage, tip = broker_a.storage, broker_a.tip
    pointer = index_tier.read_pointer(storage, tip)
    assert update.pointer == pointer and pointer.generation == 1 and update.uploaded == 3 * len(pointer.file_sets) > 3
    listing = _index_listing(storage, tip)
    local = _local_files(broker_a.directory)
    # Every file set of the cache, under the pointer's version, byte for byte the seeds' files.
    assert [ref.base_offset for ref in pointer.file_sets] == ri.file_set_offsets(broker_a.directory)
    named = {storage.keys.remote_index_key(tip, f"{ref.base_offset:020d}.{kind}", ref.version): f"{ref.base_offset:020d}.{kind}"
             for ref in pointer.file_sets for kind in INDEX_FILE_KINDS}
    assert set(listing) == set(named) | {storage.keys.remote_index_pointer_key(tip)}
    assert {named[key]: data for key, data in listing.items() if key in named} == local
    assert listing[storage.keys.remote_index_pointer_key(tip)] == encode_index_pointer(pointer)


def test_a_later_build_writes_only_new_keys_and_keeps_the_sets_it_did_not_change(broker_a):
    broker_a.copy()
    first = broker_a.index().pointer
    before = _index_listing(broker_a.storage, broker_a.tip)
    assert broker_a.index().published is None  # nothing new: nothing written
    assert _index_listing(broker_a.storage, broker_a.tip) == before

    broker_a.roll_the_rest()
    broker_a.copy()
    second = broker_a.index().pointer
    after = _index_listing(broker_a.storage, broker_a.tip)
    pointer_key = broker_a.storage.keys.remote_index_pointer_key(broker_a.tip)
    # No key a reader of the first pointer may be fetching was written again.
    assert {k: v for k, v in after.items() if k in before and k != pointer_key} == {k: v for k, v in before.items() if k != pointer_key}
    assert second.generation == first.generation + 1
    kept = [ref for ref in second.file_sets if ref in first.file_sets]
    rewritten = [ref for ref in second.file_sets if ref not in first.file_sets]
    assert kept and rewritten  # the older sets stay as they were, the last one grew, new ones came
    assert {ref.version for ref in rewritten} == {second.file_sets[-1].version} != {first.file_sets[-1].version}
    covered = {e.segment_id for e in ri.iter_entries(ri.load_file_set(broker_a.directory, b)
                                                      for b in ri.file_set_offsets(broker_a.directory))}
    assert covered == {md.segment_id.id for md in broker_a.finished()}


def test_a_remote_only_reader_beside_another_broker_fetches_from_the_middle_of_a_segment_with_one_ranged_get(broker_a, tmp_path):
    broker_a.roll_the_rest()
    broker_a.copy()
    broker_a.index()
    finished = broker_a.finished()
    md = finished[len(finished) // 2]
    with _broker_b_reader(tmp_path, broker_a) as reader:
        result = reader.fetch(TOPIC, 0, _middle(md), FETCH_BYTES)
    assert result.remote_requests == 1  # the entry's byte range: not the segment's offset index, then the segment
    assert [(r.offset, r.value) for r in result.records] == _records_at(broker_a, _middle(md))
    assert _local_files(index_cache.cache_directory(tmp_path / "b-home", broker_a.tip)) == _local_files(broker_a.directory)


def test_a_reader_refreshes_its_cache_when_another_broker_indexed_segments_it_has_not_seen(broker_a, tmp_path):
    broker_a.copy()
    broker_a.index()
    with _broker_b_reader(tmp_path, broker_a) as reader:
        old = broker_a.finished()
        assert reader.fetch(TOPIC, 0, _middle(old[1]), FETCH_BYTES).remote_requests == 1  # B's cache now holds generation 1

        broker_a.roll_the_rest()
        broker_a.copy()
        assert broker_a.index().pointer.generation == 2
        new = [md for md in broker_a.finished() if md not in old]
        assert new
        for md in (new[0], new[-1]):
            result = reader.fetch(TOPIC, 0, _middle(md), FETCH_BYTES)
            assert result.remote_requests == 1, md
            assert [(r.offset, r.value) for r in result.records] == _records_at(broker_a, _middle(md))


def test_a_follower_builds_from_the_tiers_sets_and_writes_nothing_when_they_cover_every_segment(broker_a, tmp_path):
    """A kts whose broker did not copy (a follower) fetches the tier's sets, reads no segment for
    them and leaves the tier alone; when the leader's index step has not run yet, it fills the sets in."""
    broker_a.copy()
    broker_a.index()
    reads = []

    def counted(md):
        reads.append(md.start_offset)
        return index_cache.read_segment_entries(broker_a.storage, md)

    b_home = tmp_path / "b-home"
    quiet = index_tier.update_partition_index(broker_a.store, broker_a.storage, index_cache.cache_directory(b_home, broker_a.tip),
                                              broker_a.tip, counted, rotate_bytes=ROTATE)
    assert quiet.published is None and reads == [] and quiet.fetched > 0

    old = broker_a.finished()
    broker_a.roll_the_rest()
    broker_a.copy()  # ... and broker A's index step does not run
    filled = index_tier.update_partition_index(broker_a.store, broker_a.storage, index_cache.cache_directory(b_home, broker_a.tip),
                                               broker_a.tip, counted, rotate_bytes=ROTATE)
    assert filled.pointer.generation == 2
    assert sorted(reads) == [md.start_offset for md in broker_a.finished() if md not in old]  # only what the sets lacked
    # Broker A's next index step finds them built: same files, nothing written.
    assert broker_a.index().published is None
    assert _local_files(broker_a.directory) == _local_files(index_cache.cache_directory(b_home, broker_a.tip))


def test_builders_beside_two_brokers_take_turns_and_each_pointer_names_a_complete_set(broker_a, tmp_path, remote_storage):
    """Both brokers' index steps at once: the partition lock makes them take turns (one's uploads and
    pointer never interleave with the other's), the second finds the first's sets and writes nothing."""
    puts: list[tuple[str, str]] = []
    put_object = remote_storage.put_object

    def recording(key, data):
        puts.append((threading.current_thread().name, key))
        return put_object(key, data)

    remote_storage.put_object = recording
    for _round in range(2):
        if _round:
            broker_a.roll_the_rest()
        broker_a.copy()
        puts.clear()
        updates = {}
        threads = [threading.Thread(target=lambda home=home: updates.__setitem__(home, broker_a.index(home)), name=home.name)
                   for home in (broker_a.home, tmp_path / "b-home")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        published = [u for u in updates.values() if u.published is not None]
        assert len(published) == 1, updates  # the later one started from the earlier one's sets
        writer = next(home.name for home, u in updates.items() if u.published is not None)
        assert {who for who, _key in puts} == {writer} and puts[-1][1].endswith("/current")  # the pointer last
        pointer = index_tier.read_pointer(remote_storage, broker_a.tip)
        assert pointer.generation == _round + 1
        for ref in pointer.file_sets:
            for kind in INDEX_FILE_KINDS:
                data = remote_storage.fetch_object(remote_storage.keys.remote_index_key(
                    broker_a.tip, f"{ref.base_offset:020d}.{kind}", ref.version), verify_checksum=f"{ref.files[kind][1]:08x}")
                assert len(data) == ref.files[kind][0]


def test_the_flat_layout_of_earlier_versions_is_read_and_replaced_by_the_first_build(broker_a, tmp_path):
    """Earlier kts versions shipped the files straight under remote-log-index/ and no pointer: a
    reader uses them (one ranged GET), and the first build takes every segment's entries from
    them (no segment read) and publishes them as a versioned set, byte for byte."""
    broker_a.roll_the_rest()
    broker_a.copy()
    storage, tip = broker_a.storage, broker_a.tip
    built = index_cache.build_partition_index(broker_a.directory, broker_a.finished(),
                                              lambda md: index_cache.read_segment_entries(storage, md), rotate_bytes=ROTATE)
    for name in built.written:  # as earlier versions published
        storage.put_object(storage.keys.remote_index_key(tip, name), broker_a.directory / name)
    md = broker_a.finished()[1]
    with _broker_b_reader(tmp_path, broker_a) as reader:
        assert reader.fetch(TOPIC, 0, _middle(md), FETCH_BYTES).remote_requests == 1

    shutil.rmtree(broker_a.home)  # a new machine: the flat files are all it has
    reads = []
    update = index_tier.update_partition_index(broker_a.store, storage, broker_a.directory, tip,
                                               lambda md: reads.append(md) or index_cache.read_segment_entries(storage, md),
                                               rotate_bytes=ROTATE)
    assert reads == [] and update.pointer.generation == 1
    named = {f"{ref.base_offset:020d}.{kind}": storage.fetch_object(storage.keys.remote_index_key(
        tip, f"{ref.base_offset:020d}.{kind}", ref.version)) for ref in update.pointer.file_sets for kind in INDEX_FILE_KINDS}
    assert named == {name: storage.fetch_object(storage.keys.remote_index_key(tip, name)) for name in built.written}


def test_a_damaged_pointer_leaves_a_reader_on_kafkas_two_requests_with_a_warning_never_an_error(broker_a, tmp_path, caplog):
    broker_a.roll_the_rest()
    broker_a.copy()
    broker_a.index()
    key = broker_a.storage.keys.remote_index_pointer_key(broker_a.tip)
    data = bytearray(broker_a.storage.fetch_object(key))
    data[-10] ^= 0x01
    broker_a.storage.put_object(key, bytes(data))
    md = broker_a.finished()[1]
    with _broker_b_reader(tmp_path, broker_a) as reader, caplog.at_level("WARNING"):
        result = reader.fetch(TOPIC, 0, _middle(md), FETCH_BYTES)
    assert result.remote_requests == 2  # the segment's offset index, then the segment
    assert [(r.offset, r.value) for r in result.records] == _records_at(broker_a, _middle(md))
    assert any("damaged remote log index pointer" in r.getMessage() and broker_a.storage.location(key) in r.getMessage()
               for r in caplog.records)
    # The next build writes the pointer again; the reader is back to one request.
    assert broker_a.index().published is not None
    with _broker_b_reader(tmp_path, broker_a) as reader:
        assert reader.fetch(TOPIC, 0, _middle(md), FETCH_BYTES).remote_requests == 1


def test_the_index_step_reads_a_local_segment_only_when_it_holds_the_uploaded_bytes(broker_a, tmp_path):
    """Beside another replica, a local file at a remote segment's base offset may have the same size
    and other bytes (its own roll points, a diverged log): the entries every broker reads then come
    from the object, never from that file. (One Spark task's work, called as the task calls it.)"""
    from kts_resources.remote_storage.base import stored_objects
    from kts_resources.spark.index_job import EntriesTask, _entries_of

    if hasattr(broker_a.storage, "bucket"):
        pytest.skip("the task opens the tier from its URI; the filesystem tier's shows the rule")
    remote_uri = (tmp_path / "remote").as_uri()
    broker_a.copy()
    md = broker_a.finished()[0]
    uploaded = stored_objects(md.custom_metadata)["log"]
    other = tmp_path / "other-replica.log"
    other.write_bytes(bytes(md.segment_size_in_bytes))  # the same size, not the uploaded bytes

    def task(crc: int | None) -> EntriesTask:
        return EntriesTask(str(md.segment_id.id), md.start_offset, md.end_offset, md.segment_size_in_bytes, uploaded.key,
                           str(other), crc)

    entries, error = _entries_of(task(uploaded.crc32c), remote_uri, None, ri.DEFAULT_CHUNK_BYTES)
    assert error is None
    assert index_cache.decode_segment_entries(entries) == index_cache.read_segment_entries(broker_a.storage, md)
    # Without a recorded CRC the size alone decides, as before: the zeros are read, and refused.
    _entries, error = _entries_of(task(None), remote_uri, None, ri.DEFAULT_CHUNK_BYTES)
    assert error is not None and str(other) in error
