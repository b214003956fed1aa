"""Topic configs under Kafka's names, parsed and validated as Kafka's LogConfig does.

A topic's stored configs are its overrides only (strings, as Kafka keeps them); everything else
is Kafka's default. Parsing follows ConfigDef (values trimmed, booleans case-insensitive, longs
and ints range-checked); validation follows LogConfig.validate* for the rules tiering depends on.
Every error is one ``InvalidTopicConfig`` naming the key, worded like Kafka's ConfigException.

One rule differs from Kafka on purpose (issue 3): kts tiers a topic unless it is internal,
compacted, or ``remote.storage.enable=false`` is set on it, so ``remote.storage.enable`` keeps
Kafka's default (false) as a value but ``tiering_enabled`` reads an unset key as "yes". The
retention rules Kafka applies to ``remote.storage.enable=true`` topics apply to every topic kts
tiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

# Topics kts never tiers, whatever their configs (issue 3): Kafka's own internal topics.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata", "__remote_log_metadata"})

REMOTE_STORAGE_ENABLE = "remote.storage.enable"
LOCAL_RETENTION_MS = "local.retention.ms"
LOCAL_RETENTION_BYTES = "local.retention.bytes"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
REMOTE_LOG_COPY_DISABLE = "remote.log.copy.disable"
REMOTE_LOG_DELETE_ON_DISABLE = "remote.log.delete.on.disable"
CLEANUP_POLICY = "cleanup.policy"
SEGMENT_BYTES = "segment.bytes"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"

# -2 for local.retention.*: "same as retention.*" (LogConfig.DEFAULT_LOCAL_RETENTION_*).
SAME_AS_RETENTION = -2

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)


class InvalidTopicConfig(ValueError):
    """A topic config Kafka would refuse; ``key`` names it."""

    def __init__(self, key: str, value: object, message: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"Invalid value {_shown(value)} for configuration {key}: {message}")


def _shown(value: object, limit: int = 64) -> str:
    """``value`` for a one-line message: a 5,000-digit value is shown by its start and length."""
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class UnknownTopicConfig(InvalidTopicConfig):
    def __init__(self, key: str) -> None:
        self.key = key
        self.value = None
        ValueError.__init__(self, f"Unknown topic config name: {_shown(key)}")


# -- ConfigDef types ------------------------------------------------------------------------------

_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")


def _parse_integer(key: str, raw: str, lo: int, hi: int, type_name: str) -> int:
    # Java's parseLong/parseInt: optional sign and ASCII digits only, nothing else.
    if not raw.isascii() or not _JAVA_INTEGER.fullmatch(raw):
        raise InvalidTopicConfig(key, raw, f"Not a number of type {type_name}")
    # More digits than any long has is out of range (and int() refuses over 4,300 digits,
    # leading zeros included, so they go first).
    sign, digits = ("-", raw[1:]) if raw[0] == "-" else ("", raw.lstrip("+"))
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(LONG_MAX)):
        raise InvalidTopicConfig(key, raw, f"Not a number of type {type_name}")
    value = int(sign + digits)
    if not lo <= value <= hi:
        raise InvalidTopicConfig(key, raw, f"Not a number of type {type_name}")
    return value


def _long(key: str, raw: str) -> int:
    return _parse_integer(key, raw, LONG_MIN, LONG_MAX, "LONG")


def _int(key: str, raw: str) -> int:
    return _parse_integer(key, raw, INT_MIN, INT_MAX, "INT")


def _boolean(key: str, raw: str) -> bool:
    if raw.lower() == "true":
        return True
    if raw.lower() == "false":
        return False
    raise InvalidTopicConfig(key, raw, "Expected value to be either true or false")


def _double(key: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise InvalidTopicConfig(key, raw, "Not a number of type DOUBLE") from None


def _list(key: str, raw: str) -> tuple[str, ...]:
    return tuple(re.split(r"\s*,\s*", raw)) if raw else ()


def _string(key: str, raw: str) -> str:
    return raw


def _at_least(minimum: int) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value < minimum:
            raise InvalidTopicConfig(key, value, f"Value must be at least {minimum}")

    return check


def _between(lo: float, hi: float) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value < lo:
            raise InvalidTopicConfig(key, value, f"Value must be at least {lo}")
        if value > hi:
            raise InvalidTopicConfig(key, value, f"Value must be no more than {hi}")

    return check


def _one_of(*allowed: str) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if item not in allowed:
                raise InvalidTopicConfig(key, item, f"String must be one of: {', '.join(allowed)}")

    return check


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    parse: Callable[[str, str], Any]
    default: str
    validate: Callable[[str, Any], None] | None = None


_WEEK_MS = str(7 * 24 * 60 * 60 * 1000)

# LogConfig's definitions for the topic configs kts reads or lets users set (Kafka 3.9 defaults).
CONFIG_KEYS: dict[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey(SEGMENT_BYTES, _int, str(1024 * 1024 * 1024), _at_least(14)),  # LegacyRecord.RECORD_OVERHEAD_V0
        ConfigKey("segment.ms", _long, _WEEK_MS, _at_least(1)),
        ConfigKey("segment.jitter.ms", _long, "0", _at_least(0)),
        ConfigKey("segment.index.bytes", _int, str(10 * 1024 * 1024), _at_least(4)),
        ConfigKey("index.interval.bytes", _int, "4096", _at_least(0)),
        ConfigKey("max.message.bytes", _int, str(1024 * 1024 + 12), _at_least(0)),
        # retention.bytes may be any long: -1 (or below) means no size limit.
        ConfigKey(RETENTION_BYTES, _long, "-1"),
        ConfigKey(RETENTION_MS, _long, _WEEK_MS, _at_least(-1)),
        ConfigKey("delete.retention.ms", _long, str(24 * 60 * 60 * 1000), _at_least(0)),
        ConfigKey(MIN_COMPACTION_LAG_MS, _long, "0", _at_least(0)),
        ConfigKey(MAX_COMPACTION_LAG_MS, _long, str(LONG_MAX), _at_least(1)),
        ConfigKey("min.cleanable.dirty.ratio", _double, "0.5", _between(0, 1)),
        ConfigKey("file.delete.delay.ms", _long, "60000", _at_least(0)),
        ConfigKey(CLEANUP_POLICY, _list, "delete", _one_of("compact", "delete")),
        ConfigKey("message.timestamp.type", _string, "CreateTime", _one_of("CreateTime", "LogAppendTime")),
        ConfigKey("compression.type", _string, "producer",
                  _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        ConfigKey(REMOTE_STORAGE_ENABLE, _boolean, "false"),
        ConfigKey(LOCAL_RETENTION_MS, _long, str(SAME_AS_RETENTION), _at_least(SAME_AS_RETENTION)),
        ConfigKey(LOCAL_RETENTION_BYTES, _long, str(SAME_AS_RETENTION), _at_least(SAME_AS_RETENTION)),
        ConfigKey(REMOTE_LOG_COPY_DISABLE, _boolean, "false"),
        ConfigKey(REMOTE_LOG_DELETE_ON_DISABLE, _boolean, "false"),
    )
}


def _canonical(key: str, value: Any) -> str:
    """The stored string for a parsed value (booleans lower-case, lists comma-joined)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def parse_value(key: str, raw: object) -> Any:
    """``raw`` (a string, or a Python bool/int/float) parsed and range-checked as ``key``."""
    spec = CONFIG_KEYS.get(key)
    if spec is None:
        raise UnknownTopicConfig(key)
    text = _canonical(key, raw) if isinstance(raw, (bool, int, float)) else str(raw)
    value = spec.parse(key, text.strip())
    if spec.validate is not None:
        spec.validate(key, value)
    return value


class TopicConfig:
    """A topic's configs: its overrides on top of Kafka's defaults (LogConfig)."""

    __slots__ = ("_overrides", "_values")

    def __init__(self, overrides: Mapping[str, object] | None = None) -> None:
        parsed = {key: parse_value(key, raw) for key, raw in (overrides or {}).items()}
        self._overrides = {key: _canonical(key, value) for key, value in parsed.items()}
        self._values = {key: parsed.get(key) if key in parsed else spec.parse(key, spec.default)
                        for key, spec in CONFIG_KEYS.items()}

    @property
    def overrides(self) -> dict[str, str]:
        """The explicitly set configs, as stored (canonical strings)."""
        return dict(self._overrides)

    def is_set(self, key: str) -> bool:
        return key in self._overrides

    def get(self, key: str) -> Any:
        if key not in self._values:
            raise UnknownTopicConfig(key)
        return self._values[key]

    def with_config(self, key: str, value: object) -> "TopicConfig":
        return TopicConfig({**self._overrides, key: value})

    def without_config(self, key: str) -> "TopicConfig":
        if key not in CONFIG_KEYS:
            raise UnknownTopicConfig(key)
        return TopicConfig({k: v for k, v in self._overrides.items() if k != key})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicConfig) and other._overrides == self._overrides

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._overrides.items())))

    def __repr__(self) -> str:
        return f"TopicConfig({self._overrides!r})"

    # -- the values kts reads ---------------------------------------------------------------------

    @property
    def remote_storage_enable(self) -> bool:
        """Kafka's value (default false); kts's default tiering is ``tiering_enabled``."""
        return self._values[REMOTE_STORAGE_ENABLE]

    @property
    def retention_ms(self) -> int:
        return self._values[RETENTION_MS]

    @property
    def retention_bytes(self) -> int:
        return self._values[RETENTION_BYTES]

    @property
    def local_retention_ms(self) -> int:
        return self._values[LOCAL_RETENTION_MS]

    @property
    def local_retention_bytes(self) -> int:
        return self._values[LOCAL_RETENTION_BYTES]

    @property
    def effective_local_retention_ms(self) -> int:
        """local.retention.ms, with -2 meaning retention.ms (LogConfig.localRetentionMs)."""
        value = self.local_retention_ms
        return self.retention_ms if value == SAME_AS_RETENTION else value

    @property
    def effective_local_retention_bytes(self) -> int:
        """local.retention.bytes, with -2 meaning retention.bytes (LogConfig.localRetentionBytes)."""
        value = self.local_retention_bytes
        return self.retention_bytes if value == SAME_AS_RETENTION else value

    @property
    def remote_log_copy_disable(self) -> bool:
        return self._values[REMOTE_LOG_COPY_DISABLE]

    @property
    def remote_log_delete_on_disable(self) -> bool:
        return self._values[REMOTE_LOG_DELETE_ON_DISABLE]

    @property
    def cleanup_policy(self) -> tuple[str, ...]:
        return self._values[CLEANUP_POLICY]

    @property
    def compact(self) -> bool:
        return "compact" in (policy.lower() for policy in self.cleanup_policy)

    @property
    def segment_bytes(self) -> int:
        return self._values[SEGMENT_BYTES]

    # -- tiering and validation -------------------------------------------------------------------

    def tiering_enabled(self, topic: str) -> bool:
        """Whether kts tiers ``topic``: yes unless it is internal, compacted, or has
        ``remote.storage.enable=false`` set (issue 3; Kafka itself defaults to no)."""
        if topic in INTERNAL_TOPICS or self.compact:
            return False
        return self.remote_storage_enable if self.is_set(REMOTE_STORAGE_ENABLE) else True

    def copy_enabled(self, topic: str) -> bool:
        """Tiered and not ``remote.log.copy.disable`` (which stops copying but keeps reads)."""
        return self.tiering_enabled(topic) and not self.remote_log_copy_disable

    def validate(self, topic: str, previous: "TopicConfig | None" = None, broker: Mapping[str, str] | None = None) -> None:
        """Kafka's cross-config rules (LogConfig.validateTopicLogConfigValues) for ``topic``;
        ``previous`` is the config being replaced, for the rule on turning tiering off; ``broker``
        the broker-level settings, whose log.*retention* a key the topic does not set inherits
        (Kafka validates the topic's configs merged over the broker's)."""
        if self.get(MIN_COMPACTION_LAG_MS) > self.get(MAX_COMPACTION_LAG_MS):
            raise InvalidTopicConfig(
                MIN_COMPACTION_LAG_MS, self.get(MIN_COMPACTION_LAG_MS),
                f"conflict topic config setting {MIN_COMPACTION_LAG_MS} ({self.get(MIN_COMPACTION_LAG_MS)}) > "
                f"{MAX_COMPACTION_LAG_MS} ({self.get(MAX_COMPACTION_LAG_MS)})",
            )
        explicitly_on = self.is_set(REMOTE_STORAGE_ENABLE) and self.remote_storage_enable
        was_tiered = previous is not None and previous.tiering_enabled(topic)
        if explicitly_on or (was_tiered and not (self.is_set(REMOTE_STORAGE_ENABLE) and not self.remote_storage_enable)):
            # Tiering asked for, or still in force (a tiered topic keeps its remote data until
            # remote.storage.enable=false says otherwise): a compacted or internal topic can't.
            if self.compact:
                raise InvalidTopicConfig(
                    CLEANUP_POLICY, ",".join(self.cleanup_policy),
                    "Remote log storage is unsupported for the compacted topics"
                    + ("" if explicitly_on else " (the topic is tiered; set remote.storage.enable=false with "
                       "remote.log.delete.on.disable=true first)"),
                )
            if topic in INTERNAL_TOPICS:
                raise InvalidTopicConfig(REMOTE_STORAGE_ENABLE, "true", f"internal topic {topic} cannot be tiered")
        if self.tiering_enabled(topic):
            self._validate_retention_for_tiering(inherited_retention(broker or {}))
        if was_tiered and not self.tiering_enabled(topic) and not self.remote_log_delete_on_disable:
            raise InvalidTopicConfig(
                REMOTE_STORAGE_ENABLE, "false",
                "It is invalid to disable remote storage without deleting remote data. If you want to keep the "
                "remote data and turn to read only, please set `remote.storage.enable=true,remote.log.copy.disable=true`. "
                "If you want to disable remote storage and delete all remote data, please set "
                "`remote.storage.enable=false,remote.log.delete.on.disable=true`.",
            )

    def _in_force(self, key: str, inherited: Mapping[str, int]) -> Any:
        """The topic's value, else the broker's default for it, else Kafka's."""
        return self.get(key) if self.is_set(key) or key not in inherited else inherited[key]

    def _validate_retention_for_tiering(self, inherited: Mapping[str, int]) -> None:
        for local_key, total_key in ((LOCAL_RETENTION_BYTES, RETENTION_BYTES), (LOCAL_RETENTION_MS, RETENTION_MS)):
            check_local_retention(local_key, self._in_force(local_key, inherited),
                                  total_key, self._in_force(total_key, inherited), by_bytes=total_key == RETENTION_BYTES)
        # LogConfig.validateRetentionConfigsWhenRemoteCopyDisabled: nothing more will be copied,
        # so the local tier must keep everything the topic keeps.
        if self.remote_log_copy_disable:
            for local_key, total_key in ((LOCAL_RETENTION_BYTES, RETENTION_BYTES), (LOCAL_RETENTION_MS, RETENTION_MS)):
                local, total = self._in_force(local_key, inherited), self._in_force(total_key, inherited)
                if local != SAME_AS_RETENTION and local != total:
                    raise InvalidTopicConfig(
                        local_key, local,
                        f"When `{REMOTE_LOG_COPY_DISABLE}` is set to true, the `{local_key}` and `{total_key}` must be "
                        "set to the identical value because there will be no more logs copied to the remote storage.",
                    )


def check_local_retention(local_key: str, local: int, total_key: str, total: int, *, by_bytes: bool) -> None:
    """LogConfig.validateRemoteStorageRetentionSize / RetentionTime: the local tier is a part of
    the whole log, so while the whole is bounded the local part may be neither unbounded (−1) nor
    bigger; −2 is "the same as the whole"."""
    bounded = total > -1 if by_bytes else total != -1
    if bounded and local != SAME_AS_RETENTION:
        if local == -1:
            raise InvalidTopicConfig(local_key, local, f"Value must not be -1 as {total_key} value is set as {total}.")
        if local > total:
            raise InvalidTopicConfig(local_key, local, f"Value must not be more than {total_key} property value: {total}")


# The broker-level settings that are the retention of topics setting none of their own
# (KafkaConfig's log.* names → the topic config each supplies), kept by `kts broker-config`.
BROKER_RETENTION_KEYS = {"log.retention.ms": RETENTION_MS, "log.retention.bytes": RETENTION_BYTES,
                         "log.local.retention.ms": LOCAL_RETENTION_MS, "log.local.retention.bytes": LOCAL_RETENTION_BYTES}


def inherited_retention(broker: Mapping[str, str]) -> dict[str, int]:
    """Topic key → the value the broker sets for it (only those the broker sets)."""
    return {BROKER_RETENTION_KEYS[key]: int(value) for key, value in broker.items() if key in BROKER_RETENTION_KEYS}


def broker_retention(broker: Mapping[str, str]) -> dict[str, tuple[int, bool]]:
    """Each broker-level retention key → (the value in force, whether it is set): the stored one,
    else Kafka's default (log.retention.ms 7 days, log.retention.bytes −1, log.local.retention.* −2),
    which is what a topic setting nothing gets (``retention.RetentionConfig.from_topic_config``)."""
    return {key: (int(broker[key]), True) if key in broker else (CONFIG_KEYS[topic_key].parse(topic_key, CONFIG_KEYS[topic_key].default), False)
            for key, topic_key in BROKER_RETENTION_KEYS.items()}


def validate_broker_retention(broker: Mapping[str, str]) -> None:
    """Kafka's checks of log.local.retention.* against log.retention.* (validateBrokerLogConfigValues
    with remote storage on, and DynamicLogConfig on a change); InvalidTopicConfig names the key."""
    values = {key: value for key, (value, _set) in broker_retention(broker).items()}
    for local_key, total_key in (("log.local.retention.bytes", "log.retention.bytes"), ("log.local.retention.ms", "log.retention.ms")):
        check_local_retention(local_key, values[local_key], total_key, values[total_key], by_bytes=local_key.endswith("bytes"))


def tiering_enabled(topic: str, configs: TopicConfig | Mapping[str, object] | None = None) -> bool:
    """Whether kts tiers ``topic`` with ``configs`` (overrides; none = Kafka's defaults)."""
    config = configs if isinstance(configs, TopicConfig) else TopicConfig(configs)
    return config.tiering_enabled(topic)
