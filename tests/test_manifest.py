"""A remote segment's manifest (kts_resources.remote_storage.manifest): what it holds, that it reads
back exactly, and that anything but a manifest kts wrote is one ManifestError naming the object."""

from __future__ import annotations

import json
import uuid

import pytest
from crc32c import crc32c

from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import StoredObject, stored_objects
from kts_resources.remote_storage.keys import ObjectKeys
from kts_resources.remote_storage.manifest import ManifestError, SegmentManifest, decode_manifest, encode_manifest

TIP = TopicIdPartition(uuid.UUID("3b5e2c1a-9f0d-4e6b-8a7c-1d2e3f405162"), TopicPartition("orders.v2-eu", 7))
SEGMENT = RemoteLogSegmentId(TIP, uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"))
WHERE = "file:///tier/orders.v2-eu-x/7/00000000000000001000-y.manifest"


def _manifest() -> SegmentManifest:
    keys = ObjectKeys("tiered")
    sizes = {"log": 16384, "index": 80, "timeindex": 120, "snapshot": 52, "leader-epoch-checkpoint": 14}
    objects = {s: StoredObject(keys.segment_key(SEGMENT, 1000, s), n, 0xDEADBEEF - n) for s, n in sizes.items()}
    md = RemoteLogSegmentMetadata(SEGMENT, 1000, 1099, max_timestamp_ms=1_700_000_000_000, broker_id=3,
                                  event_timestamp_ms=1_700_000_000_123, segment_size_in_bytes=16384,
                                  segment_leader_epochs={2: 1000, 5: 1040})
    return SegmentManifest.of(md, objects, topic_configs={"retention.ms": "86400000"}, log_start_offset=900)


def test_a_manifest_reads_back_as_the_finished_segment_with_its_objects_configs_and_log_start():
    manifest = _manifest()
    back = decode_manifest(encode_manifest(manifest), where=WHERE)
    assert back == manifest
    assert back.metadata.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
    assert stored_objects(back.metadata.custom_metadata) == dict(manifest.objects)
    assert back.topic_configs == {"retention.ms": "86400000"} and back.log_start_offset == 900


def test_a_manifest_is_canonical_json_with_a_version_and_kafka_ids():
    data = encode_manifest(_manifest())
    assert data == encode_manifest(_manifest()) and data.endswith(b"\n")
    body = json.loads(data)
    assert body["format"] == "kts-remote-segment-manifest" and body["version"] == 1 and len(body["crc32c"]) == 8
    assert body["topic"] == "orders.v2-eu" and body["partition"] == 7 and len(body["topic_id"]) == 22
    assert body["segment_leader_epochs"] == [[2, 1000], [5, 1040]]
    assert body["objects"]["log"] == {"key": _manifest().objects["log"].key, "size": 16384, "crc32c": f"{0xDEADBEEF - 16384:08x}"}


def _mutated(change) -> bytes:
    """The manifest with ``change`` made and its checksum made to fit (a well-formed lie)."""
    body = json.loads(encode_manifest(_manifest()))
    body.pop("crc32c")
    change(body)
    body["crc32c"] = f"{crc32c(json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode()):08x}"
    return json.dumps(body).encode()


@pytest.mark.parametrize("position", range(0, 700, 7))
def test_any_flipped_byte_is_a_damaged_manifest(position):
    data = bytearray(encode_manifest(_manifest()))
    data[position] ^= 0x04
    with pytest.raises(ManifestError, match="damaged manifest"):
        decode_manifest(bytes(data), where=WHERE)


@pytest.mark.parametrize("data, problem", [
    (b"", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (encode_manifest(_manifest())[:-40], "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (_mutated(lambda b: b.update(version=2)), "version 2"),
    (_mutated(lambda b: b.update(format="other")), "format"),
    (_mutated(lambda b: b.pop("end_offset")), "missing field(s) end_offset"),
    (_mutated(lambda b: b.update(extra=1)), "unknown field(s) extra"),
    (json.dumps({**json.loads(encode_manifest(_manifest())), "end_offset": 1098}).encode(), "CRC-32C"),
    (_mutated(lambda b: b.update(topic="bad/topic")), "topic"),
    (_mutated(lambda b: b.update(topic_id="not-a-uuid")), "topic_id"),
    (_mutated(lambda b: b.update(partition=-1)), "partition"),
    (_mutated(lambda b: b.update(end_offset=999)), "end_offset"),
    (_mutated(lambda b: b.update(start_offset=True)), "start_offset"),
    (_mutated(lambda b: b.update(segment_leader_epochs=[])), "segment_leader_epochs"),
    (_mutated(lambda b: b.update(segment_leader_epochs=[[5, 1000], [2, 1040]])), "do not rise"),
    (_mutated(lambda b: b.update(segment_leader_epochs=[[2, 5000]])), "segment_leader_epochs entry"),
    (_mutated(lambda b: b["objects"].pop("log")), "objects lacks log"),
    (_mutated(lambda b: b["objects"].update(exe={})), "unknown suffix"),
    (_mutated(lambda b: b["objects"]["index"].update(crc32c="XYZ")), "objects.index"),
    (_mutated(lambda b: b["objects"]["index"].update(key="../escape")), "objects.index"),
    (_mutated(lambda b: b["objects"]["log"].update(size=1)), "segment_size_in_bytes says"),
    (_mutated(lambda b: b.update(topic_configs={"retention.ms": 5})), "topic_configs"),
    (encode_manifest(_manifest()).replace(b'"broker_id":3', b'"broker_id":3,"broker_id":4'), "appears twice"),
    (encode_manifest(_manifest()).replace(b'"broker_id":3', b'"broker_id":NaN'), "NaN"),
])
def test_anything_but_a_manifest_kts_wrote_is_one_error_naming_the_object(data, problem):
    with pytest.raises(ManifestError) as caught:
        decode_manifest(data, where=WHERE)
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: damaged manifest: ") and problem in message
    assert "\n" not in message


def test_a_log_start_offset_record_reads_back_and_a_flipped_byte_is_damage():
    from kts_resources.remote_storage.manifest import decode_log_start_offset, encode_log_start_offset

    data = encode_log_start_offset(TIP, 1234)
    assert decode_log_start_offset(data, where=WHERE) == (TIP, 1234)
    for position in range(0, len(data) - 1, 5):
        damaged = bytearray(data)
        damaged[position] ^= 0x04
        with pytest.raises(ManifestError, match="damaged log start offset record"):
            decode_log_start_offset(bytes(damaged), where=WHERE)
    with pytest.raises(ManifestError, match="not a kts-log-start-offset record"):
        decode_log_start_offset(encode_manifest(_manifest()), where=WHERE)


def _pointer():
    from kts_resources.remote_storage.manifest import INDEX_FILE_KINDS, IndexFileSetRef, IndexPointer

    sets = (IndexFileSetRef(0, "000000000003-0a1b2c3d", {k: (100 + i, 0xCAFE0000 + i) for i, k in enumerate(INDEX_FILE_KINDS)}),
            IndexFileSetRef(4211, "000000000007-deadbeef", {k: (7 + i, i) for i, k in enumerate(INDEX_FILE_KINDS)}))
    return IndexPointer(TIP, 7, sets)


def test_a_remote_log_index_pointer_reads_back_and_a_flipped_byte_is_damage():
    from kts_resources.remote_storage.manifest import decode_index_pointer, encode_index_pointer

    data = encode_index_pointer(_pointer())
    assert decode_index_pointer(data, where=WHERE) == _pointer()
    assert json.loads(data)["file_sets"][1]["version"] == "000000000007-deadbeef"
    for position in range(0, len(data) - 1, 3):
        damaged = bytearray(data)
        damaged[position] ^= 0x04
        with pytest.raises(ManifestError, match=f"^{WHERE}: damaged remote log index pointer"):
            decode_index_pointer(bytes(damaged), where=WHERE)
    with pytest.raises(ManifestError, match="not a kts-remote-log-index record"):
        decode_index_pointer(encode_manifest(_manifest()), where=WHERE)


@pytest.mark.parametrize("edit, problem", [
    (lambda b: b["file_sets"].reverse(), "does not follow"),
    (lambda b: b["file_sets"][0].update(version="3-0a1b2c3d"), "not <12-digit generation>-<8 hex digits>"),
    (lambda b: b["file_sets"][0]["files"].pop("remoteTimeIndex"), "files are not"),
    (lambda b: b["file_sets"][0]["files"]["remoteLogIndex"].update(size=-1), "size is -1"),
])
def test_a_pointer_whose_file_sets_do_not_make_an_index_is_damage(edit, problem):
    """Sealed with a matching CRC, but not what a build writes: still one error naming the object."""
    from kts_resources.remote_storage.base import crc32c_hex
    from kts_resources.remote_storage.manifest import decode_index_pointer, encode_index_pointer

    body = json.loads(encode_index_pointer(_pointer()))
    del body["crc32c"]
    edit(body)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["crc32c"] = crc32c_hex(crc32c(canonical))
    with pytest.raises(ManifestError, match=problem):
        decode_index_pointer(json.dumps(body).encode(), where=WHERE)
