"""Topic configs under Kafka's names: defaults, parsing and the validation rules of Kafka's
LogConfig (types and ranges, local retention within total retention, -2 meaning "same as
retention", no tiering for compacted topics, no silent switch-off), and kts's tiering rule
(everything is tiered except internal, compacted and remote.storage.enable=false topics)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kts_resources.metadata.topic_config import (
    CONFIG_KEYS,
    INTERNAL_TOPICS,
    InvalidTopicConfig,
    TopicConfig,
    UnknownTopicConfig,
    tiering_enabled,
)

WEEK_MS = 7 * 24 * 60 * 60 * 1000


def test_defaults_are_kafkas():
    config = TopicConfig()
    assert config.remote_storage_enable is False
    assert config.local_retention_ms == -2
    assert config.local_retention_bytes == -2
    assert config.retention_ms == WEEK_MS
    assert config.retention_bytes == -1
    assert config.remote_log_copy_disable is False
    assert config.remote_log_delete_on_disable is False
    assert config.cleanup_policy == ("delete",)
    assert config.segment_bytes == 1024 * 1024 * 1024
    assert config.get("segment.ms") == WEEK_MS
    assert config.get("max.compaction.lag.ms") == 2**63 - 1
    assert config.overrides == {}


def test_minus_two_local_retention_means_the_total_retention():
    config = TopicConfig({"retention.ms": "3600000", "retention.bytes": "1000"})
    assert config.effective_local_retention_ms == 3600000
    assert config.effective_local_retention_bytes == 1000
    config = config.with_config("local.retention.ms", "60000").with_config("local.retention.bytes", "10")
    assert config.effective_local_retention_ms == 60000
    assert config.effective_local_retention_bytes == 10


def test_values_are_parsed_as_configdef_does():
    config = TopicConfig({"remote.storage.enable": " TRUE ", "retention.ms": " 42 ", "cleanup.policy": "delete , compact"})
    assert config.remote_storage_enable is True
    assert config.retention_ms == 42
    assert config.cleanup_policy == ("delete", "compact")
    assert config.overrides == {"remote.storage.enable": "true", "retention.ms": "42", "cleanup.policy": "delete,compact"}


def test_python_values_are_accepted_and_stored_as_kafka_strings():
    config = TopicConfig({"remote.log.copy.disable": True, "retention.bytes": 1024})
    assert config.overrides == {"remote.log.copy.disable": "true", "retention.bytes": "1024"}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("remote.storage.enable", "yes", "Expected value to be either true or false"),
        ("retention.ms", "7d", "Not a number of type LONG"),
        ("retention.ms", "9223372036854775808", "Not a number of type LONG"),
        ("segment.bytes", "2147483648", "Not a number of type INT"),
        ("segment.bytes", "13", "Value must be at least 14"),
        ("retention.ms", "-2", "Value must be at least -1"),
        ("local.retention.ms", "-3", "Value must be at least -2"),
        ("local.retention.bytes", "-3", "Value must be at least -2"),
        ("cleanup.policy", "delete,", "String must be one of"),
        ("cleanup.policy", "Compact", "String must be one of"),
        ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
        ("message.timestamp.type", "EventTime", "String must be one of"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_key(key, value, message):
    with pytest.raises(InvalidTopicConfig) as raised:
        TopicConfig({key: value})
    assert raised.value.key == key
    assert f"for configuration {key}" in str(raised.value)
    assert message in str(raised.value)


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "1" * 5000, "0" * 5000 + "1" * 20, "9223372036854775808"])
def test_a_number_with_more_digits_than_a_long_is_out_of_range_in_a_short_message(value):
    with pytest.raises(InvalidTopicConfig, match="Not a number of type LONG") as raised:
        TopicConfig({"retention.ms": value})
    assert len(str(raised.value)) < 200 and "\n" not in str(raised.value)


def test_leading_zeros_do_not_make_a_long_too_long():
    assert TopicConfig({"retention.ms": "0" * 5000 + "42"}).retention_ms == 42


def test_an_unknown_config_name_is_refused():
    with pytest.raises(UnknownTopicConfig, match="Unknown topic config name: retention.hours"):
        TopicConfig({"retention.hours": "1"})
    with pytest.raises(UnknownTopicConfig):
        TopicConfig().without_config("retention.hours")


def test_retention_bytes_may_be_any_long():
    assert TopicConfig({"retention.bytes": "-5"}).retention_bytes == -5


@pytest.mark.parametrize("topic", sorted(INTERNAL_TOPICS))
def test_internal_topics_are_never_tiered(topic):
    assert not tiering_enabled(topic)
    assert not tiering_enabled(topic, {"cleanup.policy": "delete"})


def test_topics_are_tiered_by_default():
    assert tiering_enabled("orders")
    assert tiering_enabled("orders", {"remote.storage.enable": "true"})
    assert TopicConfig().copy_enabled("orders")


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compacted_topics_are_not_tiered(policy):
    assert not tiering_enabled("changelog", {"cleanup.policy": policy})
    TopicConfig({"cleanup.policy": policy}).validate("changelog")  # not an error: simply not tiered


def test_remote_storage_enable_false_turns_tiering_off():
    assert not tiering_enabled("orders", {"remote.storage.enable": "false"})


def test_remote_log_copy_disable_keeps_tiering_but_stops_copying():
    config = TopicConfig({"remote.log.copy.disable": "true"})
    assert config.tiering_enabled("orders")
    assert not config.copy_enabled("orders")


def test_tiering_a_compacted_topic_is_refused():
    with pytest.raises(InvalidTopicConfig, match="unsupported for the compacted topics") as raised:
        TopicConfig({"remote.storage.enable": "true", "cleanup.policy": "compact"}).validate("changelog")
    assert raised.value.key == "cleanup.policy"


def test_tiering_an_internal_topic_is_refused():
    with pytest.raises(InvalidTopicConfig) as raised:
        TopicConfig({"remote.storage.enable": "true"}).validate("__consumer_offsets")
    assert raised.value.key == "remote.storage.enable"


def test_a_tiered_topic_cannot_become_compacted():
    tiered = TopicConfig()
    with pytest.raises(InvalidTopicConfig, match="compacted"):
        tiered.with_config("cleanup.policy", "compact").validate("orders", previous=tiered)


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ({"retention.bytes": "100", "local.retention.bytes": "101"}, "local.retention.bytes", "must not be more than retention.bytes"),
        ({"retention.bytes": "100", "local.retention.bytes": "-1"}, "local.retention.bytes", "must not be -1"),
        ({"retention.ms": "1000", "local.retention.ms": "1001"}, "local.retention.ms", "must not be more than retention.ms"),
        ({"retention.ms": "1000", "local.retention.ms": "-1"}, "local.retention.ms", "must not be -1"),
        ({"local.retention.ms": str(WEEK_MS + 1)}, "local.retention.ms", "must not be more than retention.ms"),
    ],
)
def test_local_retention_cannot_exceed_total_retention_on_a_tiered_topic(overrides, key, message):
    with pytest.raises(InvalidTopicConfig, match=message) as raised:
        TopicConfig(overrides).validate("orders")
    assert raised.value.key == key


@pytest.mark.parametrize(
    "overrides",
    [
        {"retention.bytes": "100", "local.retention.bytes": "100"},
        {"retention.bytes": "100", "local.retention.bytes": "-2"},
        {"retention.bytes": "-1", "local.retention.bytes": "-1"},
        {"retention.bytes": "-1", "local.retention.bytes": "123456789"},
        {"retention.ms": "-1", "local.retention.ms": "99999999999"},
        {"retention.ms": "1000", "local.retention.ms": "0"},
    ],
)
def test_local_retention_within_total_retention_is_accepted(overrides):
    TopicConfig(overrides).validate("orders")


def test_retention_rules_do_not_apply_to_topics_that_are_not_tiered():
    TopicConfig({"retention.ms": "1000", "local.retention.ms": "5000", "remote.storage.enable": "false"}).validate("orders")
    TopicConfig({"retention.ms": "1000", "local.retention.ms": "5000"}).validate("__consumer_offsets")


def test_with_copy_disabled_local_and_total_retention_must_match():
    with pytest.raises(InvalidTopicConfig, match="remote.log.copy.disable") as raised:
        TopicConfig({"remote.log.copy.disable": "true", "retention.ms": "1000", "local.retention.ms": "500"}).validate("orders")
    assert raised.value.key == "local.retention.ms"
    TopicConfig({"remote.log.copy.disable": "true", "retention.ms": "1000", "local.retention.ms": "1000"}).validate("orders")
    TopicConfig({"remote.log.copy.disable": "true", "retention.ms": "1000"}).validate("orders")


def test_turning_tiering_off_requires_deleting_the_remote_data():
    tiered = TopicConfig()
    with pytest.raises(InvalidTopicConfig, match="without deleting remote data") as raised:
        tiered.with_config("remote.storage.enable", "false").validate("orders", previous=tiered)
    assert raised.value.key == "remote.storage.enable"
    (tiered.with_config("remote.storage.enable", "false").with_config("remote.log.delete.on.disable", "true")
     .validate("orders", previous=tiered))


def test_a_new_topic_may_start_with_tiering_off():
    TopicConfig({"remote.storage.enable": "false"}).validate("orders", previous=None)


def test_min_compaction_lag_cannot_exceed_max():
    with pytest.raises(InvalidTopicConfig, match="conflict topic config setting") as raised:
        TopicConfig({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}).validate("orders")
    assert raised.value.key == "min.compaction.lag.ms"


def test_every_default_parses_and_passes_its_own_validator():
    config = TopicConfig({key: spec.default for key, spec in CONFIG_KEYS.items()})
    assert config == TopicConfig({key: spec.default for key, spec in CONFIG_KEYS.items()})
    config.validate("orders")


longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    retention=st.integers(min_value=-1, max_value=2**63 - 1),
    local=st.integers(min_value=-2, max_value=2**63 - 1),
    retention_bytes=longs,
    local_bytes=st.integers(min_value=-2, max_value=2**63 - 1),
)
def test_validation_agrees_with_kafkas_rule_for_any_retention(retention, local, retention_bytes, local_bytes):
    config = TopicConfig({
        "retention.ms": retention, "local.retention.ms": local,
        "retention.bytes": retention_bytes, "local.retention.bytes": local_bytes,
    })
    ms_ok = retention == -1 or local == -2 or (local != -1 and local <= retention)
    bytes_ok = retention_bytes <= -1 or local_bytes == -2 or (local_bytes != -1 and local_bytes <= retention_bytes)
    try:
        config.validate("orders")
        accepted = True
    except InvalidTopicConfig:
        accepted = False
    assert accepted == (ms_ok and bytes_ok)
    assert TopicConfig(config.overrides) == config  # stored form round-trips


# --- issue 34 finding 11: the broker-level rule, and topics inheriting the broker's retention -------


@pytest.mark.parametrize("broker, key", [
    ({"log.local.retention.ms": "604800001"}, "log.local.retention.ms"),  # Kafka's 7 days in force
    ({"log.retention.ms": "1000", "log.local.retention.ms": "-1"}, "log.local.retention.ms"),
    ({"log.retention.bytes": "10", "log.local.retention.bytes": "11"}, "log.local.retention.bytes"),
])
def test_broker_local_retention_is_validated_as_kafka_does(broker, key):
    from kts_resources.metadata.topic_config import validate_broker_retention

    with pytest.raises(InvalidTopicConfig) as refused:
        validate_broker_retention(broker)
    assert refused.value.key == key


@pytest.mark.parametrize("broker", [
    {}, {"log.local.retention.ms": "604800000"}, {"log.retention.ms": "-1", "log.local.retention.ms": "-1"},
    {"log.retention.ms": "1000", "log.local.retention.ms": "-2"}, {"log.local.retention.bytes": "99"},
])
def test_broker_local_retention_within_retention_is_accepted(broker):
    from kts_resources.metadata.topic_config import validate_broker_retention

    validate_broker_retention(broker)


def test_a_topic_key_it_does_not_set_is_validated_with_the_brokers_value():
    config = TopicConfig({"local.retention.ms": "7200000"})
    config.validate("orders", broker={"log.retention.ms": "-1"})
    with pytest.raises(InvalidTopicConfig, match="3600000"):
        config.validate("orders", broker={"log.retention.ms": "3600000"})
    TopicConfig({"local.retention.ms": "7200000", "retention.ms": "7200000"}).validate("orders", broker={"log.retention.ms": "3600000"})
