"""The broker-level settings every kts process shares, kept in the metadata store: KIP-956's quotas
(``remote.log.manager.copy/fetch.*``), the retention defaults of topics that set none
(``log.retention.ms``, …) and kts's topic-absence grace. Which keys there are, a change checked as
a whole before any key is written, and the values in force."""

from __future__ import annotations

from typing import Iterable, Mapping

from kts_resources.metadata.quota_config import QuotaConfig
from kts_resources.metadata.topic_config import broker_retention, validate_broker_retention
from kts_resources.tiering.partition_admin import DEFAULT_TOPIC_ABSENCE_GRACE_MS, TOPIC_ABSENCE_GRACE_KEY
from kts_resources.tiering.retention import BROKER_RETENTION_DEFAULTS


class InvalidBrokerConfig(ValueError):
    """A key kts does not know, or a value below the lowest its key takes; nothing was written."""


def _quota_keys() -> dict[str, int]:
    return QuotaConfig().to_properties()


def _lowest() -> dict[str, int]:
    """The whole-number keys besides the quotas, each with the lowest value it takes."""
    return {**BROKER_RETENTION_DEFAULTS, TOPIC_ABSENCE_GRACE_KEY: -1}


def update_broker_configs(store, assignments: Iterable[tuple[str, str]] = (), deletions: Iterable[str] = ()) -> None:
    """Set ``assignments`` (key, value) and return ``deletions`` to Kafka's defaults, all or nothing:
    the result as a whole is checked (InvalidBrokerConfig, QuotaConfigError, InvalidTopicConfig)
    before any key is written."""
    quota_keys, lowest = _quota_keys(), _lowest()
    known = {**quota_keys, **lowest}
    stored = store.broker_configs()
    pending = dict(stored)
    for key, value in assignments:
        if key not in known:
            raise InvalidBrokerConfig(f"{key}={value}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        if key in lowest:
            if not value.lstrip("-").isdigit() or int(value) < lowest[key]:
                raise InvalidBrokerConfig(f"Invalid value {value!r} for configuration {key}: a whole number ≥ {lowest[key]}")
        pending[key] = value
    for key in deletions:
        if key not in known:
            raise InvalidBrokerConfig(f"{key!r} is not one of {', '.join(sorted(known))}")
        pending.pop(key, None)
    QuotaConfig.from_properties({k: v for k, v in pending.items() if k in quota_keys})
    validate_broker_retention(pending)
    for key in sorted(set(stored) | set(pending)):
        if stored.get(key) != pending.get(key):
            store.set_broker_config(key, pending.get(key))


def broker_configs_in_force(stored: Mapping[str, str]) -> dict[str, int]:
    """Every key's value in force: the stored one, else Kafka's default, which is what kts applies."""
    quota_keys = _quota_keys()
    return {**QuotaConfig.from_properties({k: v for k, v in stored.items() if k in quota_keys}).to_properties(),
            **{k: value for k, (value, _set) in broker_retention(stored).items()},
            TOPIC_ABSENCE_GRACE_KEY: int(stored.get(TOPIC_ABSENCE_GRACE_KEY, DEFAULT_TOPIC_ABSENCE_GRACE_MS))}
