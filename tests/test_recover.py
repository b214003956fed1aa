"""A self-describing remote tier and ``kts recover`` (issue 13, items 2 and 3), on both tiers (a
directory, and S3 through moto's HTTP endpoint): every finished segment has a manifest written
before COPY_SEGMENT_FINISHED; after the database is dropped, ``kts recover`` rebuilds the store and
the remote log indexes from the tier alone and ``kts status``, ``kts offsets`` and ``kts fetch``
answer as before; objects without a manifest are reported, a damaged manifest is one error line,
and a rerun (also after a SIGKILL half-way) converges without touching the tier."""

from __future__ import annotations

import dataclasses

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.tiering.copier import copy_partition
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import read_records
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata import database
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import recorded_manifest, stored_objects
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.remote_storage.keys import MANIFEST_SUFFIX
from kts_resources.remote_storage.manifest import decode_manifest

from .fixtures_s3 import make_s3_storage
from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
REPO_ROOT = Path(__file__).resolve().parent.parent


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(params=["filesystem", "s3"])
def tier(request, tmp_path):
    """(storage, environment naming it for a `kts` subprocess), once per remote tier."""
    if request.param == "filesystem":
        uri = (tmp_path / "remote").as_uri()
        return remote_storage_from_uri(uri), {"KTS_REMOTE_URI": uri}
    endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket")
    return make_s3_storage(endpoint, bucket), {"KTS_REMOTE_URI": f"s3://{bucket}/tiered", "KTS_S3_ENDPOINT_URL": endpoint}


@pytest.fixture
def log_dir(tmp_path) -> Path:
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=13, topics=("orders", "page.views"), partitions=2, total_bytes=320 * 1024,
                                    segment_bytes=24 * 1024))
    return root


def _store(url: str) -> RemoteLogMetadataStore:
    return RemoteLogMetadataStore(database.create_engine(url))


def _env(pg_url: str, tmp_path: Path, log_dir: Path, tier_env: dict) -> dict:
    return {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
            **tier_env}


def kts(env, *args, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _drop_and_recreate(pg_url: str, pg_admin_url: str, pg_template: str) -> None:
    """The database is lost: dropped, and created again freshly migrated (from the session's template)."""
    name = make_url(pg_url).database
    admin = database.create_engine(pg_admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    admin.dispose()


def _listing(storage) -> dict[str, int]:
    return {o.key: o.size for o in storage.list_objects()}


def _tips(log_dir: Path) -> list[TopicIdPartition]:
    return [TopicIdPartition(p.metadata().topic_id, p.topic_partition) for p in LogDir(log_dir).partitions()]


def _copy_and_age(log_dir: Path, store, storage) -> None:
    """A copy pass (orders with config overrides), then the first segment of orders-0 gone
    locally (reads of it go remote)."""
    orders = next(p for p in LogDir(log_dir).partitions() if p.topic == "orders")
    store.ensure_topic("orders", orders.metadata().topic_id, {"retention.ms": "-1", "local.retention.ms": "3600000"})
    results = copy_each_partition(LogDir(log_dir), store, storage)
    assert all(r.stopped is None and r.skipped is None and r.copied for r in results)
    first = sorted((log_dir / "orders-0").glob("*.log"))[0]
    for f in (log_dir / "orders-0").glob(first.stem + ".*"):
        f.unlink()


def _recoverable(state):
    """The partition state with its lineage as far as the tier holds it: the newest segment's
    leader-epoch object is what recover restores; an epoch begun after that segment (or in a
    partition with nothing copied) is recorded again by the next copy pass."""
    return dataclasses.replace(state, lineage=tuple(e for e in state.lineage if e.start_offset <= state.highest_copied_offset))


def _rows(store, log_dir: Path) -> dict:
    """The store's view of every partition: its state, first observed offset, topic configs, and
    every remote segment (all but the time of its last state change)."""
    out = {}
    for tip in _tips(log_dir):
        segments = [(md.segment_id, md.start_offset, md.end_offset, md.max_timestamp_ms, md.broker_id,
                     md.segment_size_in_bytes, dict(md.segment_leader_epochs), md.state, dict(md.custom_metadata))
                    for md in store.list_remote_log_segments(tip, states=set(RemoteLogSegmentState))]
        out[str(tip.topic_partition)] = (_recoverable(store.partition_state(tip)), store.first_observed_offset(tip),
                                         store.topic_configs(tip.topic), segments)
    return out


def _answers(env, log_dir: Path) -> dict:
    """What a user sees: status, ListOffsets answers (earliest, latest tiered, by timestamp) and
    fetches of remote data, by offset and from a timestamp's offset."""
    records = [r for _h, rs in read_records(next(iter(sorted((log_dir / "orders-1").glob("*.log")))).read_bytes()) for r in rs]
    middle = records[len(records) // 2]
    questions = {"status": ["status", "--json"]}
    for topic, partition in (("orders", "0"), ("orders", "1"), ("page.views", "1")):
        for spec in (["--earliest"], ["--latest-tiered"], ["--latest"], ["--timestamp", str(middle.timestamp)]):
            questions[f"offsets {topic}-{partition} {' '.join(spec)}"] = ["offsets", topic, partition, *spec, "--json"]
    for offset in (0, 5, middle.offset):
        questions[f"fetch orders-0 {offset}"] = ["fetch", "orders", "0", "--offset", str(offset), "--max-bytes", "8192", "--json"]
    return dict(zip(questions, kts_session(env, list(questions.values()))))


def kts_session(env, commands: list[list[str]]) -> list:
    """Each command's JSON answer, all asked in one process (tests/cli_session.py); each must exit 0."""
    result = subprocess.run([sys.executable, "-m", "tests.cli_session"], input=json.dumps(commands), env=env,
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    for argv, answer in zip(commands, answers):
        assert answer["status"] == 0, (argv, answer, result.stderr)
    return [json.loads(answer["stdout"]) for answer in answers]


# --- manifests -----------------------------------------------------------------------------------


def test_every_finished_segment_has_a_manifest_describing_it_beside_its_objects(log_dir, metadata_store, tier):
    storage, _ = tier
    copy_each_partition(LogDir(log_dir), metadata_store, storage)
    listing = _listing(storage)
    manifests = {k for k in listing if k.endswith(f".{MANIFEST_SUFFIX}")}
    finished = [md for tip in _tips(log_dir) for md in metadata_store.list_remote_log_segments(tip, states={FINISHED})]
    assert len(finished) == len(manifests) > 4
    for md in finished:
        recorded = recorded_manifest(md.custom_metadata)
        assert recorded.key == storage.keys.manifest_key(md.segment_id, md.start_offset) and recorded.key in manifests
        manifest = decode_manifest(storage.fetch_object(recorded.key, recorded.checksum), where=recorded.key)
        assert manifest.metadata.segment_id == md.segment_id
        assert (manifest.metadata.start_offset, manifest.metadata.end_offset, manifest.metadata.max_timestamp_ms,
                manifest.metadata.segment_size_in_bytes, dict(manifest.metadata.segment_leader_epochs)) == (
            md.start_offset, md.end_offset, md.max_timestamp_ms, md.segment_size_in_bytes, dict(md.segment_leader_epochs))
        assert {k: v for k, v in md.custom_metadata.items() if not k.startswith("manifest.")} == dict(manifest.metadata.custom_metadata)
        assert all(listing[obj.key] == obj.size for obj in manifest.objects.values())


def test_the_manifest_is_in_the_tier_before_the_store_says_copy_segment_finished(log_dir, metadata_store, tier):
    storage, _ = tier
    seen = []
    original = metadata_store.update_remote_log_segment_metadata

    def update(segment_id, new_state, *args, **kwargs):
        if new_state is FINISHED:
            md = metadata_store.segment(segment_id)
            seen.append(storage.keys.manifest_key(md.segment_id, md.start_offset) in _listing(storage))
        return original(segment_id, new_state, *args, **kwargs)

    metadata_store.update_remote_log_segment_metadata = update
    partition = LogDir(log_dir).partitions()[0]
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert len(result.copied) > 2 and seen == [True] * len(result.copied)


def test_a_failed_manifest_upload_fails_the_copy_which_is_cleaned_up(log_dir, metadata_store, tier):
    from kts_resources.remote_storage.base import RemoteStorageError

    storage, _ = tier
    original, puts = storage.put_object, []

    def put_object(key, data):
        if key.endswith(f".{MANIFEST_SUFFIX}"):
            puts.append(key)
            if len(puts) == 2:
                raise RemoteStorageError(f"{storage.location(key)}: injected failure")
        return original(key, data)

    storage.put_object = put_object
    partition = LogDir(log_dir).partitions()[0]
    result = copy_partition(partition, LogDir(log_dir), metadata_store, storage)
    assert len(result.copied) == 1 and "failed and was cleaned up" in result.stopped and "injected failure" in result.stopped
    tip = TopicIdPartition(partition.metadata().topic_id, partition.topic_partition)
    states = [md.state for md in metadata_store.list_remote_log_segments(tip, states=set(RemoteLogSegmentState))]
    assert states == [FINISHED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED]
    assert set(_listing(storage)) == set(storage.segment_object_keys(result.copied[0]).values()) & set(_listing(storage))


def test_a_sigkill_between_upload_and_finish_leaves_no_finished_segment_without_a_manifest(log_dir, pg_url, metadata_store, tier):
    storage, tier_env = tier
    env = {**os.environ, **tier_env, "KTS_DATABASE_URL": pg_url}
    run = lambda *crash: subprocess.run([sys.executable, "-m", "tests.copy_driver", str(log_dir), *crash], cwd=REPO_ROOT,
                                        env=env, capture_output=True, text=True, timeout=180)
    assert run("after-upload").returncode == -9
    assert run().returncode == 0
    finished = {md.segment_id.id: md for tip in _tips(log_dir)
                for md in metadata_store.list_remote_log_segments(tip, states={FINISHED})}
    manifests = {storage.keys.parse(k).segment_id for k in _listing(storage) if k.endswith(f".{MANIFEST_SUFFIX}")}
    # The crashed attempt's manifest went with its objects when the next pass cleaned it up.
    assert manifests == set(finished)
    assert all(recorded_manifest(md.custom_metadata) is not None for md in finished.values())


def test_segments_copied_before_manifests_existed_get_theirs_on_the_next_pass(log_dir, metadata_store, tier):
    storage, _ = tier
    copy_each_partition(LogDir(log_dir), metadata_store, storage)
    # As an older kts left them: no manifest objects, none recorded.
    storage.delete_objects([k for k in _listing(storage) if k.endswith(f".{MANIFEST_SUFFIX}")])
    with metadata_store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE remote_segments SET custom_metadata = custom_metadata - 'manifest.key' "
                             "- 'manifest.size' - 'manifest.crc32c'")
    results = copy_each_partition(LogDir(log_dir), metadata_store, storage)
    finished = [md for tip in _tips(log_dir) for md in metadata_store.list_remote_log_segments(tip, states={FINISHED})]
    assert sum(r.manifests_backfilled for r in results) == len(finished)
    listing = _listing(storage)
    assert all(recorded_manifest(md.custom_metadata).key in listing for md in finished)
    assert sum(r.manifests_backfilled for r in copy_each_partition(LogDir(log_dir), metadata_store, storage)) == 0


def test_a_lost_or_damaged_manifest_is_found_and_written_again_by_the_next_pass(log_dir, metadata_store, tier):
    from kts_resources.maintenance.remote_integrity import inspect_finished_segments

    storage, _ = tier
    copy_each_partition(LogDir(log_dir), metadata_store, storage)
    tip = _tips(log_dir)[0]
    finished = metadata_store.list_remote_log_segments(tip, states={FINISHED})
    gone, damaged = (recorded_manifest(md.custom_metadata) for md in finished[:2])
    storage.delete_objects([gone.key])
    storage.put_object(damaged.key, b"{}")
    # What the remote_segments_in_bucket check does after a copy pass.
    found = inspect_finished_segments(storage, tip, finished)
    assert found.damaged == []  # the segments' data is whole: nothing to re-copy
    assert [(md.segment_id, "manifest" in problem) for md, problem in found.manifests_lost] == [
        (finished[0].segment_id, True), (finished[1].segment_id, True)]
    for md, problem in found.manifests_lost:
        assert metadata_store.forget_segment_manifest(md.segment_id, problem)

    result = copy_partition(LogDir(log_dir).partitions()[0], LogDir(log_dir), metadata_store, storage)
    assert result.manifests_backfilled == 2
    again = metadata_store.list_remote_log_segments(tip, states={FINISHED})
    assert inspect_finished_segments(storage, tip, again).manifests_lost == []
    for md in again[:2]:
        manifest = recorded_manifest(md.custom_metadata)
        assert decode_manifest(storage.fetch_object(manifest.key), where=manifest.key).metadata.segment_id == md.segment_id


# --- recover -------------------------------------------------------------------------------------


def test_after_the_database_is_dropped_recover_gives_the_same_status_offsets_and_fetches(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    rows = _rows(store, log_dir)
    store.close()
    before = _answers(env, log_dir)
    tier_before = _listing(storage)

    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    assert json.loads(kts(env, "status", "--json").stdout) != before["status"]  # the store really was lost
    recovered = json.loads(kts(env, "recover", "--json").stdout)

    finished = sum(row["remote_segments"] for row in before["status"])
    assert recovered["segments_recovered"] == recovered["manifests"] == finished > 4
    assert recovered["topics"] == recovered["topics_created"] == 2 and recovered["partitions"] == 4
    assert recovered["objects_without_manifest"] == 0 and recovered["incomplete_segments"] == []
    assert recovered["index_partitions"] == 4 and recovered["index_errors"] == []
    assert _answers(env, log_dir) == before
    assert {k: v for k, v in _listing(storage).items() if k in tier_before} == tier_before  # nothing replaced or deleted

    store = _store(pg_url)
    try:
        assert _rows(store, log_dir) == rows  # the store as it was: segments, epochs, objects, offsets, configs
        # segments, topics, partitions, first observed offsets, leader-epoch lineages
        assert len(store.events()) == finished + 2 + 4 + 4 + 4
        events = len(store.events())
        # A rerun is a no-op: nothing recorded, nothing shipped, the same answers.
        again = json.loads(kts(env, "recover", "--json").stdout)
        assert (again["segments_recovered"], again["segments_already_present"], again["topics_created"]) == (0, finished, 0)
        assert again["index_files_written"] == again["index_files_published"] == again["index_segments_read"] == 0
        assert len(store.events()) == events
        # The pipeline carries on from the recovered store: nothing copied again, no manifest rewritten.
        again = copy_each_partition(LogDir(log_dir), store, storage)
        assert [(r.copied, r.manifests_backfilled, r.stopped) for r in again] == [([], 0, None)] * 4
    finally:
        store.close()
    assert _answers(env, log_dir) == before
    assert _listing(storage) == {**tier_before, **{k: v for k, v in _listing(storage).items() if "/remote-log-index/" in k}}


def test_a_delete_records_after_the_last_copy_comes_back_too(log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    """DeleteRecords moves the log start offset inside a remote segment after it was copied: the
    tier records it beside the partition's segments, so recover does not bring the records back."""
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    store.close()
    kts(env, "delete-records", "orders", "1", "--before", "5")
    before = _answers(env, log_dir)
    assert before["offsets orders-1 --earliest"]["offset"] == 5
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    assert json.loads(kts(env, "recover", "--json").stdout)["log_start_offsets_set"] == 1
    assert _answers(env, log_dir) == before
    # Topic deletion takes the record with the rest of the partition's remote data.
    kts(env, "topic", "delete", "orders")
    assert not [k for k in _listing(storage) if k.endswith("/log-start-offset")]


def test_a_log_start_offset_retention_moved_past_every_remote_segment_comes_back(log_dir, pg_url, pg_admin_url, pg_template,
                                                                                 tmp_path, tier):
    """Remote retention deleted all of orders-1's remote segments (the broker still holds them
    locally, its own retention slower): the tier keeps the moved log start offset, so after the
    store is lost, recover restores it and the deleted offsets do not read again (issue 30 item 6)."""
    from .partition_steps import plan_and_expire
    from kts_resources.tiering.quotas import ManualClock
    from kts_resources.tiering.tiers import locate_partitions

    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    try:
        _copy_and_age(log_dir, store, storage)
        tip = next(t for t in _tips(log_dir) if str(t.topic_partition) == "orders-1")
        finished = store.list_remote_log_segments(tip, states={FINISHED})
        store.set_topic_config("orders", "local.retention.ms", "-2")
        store.set_topic_config("orders", "retention.ms", "1")
        located, _ = locate_partitions([log_dir], ["orders-1"])
        result = plan_and_expire(located["orders-1"], tip, store, storage,
                                 clock=ManualClock(max(md.max_timestamp_ms for md in finished) + 10_000))
        assert len(result.remote_deleted) == len(finished)
        moved = result.log_start_offset
        assert moved == max(md.end_offset for md in finished) + 1
        store.set_topic_config("orders", "retention.ms", "-1")  # nothing more expires while the answers are asked
    finally:
        store.close()
    before = kts(env, "offsets", "orders", "1", "--earliest", "--json")
    assert json.loads(before.stdout)["offset"] == moved
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    out = json.loads(kts(env, "recover", "--json").stdout)

    assert out["log_start_offsets_set"] >= 1
    assert kts(env, "offsets", "orders", "1", "--earliest", "--json").stdout == before.stdout
    below = kts(env, "fetch", "orders", "1", "--offset", "0", check=False)
    assert below.returncode != 0 and "out of range" in below.stderr.lower(), below.stderr


def test_recover_on_a_new_machine_takes_the_remote_log_index_from_the_tier(log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    """The pipeline shipped the index: a node with an empty KTS_HOME rebuilds it without reading a segment."""
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    home = tmp_path / "home"
    for tip in _tips(log_dir):
        index_tier.update_partition_index(store, storage, index_cache.cache_directory(home, tip), tip,
                                          lambda md: index_cache.read_segment_entries(storage, md))
    store.close()
    before = _answers(env, log_dir)
    shipped = {k: storage.fetch_object(k) for k in _listing(storage) if "/remote-log-index/" in k}
    assert shipped

    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    shutil.rmtree(home)
    recovered = json.loads(kts(env, "recover", "--json").stdout)
    assert recovered["index_partitions"] == 4 and recovered["index_segments_read"] == 0
    assert recovered["index_files_published"] == 0
    for tip in _tips(log_dir):
        directory = index_cache.cache_directory(home, tip)
        for key, data in shipped.items():
            parsed = storage.keys.parse_remote_index_key(key)
            if parsed.topic_id_partition == tip and not parsed.pointer:
                assert (directory / parsed.file_name).read_bytes() == data  # the same files as shipped
    assert _answers(env, log_dir) == before


def test_a_sigkill_half_way_through_recover_then_a_rerun_converges(log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    store.close()
    before = _answers(env, log_dir)
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    # Killed right after the second partition's segments were committed.
    killed = subprocess.run([sys.executable, "-c", _KILLED_RECOVER], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    store = _store(pg_url)
    try:
        part_done = sum(len(store.list_remote_log_segments(tip, states={FINISHED})) for tip in store.partitions())
        assert part_done > 0 and all(md.state is FINISHED for tip in store.partitions() for md in store.list_remote_log_segments(tip))
    finally:
        store.close()
    rerun = json.loads(kts(env, "recover", "--json").stdout)
    assert rerun["segments_already_present"] == part_done and rerun["segments_recovered"] > 0
    assert _answers(env, log_dir) == before


_KILLED_RECOVER = """
import os, signal
from kts_resources import settings
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.maintenance.recovery import recover
from kts_resources.remote_storage.factory import remote_storage_from_uri

store = RemoteLogMetadataStore.from_env()
original, calls = store.recover_remote_log_segments, []
def recover_then_die(tip, segments):
    n = original(tip, segments)
    calls.append(n)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return n
store.recover_remote_log_segments = recover_then_die
recover(store, remote_storage_from_uri(), settings.kts_home())
"""


def _lose_manifest_of_a_middle_segment(log_dir: Path, pg_url: str, storage):
    """Copied, the first two segments of orders-0 gone locally, then the second one's manifest
    removed from the tier: (its store row, fetches of its first and last offset as they were)."""
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    tip = next(t for t in _tips(log_dir) if str(t.topic_partition) == "orders-0")
    victim = store.list_remote_log_segments(tip, states={FINISHED})[1]
    store.close()
    second = sorted((log_dir / "orders-0").glob("*.log"))[0]
    assert int(second.stem) == victim.start_offset
    for f in (log_dir / "orders-0").glob(second.stem + ".*"):
        f.unlink()
    storage.delete_objects([recorded_manifest(victim.custom_metadata).key])
    return tip, victim


def _fetches(env, offsets) -> list:
    return kts_session(env, [["fetch", "orders", "0", "--offset", str(o), "--max-bytes", "8192", "--json"] for o in offsets])


def test_a_segment_whose_manifest_is_lost_is_rebuilt_from_its_object(log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    tip, victim = _lose_manifest_of_a_middle_segment(log_dir, pg_url, storage)
    fetched = _fetches(env, (victim.start_offset, victim.end_offset))
    assert [a["records"][0]["offset"] for a in fetched] == [victim.start_offset, victim.end_offset]
    objects = {suffix: obj.key for suffix, obj in stored_objects(victim.custom_metadata).items()}
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    result = kts(env, "recover", "--json")
    out = json.loads(result.stdout)
    assert out["segments_rebuilt"] == 1 and out["objects_without_manifest"] == 0 and out["skipped"] == []
    [line] = [line for line in result.stderr.splitlines() if "rebuilt from" in line]
    assert storage.location(objects["log"]) in line and f"{victim.start_offset}..{victim.end_offset}" in line
    store = _store(pg_url)
    try:
        md = store.segment(victim.segment_id)
        assert md is not None and md.state is FINISHED
        assert (md.start_offset, md.end_offset, dict(md.segment_leader_epochs), md.segment_size_in_bytes, md.max_timestamp_ms) == (
            victim.start_offset, victim.end_offset, dict(victim.segment_leader_epochs), victim.segment_size_in_bytes,
            victim.max_timestamp_ms)
        assert stored_objects(md.custom_metadata) == stored_objects(victim.custom_metadata)
        # The tier describes the segment again: its manifest is back, and recorded.
        manifest = recorded_manifest(md.custom_metadata)
        assert manifest.key == recorded_manifest(victim.custom_metadata).key and manifest.key in _listing(storage)
        assert decode_manifest(storage.fetch_object(manifest.key), where=manifest.key).metadata.end_offset == victim.end_offset
        # The next copy pass finds nothing lost and nothing to copy.
        again = {str(r.topic_partition): r for r in copy_each_partition(LogDir(log_dir), store, storage)}
        assert again["orders-0"].lost == [] and store.lost_ranges(tip) == []
        assert [r.copied for r in again.values()] == [[]] * 4
    finally:
        store.close()
    assert _fetches(env, (victim.start_offset, victim.end_offset)) == fetched
    assert json.loads(kts(env, "recover", "--json").stdout)["segments_rebuilt"] == 0  # a rerun: already in the store


def test_a_leftover_without_a_manifest_whose_offsets_a_finished_segment_holds_is_reported_not_recovered(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    copy_each_partition(LogDir(log_dir), store, storage)
    victim = store.list_remote_log_segments(_tips(log_dir)[0], states={FINISHED})[-1]
    store.close()
    # A crashed copy of the same segment, re-copied later: its objects, no manifest.
    from kts_resources.remote_log import RemoteLogSegmentId

    crashed = RemoteLogSegmentId(victim.topic_id_partition, uuid.uuid4())
    leftovers = {storage.keys.segment_key(crashed, victim.start_offset, suffix): storage.fetch_object(obj.key)
                 for suffix, obj in stored_objects(victim.custom_metadata).items()}
    for key, data in leftovers.items():
        storage.put_object(key, data)
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    result = kts(env, "recover", "--json")
    out = json.loads(result.stdout)
    assert out["objects_without_manifest"] == len(leftovers) and out["segments_without_manifest"] == 1
    assert out["segments_rebuilt"] == 0 and out["skipped"] == []
    assert "leftovers of copies that never finished" in result.stderr
    store = _store(pg_url)
    try:
        assert store.segment(crashed) is None and store.segment(victim.segment_id) is not None
    finally:
        store.close()
    assert set(leftovers) <= set(_listing(storage))  # never deleted


def test_a_segment_without_a_manifest_that_fails_its_crc_is_reported_with_its_byte_and_kept(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    from kts_resources.kafka.records import scan_batches

    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    tip, victim = _lose_manifest_of_a_middle_segment(log_dir, pg_url, storage)
    log = stored_objects(victim.custom_metadata)["log"]
    data = bytearray(storage.fetch_object(log.key))
    third = scan_batches(bytes(data)).batches[2].position
    data[third + 70] ^= 0x10  # inside the third batch's records
    storage.put_object(log.key, bytes(data))
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    result = kts(env, "recover", "--json", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    out = json.loads(result.stdout)
    assert out["segments_rebuilt"] == 0
    [line] = out["skipped"]
    assert storage.location(log.key) in line and f"byte {third}" in line and "CRC" in line
    store = _store(pg_url)
    try:
        assert store.segment(victim.segment_id) is None
    finally:
        store.close()
    assert set(k for k in (o.key for o in stored_objects(victim.custom_metadata).values())) <= set(_listing(storage))


def test_a_damaged_manifest_is_one_error_line_naming_the_object_and_nothing_is_recovered(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    copy_each_partition(LogDir(log_dir), store, storage)
    victim = store.list_remote_log_segments(_tips(log_dir)[1], states={FINISHED})[0]
    store.close()
    key = storage.segment_object_keys(victim)[MANIFEST_SUFFIX]
    data = bytearray(storage.fetch_object(key))
    data[len(data) // 2] ^= 0x5A
    storage.put_object(key, bytes(data))
    _drop_and_recreate(pg_url, pg_admin_url, pg_template)

    result = kts(env, "recover", check=False)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert storage.location(key) in lines[0] and "damaged manifest" in lines[0] and "nothing was recovered" in lines[0]
    store = _store(pg_url)
    try:
        assert store.topics() == {} and store.partitions() == []
    finally:
        store.close()


def test_a_recreated_topic_comes_back_as_it_was_the_old_incarnation_marked_for_deletion(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    env = _env(pg_url, tmp_path, log_dir, {"KTS_REMOTE_URI": (tmp_path / "remote").as_uri()})
    store = _store(pg_url)
    copy_each_partition(LogDir(log_dir), store, storage)
    old = _tips(log_dir)
    # Deleted and created again under the same names: new topic ids, offsets from 0 again.
    shutil.rmtree(log_dir)
    simulate(log_dir, SimulationConfig(seed=14, topics=("orders", "page.views"), partitions=2, total_bytes=160 * 1024,
                                       segment_bytes=24 * 1024))
    copy_each_partition(LogDir(log_dir), store, storage)
    new = _tips(log_dir)
    every = lambda tips: {str(tip): (_recoverable(store.partition_state(tip)), [(md.segment_id, md.state) for md in store.list_remote_log_segments(tip)])
                          for tip in tips}
    rows = every(old + new)
    topics = store.topics()
    store.close()

    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    out = json.loads(kts(env, "recover", "--json").stdout)
    assert out["topics"] == 4 and out["skipped"] == [] and out["partitions"] == sum(1 for _s, segs in rows.values() if segs) > 4
    store = _store(pg_url)
    try:
        assert store.topics() == topics  # the newest incarnations are current
        assert every(old + new) == rows  # the old ones' partitions DELETE_PARTITION_MARKED, their segments kept
        again = json.loads(kts(env, "recover", "--json").stdout)
        assert (again["segments_recovered"], again["skipped"], again["segments_already_present"]) == (0, [], out["manifests"])
    finally:
        store.close()


# --- the store's side: segments recorded from manifests ------------------------------------------

# Upload histories (epochs, start, end), in the order the segments finished: consecutive segments,
# re-uploads after unclean elections, duplicates, late short uploads, several epochs per segment.
HISTORIES = {
    "consecutive": [({0: 0}, 0, 99), ({0: 100}, 100, 199), ({0: 200, 1: 250}, 200, 299), ({1: 300}, 300, 399)],
    "reupload covers earlier": [({0: 10}, 10, 100), ({0: 5}, 5, 150)],
    "reupload covers several": [({0: 10}, 10, 100), ({0: 5}, 5, 150), ({0: 148}, 148, 155), ({0: 4}, 4, 200)],
    "duplicate": [({0: 10}, 10, 100), ({0: 10}, 10, 100)],
    "stale shorter upload": [({0: 0}, 0, 100), ({0: 101}, 101, 300), ({0: 50}, 50, 150)],
    "new leader mid-segment": [({0: 0}, 0, 99), ({0: 100, 2: 150}, 100, 199), ({2: 150}, 150, 249), ({2: 250, 3: 260}, 250, 300)],
}


@pytest.mark.parametrize("history", HISTORIES, ids=list(HISTORIES))
@pytest.mark.parametrize("batch", [1, 100])
def test_segments_recorded_from_manifests_answer_lookups_as_the_copies_did(metadata_store, history, batch):
    from kts_resources.kafka.partition import TopicPartition
    from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata

    def tip_of(name):
        topic_id = uuid.uuid4()
        metadata_store.ensure_topic(name, topic_id)
        return TopicIdPartition(topic_id, TopicPartition(name, 0))

    def segment(tip, epochs, start, end, i):
        return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tip), start, end, max_timestamp_ms=i, broker_id=0,
                                        event_timestamp_ms=1_000 + i, segment_size_in_bytes=100, segment_leader_epochs=epochs)

    copied, recovered = tip_of("copied"), tip_of("recovered")
    ids: dict[uuid.UUID, int] = {}
    finished = []
    for i, (epochs, start, end) in enumerate(HISTORIES[history]):
        md = segment(copied, epochs, start, end, i)
        metadata_store.add_remote_log_segment_metadata(md)
        metadata_store.update_remote_log_segment_metadata(md.segment_id, FINISHED, 2_000 + i)
        ids[md.segment_id.id] = i
        twin = replace(segment(recovered, epochs, start, end, i), state=FINISHED)
        ids[twin.segment_id.id] = i
        finished.append(twin)
    for k in range(0, len(finished), batch):
        assert metadata_store.recover_remote_log_segments(recovered, finished[k:k + batch]) == len(finished[k:k + batch])
    assert metadata_store.recover_remote_log_segments(recovered, finished) == 0  # a rerun records nothing

    epochs = {e for h in HISTORIES[history] for e in h[0]}
    for epoch in sorted(epochs):
        assert metadata_store.highest_offset_for_epoch(recovered, epoch) == metadata_store.highest_offset_for_epoch(copied, epoch)
        for offset in range(0, 402):
            a = metadata_store.remote_log_segment_metadata(copied, epoch, offset)
            b = metadata_store.remote_log_segment_metadata(recovered, epoch, offset)
            assert (a and ids[a.segment_id.id]) == (b and ids[b.segment_id.id]), (epoch, offset)
    assert metadata_store.partition_state(recovered).highest_copied_offset == metadata_store.partition_state(copied).highest_copied_offset


def test_delete_records_with_the_tier_refusing_its_record_says_the_store_moved(log_dir, pg_url, tmp_path):
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    blocked = tmp_path / "not-a-directory"
    blocked.write_bytes(b"")
    env = _env(pg_url, tmp_path, log_dir, {"KTS_REMOTE_URI": blocked.as_uri()})
    result = kts(env, "delete-records", "orders", "1", "--before", "5", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "the log start offset moved in the metadata store" in line and "run the same kts delete-records again" in line
    tip = next(t for t in _tips(log_dir) if str(t.topic_partition) == "orders-1")
    try:
        assert store.partition_state(tip).log_start_offset == 5
    finally:
        store.close()


def test_a_lost_range_the_recovered_segments_hold_is_closed_by_recover(log_dir, pg_url, tmp_path, tier):
    """A store that lost a segment's row (restored from an old backup) makes the next pass see a
    hole where the broker's retention took the local copy: a lost range. Recover finds the segment
    in the tier, and the alarm it answers is closed, acknowledged by kts recover, named in a line."""
    from kts_resources.tiering.lost_ranges import detect_lost_ranges
    from kts_resources.maintenance.recovery import recover

    storage, _tier_env = tier
    store = _store(pg_url)
    try:
        copy_each_partition(LogDir(log_dir), store, storage)
        tip = next(t for t in _tips(log_dir) if str(t.topic_partition) == "orders-0")
        finished = sorted(store.list_remote_log_segments(tip, states={FINISHED}), key=lambda md: md.start_offset)
        victim = finished[1]
        with store.engine.begin() as conn:
            for table in ("remote_segment_leader_epochs", "remote_segments"):
                conn.execute(sa.text(f"DELETE FROM {table} WHERE segment_id = :id"), {"id": victim.segment_id.id})
        partition = next(p for p in LogDir(log_dir).partitions() if str(p.topic_partition) == "orders-0")
        for segment in partition.segments():
            if segment.base_offset <= victim.start_offset:  # the broker's retention
                for path in log_dir.joinpath("orders-0").glob(f"{segment.base_offset:020d}.*"):
                    path.unlink()
        detect_lost_ranges(store, tip, partition.segments(), how_found="copy pass")
        assert [(r.start_offset, r.end_offset) for r in store.lost_ranges(tip)] == [(victim.start_offset, victim.end_offset)]

        report = recover(store, storage, None)

        assert report.segments_recovered == 1 and store.lost_ranges(tip) == []
        [acknowledged] = store.lost_ranges(tip, include_acknowledged=True)
        assert acknowledged.acknowledged_by == "kts recover"
        assert report.lost_ranges_closed == [f"orders-0: lost range {victim.start_offset}..{victim.end_offset} closed: "
                                             "its offsets are in the remote tier (segments recovered into the store)"]
        assert recover(store, storage, None).lost_ranges_closed == []  # once
    finally:
        store.close()


def test_recover_reads_the_flat_index_layout_of_earlier_versions_and_publishes_it_as_versioned_sets(
        log_dir, pg_url, pg_admin_url, pg_template, tmp_path, tier):
    """A tier written by an earlier kts: index files straight under remote-log-index/, no pointer.
    Recover on a new machine takes every segment's entries from them (no segment read) and publishes
    the same bytes as versioned file sets named by a pointer; the flat files stay (the scrub removes
    them after its grace period)."""
    storage, tier_env = tier
    env = _env(pg_url, tmp_path, log_dir, tier_env)
    store = _store(pg_url)
    _copy_and_age(log_dir, store, storage)
    home = tmp_path / "home"
    flat: dict[str, bytes] = {}
    for tip in _tips(log_dir):
        directory = index_cache.cache_directory(home, tip)
        finished = store.list_remote_log_segments(tip, states={FINISHED})
        built = index_cache.build_partition_index(directory, finished, lambda md: index_cache.read_segment_entries(storage, md))
        for name in built.written:  # as earlier versions shipped them
            storage.put_object(storage.keys.remote_index_key(tip, name), directory / name)
            flat[storage.keys.remote_index_key(tip, name)] = (directory / name).read_bytes()
    store.close()
    before = _answers(env, log_dir)

    _drop_and_recreate(pg_url, pg_admin_url, pg_template)
    shutil.rmtree(home)
    recovered = json.loads(kts(env, "recover", "--json").stdout)
    assert recovered["index_partitions"] == 4 and recovered["index_segments_read"] == 0 and recovered["index_errors"] == []
    assert recovered["unrecognised_objects"] == 0
    for tip in _tips(log_dir):
        pointer = index_tier.read_pointer(storage, tip)
        assert pointer is not None and pointer.generation == 1
        for ref in pointer.file_sets:
            for kind in ("remoteLogIndex", "remoteOffsetIndex", "remoteTimeIndex"):
                name = f"{ref.base_offset:020d}.{kind}"
                assert storage.fetch_object(storage.keys.remote_index_key(tip, name, ref.version)) == flat[storage.keys.remote_index_key(tip, name)]
    assert {k: storage.fetch_object(k) for k in flat} == flat  # nothing replaced or deleted
    assert _answers(env, log_dir) == before
