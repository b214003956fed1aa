"""Consumer groups' committed offsets outlive the metadata store: `kts serve` mirrors each group's
offsets into the remote tier after its commits (serving/offsets_mirror.py), and `kts recover`
restores them with the segments, each where the store has no commit of its own."""

from __future__ import annotations

import asyncio
import json

import pytest

from kts_resources.maintenance.recovery import recover
from kts_resources.metadata import database
from kts_resources.metadata.group_offsets import CommittedOffset, GroupOffsets
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.remote_storage.manifest import ManifestError, decode_group_offsets, encode_group_offsets
from kts_resources.serving.offsets_mirror import OffsetsMirror

from .fixtures_postgres import fresh_database
from .test_group_apis import GROUP, TOPIC, one_members_life


@pytest.fixture
def tier(tmp_path):
    return remote_storage_from_uri((tmp_path / "remote").as_uri())


def test_a_group_record_holds_every_partitions_offset_and_a_flipped_byte_is_one_error_naming_it():
    offsets = [("orders", 1, 7, -1, None), ("orders", 0, 42, 4, "m"), ("page.views", 3, 0, 2, "é")]
    data = encode_group_offsets("auditors ✓", offsets)
    assert decode_group_offsets(data, where="x") == ("auditors ✓", sorted(offsets))
    damaged = data.replace(b'"orders",0,42', b'"orders",0,43')
    with pytest.raises(ManifestError, match=r"^s3://b/consumer-groups/ab: damaged consumer group offsets record: its CRC-32C"):
        decode_group_offsets(damaged, where="s3://b/consumer-groups/ab")
    with pytest.raises(ManifestError, match="a partition is listed twice"):
        encode_group_offsets("g", [("orders", 0, 1, -1, None), ("orders", 0, 2, -1, None)])


def test_a_commit_through_the_group_apis_reaches_the_tier_and_recover_restores_it_into_a_new_store(
        pg_url, pg_admin_url, pg_template, tier):
    offsets = GroupOffsets(database.create_engine(pg_url))
    mirror = OffsetsMirror(offsets, tier)
    asyncio.run(one_members_life(offsets, mirror=mirror))  # commits 42, then (the member gone) 50
    assert mirror.flush(10) and mirror.failed == 0

    [key] = [o.key for o in tier.list_objects("consumer-groups/")]
    assert key == tier.keys.group_offsets_key(GROUP)
    assert decode_group_offsets(tier.fetch_object(key), where=key) == (GROUP, [(TOPIC, 0, 50, 4, "m")])

    with fresh_database(pg_admin_url, pg_template) as lost_and_rebuilt:  # the store is lost: an empty one
        store = RemoteLogMetadataStore(database.create_engine(lost_and_rebuilt))
        assert GroupOffsets(store.engine).all_groups() == {}
        report = recover(store, tier, None)
        assert (report.consumer_groups, report.group_offsets_restored, report.clean) == (1, 1, True)
        assert GroupOffsets(store.engine).all_groups() == {GROUP: [CommittedOffset(TOPIC, 0, 50, 4, "m")]}
        reported = json.loads(json.dumps(report.to_json()))  # what `kts recover --json` prints
        assert (reported["consumer_groups"], reported["group_offsets_restored"]) == (1, 1)
        store.engine.dispose()


def test_recover_keeps_a_commit_the_store_already_has_and_adds_only_what_it_lacks(metadata_store, tier):
    offsets = GroupOffsets(metadata_store.engine)
    mirror = OffsetsMirror(offsets, tier)
    offsets.commit("g", [CommittedOffset("orders", 0, 10), CommittedOffset("orders", 1, 20)])
    mirror.committed("g")
    assert mirror.flush(10)
    with metadata_store.engine.begin() as conn:  # the store lost one partition's commit, and moved the other on
        conn.exec_driver_sql("DELETE FROM group_offsets WHERE partition = 1")
    offsets.commit("g", [CommittedOffset("orders", 0, 15)])

    report = recover(metadata_store, tier, None)
    assert report.group_offsets_restored == 1
    assert offsets.committed("g") == {("orders", 0): CommittedOffset("orders", 0, 15),
                                      ("orders", 1): CommittedOffset("orders", 1, 20)}
    again = recover(metadata_store, tier, None)
    assert (again.consumer_groups, again.group_offsets_restored) == (1, 0)  # a rerun adds nothing


def test_many_commits_of_one_group_leave_its_newest_offsets_in_the_tier(metadata_store, tier):
    offsets = GroupOffsets(metadata_store.engine)
    mirror = OffsetsMirror(offsets, tier)
    for offset in range(200):
        offsets.commit("busy", [CommittedOffset("orders", offset % 4, offset)])
        mirror.committed("busy")
    assert mirror.flush(10) and mirror.failed == 0
    _group, recorded = decode_group_offsets(tier.fetch_object(tier.keys.group_offsets_key("busy")), where="busy")
    assert recorded == [("orders", p, 196 + p, -1, None) for p in range(4)]


def test_a_damaged_group_record_is_reported_and_the_rest_is_recovered(metadata_store, tier):
    offsets = GroupOffsets(metadata_store.engine)
    mirror = OffsetsMirror(offsets, tier)
    for group in ("a", "b"):
        offsets.commit(group, [CommittedOffset("orders", 0, 5)])
        mirror.committed(group)
    assert mirror.flush(10)
    key = tier.keys.group_offsets_key("a")
    tier.put_object(key, tier.fetch_object(key).replace(b"5", b"6"))
    with metadata_store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM group_offsets")

    report = recover(metadata_store, tier, None)
    assert not report.clean
    [line] = report.skipped
    assert line.startswith(f"{tier.location(key)}: damaged consumer group offsets record") and "not restored" in line
    assert offsets.all_groups() == {"b": [CommittedOffset("orders", 0, 5)]}


def test_the_tier_unreachable_fails_no_commit_and_the_next_commit_writes_the_record(metadata_store, tmp_path):
    offsets = GroupOffsets(metadata_store.engine)
    blocked = tmp_path / "remote"
    blocked.write_text("not a directory")  # every write to this tier fails
    tier = remote_storage_from_uri(blocked.as_uri())
    mirror = OffsetsMirror(offsets, tier)
    offsets.commit("g", [CommittedOffset("orders", 0, 1)])
    mirror.committed("g")
    assert mirror.flush(10) and (mirror.written, mirror.failed) == (0, 1)
    assert offsets.committed("g")[("orders", 0)].offset == 1  # the store has the commit all the same

    blocked.unlink()
    offsets.commit("g", [CommittedOffset("orders", 0, 2)])
    mirror.committed("g")
    assert mirror.flush(10) and mirror.written == 1
    assert decode_group_offsets(tier.fetch_object(tier.keys.group_offsets_key("g")), where="g")[1] == [("orders", 0, 2, -1, None)]
