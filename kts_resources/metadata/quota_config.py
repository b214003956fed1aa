"""The KIP-956 quota settings (``remote.log.manager.{copy,fetch}.*``): broker configs under Kafka's
names, with Kafka's defaults, parsed as Kafka's ConfigDef parses them.

Every kts process shares them through the metadata store (``RemoteLogMetadataStore.quota_config``),
so they live beside the store, as a topic's configs do (``topic_config``); the rate arithmetic
that uses them is ``tiering.quotas``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LONG_MAX = 2**63 - 1  # Kafka's "unbounded" default for both quotas
INT_MAX = 2**31 - 1

COPY_MAX_BYTES_PER_SECOND = "remote.log.manager.copy.max.bytes.per.second"
COPY_QUOTA_WINDOW_NUM = "remote.log.manager.copy.quota.window.num"
COPY_QUOTA_WINDOW_SIZE_SECONDS = "remote.log.manager.copy.quota.window.size.seconds"
FETCH_MAX_BYTES_PER_SECOND = "remote.log.manager.fetch.max.bytes.per.second"
FETCH_QUOTA_WINDOW_NUM = "remote.log.manager.fetch.quota.window.num"
FETCH_QUOTA_WINDOW_SIZE_SECONDS = "remote.log.manager.fetch.quota.window.size.seconds"

DEFAULT_WINDOW_NUM = 11
DEFAULT_WINDOW_SIZE_SECONDS = 1


class QuotaConfigError(ValueError):
    """A quota property with a value Kafka would reject."""


def _parse_number(props: Mapping[str, object], key: str, default: int, maximum: int) -> int:
    """ConfigDef's LONG / INT parsing with atLeast(1): integers or their decimal strings only."""
    if key not in props:
        return default
    raw = props[key]
    value: int
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise QuotaConfigError(f"Invalid value {raw!r} for configuration {key}: expected a whole number")
    if isinstance(raw, str):
        text = raw.strip()
        try:
            value = int(text, 10)
        except ValueError:
            raise QuotaConfigError(f"Invalid value {raw!r} for configuration {key}: not a number") from None
    else:
        value = raw
    if value > maximum:
        raise QuotaConfigError(f"Invalid value {raw!r} for configuration {key}: larger than {maximum}")
    if value < 1:
        raise QuotaConfigError(f"Invalid value {raw!r} for configuration {key}: Value must be at least 1")
    return value


@dataclass(frozen=True)
class QuotaConfig:
    """The six KIP-956 broker settings, with Kafka's defaults."""

    copy_max_bytes_per_second: int = LONG_MAX
    copy_window_num: int = DEFAULT_WINDOW_NUM
    copy_window_size_seconds: int = DEFAULT_WINDOW_SIZE_SECONDS
    fetch_max_bytes_per_second: int = LONG_MAX
    fetch_window_num: int = DEFAULT_WINDOW_NUM
    fetch_window_size_seconds: int = DEFAULT_WINDOW_SIZE_SECONDS

    @classmethod
    def from_properties(cls, props: Mapping[str, object]) -> QuotaConfig:
        """Read the quota settings out of a broker-style property map; other keys are ignored."""
        return cls(
            copy_max_bytes_per_second=_parse_number(props, COPY_MAX_BYTES_PER_SECOND, LONG_MAX, LONG_MAX),
            copy_window_num=_parse_number(props, COPY_QUOTA_WINDOW_NUM, DEFAULT_WINDOW_NUM, INT_MAX),
            copy_window_size_seconds=_parse_number(
                props, COPY_QUOTA_WINDOW_SIZE_SECONDS, DEFAULT_WINDOW_SIZE_SECONDS, INT_MAX
            ),
            fetch_max_bytes_per_second=_parse_number(props, FETCH_MAX_BYTES_PER_SECOND, LONG_MAX, LONG_MAX),
            fetch_window_num=_parse_number(props, FETCH_QUOTA_WINDOW_NUM, DEFAULT_WINDOW_NUM, INT_MAX),
            fetch_window_size_seconds=_parse_number(
                props, FETCH_QUOTA_WINDOW_SIZE_SECONDS, DEFAULT_WINDOW_SIZE_SECONDS, INT_MAX
            ),
        )

    def to_properties(self) -> dict[str, int]:
        return {
            COPY_MAX_BYTES_PER_SECOND: self.copy_max_bytes_per_second,
            COPY_QUOTA_WINDOW_NUM: self.copy_window_num,
            COPY_QUOTA_WINDOW_SIZE_SECONDS: self.copy_window_size_seconds,
            FETCH_MAX_BYTES_PER_SECOND: self.fetch_max_bytes_per_second,
            FETCH_QUOTA_WINDOW_NUM: self.fetch_window_num,
            FETCH_QUOTA_WINDOW_SIZE_SECONDS: self.fetch_window_size_seconds,
        }
