"""Object keys of the remote tier: the layout, parsing keys back, and that no input — a hostile topic
name, a prefix with ``..`` — can produce a key outside the prefix."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kts_resources.kafka.partition import TopicPartition
from kts_resources.remote_log import IndexType, RemoteLogSegmentId, TopicIdPartition
from kts_resources.remote_storage.keys import (
    MAX_TOPIC_IN_KEY,
    SEGMENT_SUFFIXES,
    ObjectKeys,
    check_object_key,
    normalise_prefix,
    suffix_for_index,
)

TOPIC_ID = uuid.UUID("31e27a14-74df-458c-baee-3cf065d7aa49")  # MeJ6FHTfRYy67jzwZdeqSQ as Kafka prints it
SEGMENT_UUID = uuid.UUID("b6a8a629-e670-4ad3-843b-04734f72f9a1")  # tqimKeZwStOEOwRzT3L5oQ


def segment_id(topic: str = "orders", partition: int = 7, topic_id: uuid.UUID = TOPIC_ID) -> RemoteLogSegmentId:
    return RemoteLogSegmentId(TopicIdPartition(topic_id, TopicPartition(topic, partition)), SEGMENT_UUID)


def assert_safe(key: str, keys: ObjectKeys) -> None:
    assert key.startswith(keys.root)
    assert check_object_key(key) == key
    assert not any(part in ("", ".", "..") for part in key.split("/"))


def test_layout_is_prefix_topic_and_id_partition_padded_offset_and_segment_id():
    key = ObjectKeys("kafka/tiered").segment_key(segment_id(), 1234, "log")
    assert key == "kafka/tiered/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"


def test_every_index_type_has_its_own_suffix():
    assert [suffix_for_index(t) for t in IndexType] == ["index", "timeindex", "txnindex", "snapshot", "leader-epoch-checkpoint"]
    assert SEGMENT_SUFFIXES[0] == "log" and len(set(SEGMENT_SUFFIXES)) == 6


def test_without_a_prefix_keys_start_at_the_topic():
    assert ObjectKeys("").segment_key(segment_id(), 0, "index").startswith("orders-")


@pytest.mark.parametrize("prefix, expected", [("/a/b/", "a/b"), ("a//b", "a/b"), ("./a/./b", "a/b"), ("", ""), ("/", "")])
def test_prefix_is_normalised(prefix, expected):
    assert normalise_prefix(prefix) == expected


@pytest.mark.parametrize("prefix", ["..", "a/../b", "a/..", "../x", "a\\b", "a\x00b", "a\nb"])
def test_prefix_that_could_climb_out_is_rejected(prefix):
    with pytest.raises(ValueError):
        ObjectKeys(prefix)


@pytest.mark.parametrize("topic", ["", ".", "..", "../x", "a/b", "/etc", "a\\b", "x" * 250, "café", "a b", "a\x00"])
def test_hostile_or_illegal_topic_names_are_rejected(topic):
    with pytest.raises(ValueError):
        ObjectKeys("p").segment_key(segment_id(topic), 0, "log")


@pytest.mark.parametrize("partition", [-1, 2**31, True, "1"])
def test_partition_must_be_an_int32(partition):
    with pytest.raises(ValueError):
        ObjectKeys().segment_key(segment_id(partition=partition), 0, "log")


@pytest.mark.parametrize("offset", [-1, 2**63, 1.0])
def test_start_offset_must_be_an_int64(offset):
    with pytest.raises(ValueError):
        ObjectKeys().segment_key(segment_id(), offset, "log")


def test_unknown_suffix_is_rejected():
    with pytest.raises(ValueError):
        ObjectKeys().segment_key(segment_id(), 0, "../log")


@pytest.mark.parametrize("topic", ["a", "a-b", "a.b-c_d", "..a", "a--", "-", "x" * 249])
def test_parse_gives_back_the_pieces_even_for_topics_with_dashes(topic):
    keys = ObjectKeys("p/q")
    sid = segment_id(topic, 2**31 - 1)
    for suffix in SEGMENT_SUFFIXES:
        parsed = keys.parse(keys.segment_key(sid, 2**63 - 1, suffix))
        assert parsed is not None
        assert (parsed.topic, parsed.partition, parsed.start_offset, parsed.suffix) == (topic[:MAX_TOPIC_IN_KEY], 2**31 - 1, 2**63 - 1, suffix)
        assert (parsed.topic_id, parsed.segment_id) == (sid.topic_id_partition.topic_id, sid.id)
        if len(topic) <= MAX_TOPIC_IN_KEY:
            assert parsed.remote_log_segment_id == sid


@pytest.mark.parametrize(
    "key",
    [
        "other/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log",  # other prefix
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/07/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log",  # 07
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/1234-tqimKeZwStOEOwRzT3L5oQ.log",  # offset not padded
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.exe",  # suffix
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oR.log",  # not canonical
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/2147483648/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log",
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/99999999999999999999-tqimKeZwStOEOwRzT3L5oQ.log",  # > int64
        "p/orders-MeJ6FHTfRYy67jzwZdeqSQ/7/.00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log.0011.kts-tmp",
        "p/..-MeJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log",
        "p/remote-log-index/orders-0.idx",
    ],
)
def test_parse_rejects_keys_kts_did_not_write(key):
    assert ObjectKeys("p").parse(key) is None


def test_partition_prefix_covers_exactly_the_partitions_objects():
    keys = ObjectKeys("p")
    sid = segment_id()
    prefix = keys.partition_prefix(sid.topic_id_partition)
    assert keys.segment_key(sid, 5, "log").startswith(prefix)
    assert not keys.segment_key(segment_id(partition=70), 5, "log").startswith(prefix)
    assert prefix.endswith("/7/")


@pytest.mark.parametrize("key", ["", "/a", "a//b", "a/./b", "a/../b", "..", "a/", "a\\b", "a\x7fb", "k" * 1025])
def test_check_object_key_rejects_unsafe_keys(key):
    with pytest.raises(ValueError):
        check_object_key(key)


@settings(max_examples=400, deadline=None)
@given(topic=st.text(max_size=260), prefix=st.text(max_size=40), partition=st.integers(-5, 2**32), offset=st.integers(-5, 2**64))
def test_no_topic_prefix_or_number_builds_a_key_outside_the_prefix(topic, prefix, partition, offset):
    try:
        keys = ObjectKeys(prefix)
        key = keys.segment_key(segment_id(topic, partition), offset, "log")
    except ValueError:
        return
    assert_safe(key, keys)
    parsed = keys.parse(key)
    assert parsed is not None and (parsed.topic, parsed.partition, parsed.start_offset) == (topic[:MAX_TOPIC_IN_KEY], partition, offset)


@settings(max_examples=200, deadline=None)
@given(topic=st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True), topic_id=st.uuids(), segment=st.uuids())
def test_every_legal_topic_gets_a_key_that_parses_back(topic, topic_id, segment):
    keys = ObjectKeys("kts")
    sid = RemoteLogSegmentId(TopicIdPartition(topic_id, TopicPartition(topic, 0)), segment)
    if topic in (".", ".."):
        with pytest.raises(ValueError):
            keys.segment_key(sid, 0, "log")
        return
    key = keys.segment_key(sid, 0, "timeindex")
    assert_safe(key, keys)
    parsed = keys.parse(key)
    assert parsed is not None and parsed.remote_log_segment_id == sid and parsed.suffix == "timeindex"


@settings(max_examples=200, deadline=None)
@given(key=st.text(max_size=120))
def test_parse_never_fails_on_arbitrary_text(key):
    parsed = ObjectKeys("p").parse(key)
    if parsed is not None:
        assert ObjectKeys("p").segment_key(parsed.remote_log_segment_id, parsed.start_offset, parsed.suffix) == key


def test_the_longest_legal_topic_keeps_every_key_component_within_a_file_name():
    """A file-system tier stores each key component as a directory or file name (255 bytes at most):
    a 249-character topic's directory keeps the topic id whole and cuts the name."""
    topic = "t" * 249
    key = ObjectKeys("p").segment_key(segment_id(topic, 0), 0, "log")
    assert all(len(part.encode()) <= 255 for part in key.split("/"))
    parsed = ObjectKeys("p").parse(key)
    assert parsed is not None and parsed.topic == topic[:MAX_TOPIC_IN_KEY]
