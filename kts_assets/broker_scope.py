"""Whose Dagster objects these are: one broker's, when the kts beside every broker of a cluster
records into one Dagster instance.

Brokers' kts that share a metadata store (``KTS_DATABASE_URL``) share the Dagster instance stored
in it, and the instance keys four things by name alone: code locations, asset keys, dynamic
partitions and pools. With ``KTS_DAGSTER_PER_BROKER=on`` each kts names them after its broker's id
(``meta.properties``, ``kts_resources.tiering.leadership.this_broker_id``), so one UI shows every broker and
no broker's run waits for another broker's pool slot:

    what                 plain (the default)   broker 2
    code location        kts                   kts-broker-2
    asset keys           local_segments        broker_2/local_segments
    dynamic partitions   topic_partitions      topic_partitions_broker_2
    pool (Spark steps)   spark                 spark_broker_2

A switch, not a rule drawn from ``meta.properties`` alone: every broker has an id, a lone broker
too (and every simulated log dir: the simulator writes ``node.id`` 0), while nothing in a broker's
files says whether other brokers' kts record into the same instance. Off, a lone kts keeps the names
its runs, history and sensor cursors are stored under.

Read once per process, when the modules that define assets, partitions and pools are imported
(:func:`current`): Dagster loads a code location, and runs its run workers, in processes of their
own, each with its broker's environment. The CLI server, which imports the Definitions before its
clients' environments are known, compares these inputs (``settings.dagster_scope_inputs``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg

PLAIN_LOCATION = "kts"
# The module every code location loads its one Definitions from.
DEFINITIONS_MODULE = "kts_assets.definitions"
PLAIN_PARTITIONS = "topic_partitions"
PLAIN_POOL = "spark"


class BrokerScopeError(ValueError):
    """``KTS_DAGSTER_PER_BROKER`` is on (or malformed) and no broker id can be read: one line."""


@dataclass(frozen=True)
class BrokerScope:
    """The names of one kts's Dagster objects: plain (``broker_id`` None) or its broker's."""

    broker_id: int | None = None

    @property
    def location_name(self) -> str:
        """The code location's name: the workspace entry the UI shows this kts under."""
        return PLAIN_LOCATION if self.broker_id is None else f"{PLAIN_LOCATION}-broker-{self.broker_id}"

    @property
    def partitions_def_name(self) -> str:
        """The dynamic partitions (the topic-partitions this broker's log dirs hold)."""
        return PLAIN_PARTITIONS if self.broker_id is None else f"{PLAIN_PARTITIONS}_broker_{self.broker_id}"

    @property
    def pool(self) -> str:
        """The pool every Spark step takes a slot of (dagster.yaml: one slot per pool)."""
        return PLAIN_POOL if self.broker_id is None else f"{PLAIN_POOL}_broker_{self.broker_id}"

    def asset_key(self, name: str) -> dg.AssetKey:
        """``name`` as an asset key, under ``broker_<id>`` for a broker's scope."""
        import dagster as dg

        return dg.AssetKey(name) if self.broker_id is None else dg.AssetKey([f"broker_{self.broker_id}", name])


def scope_from_environment() -> BrokerScope:
    """The scope this environment asks for: plain unless ``KTS_DAGSTER_PER_BROKER`` is on, then the
    broker id of ``KTS_LOG_DIRS`` (and ``KTS_METADATA_LOG_DIR``). BrokerScopeError when the switch
    is malformed, or on and no id can be read."""
    from kts_resources import settings
    from kts_resources.kafka.errors import KafkaFormatError
    from kts_resources.tiering.leadership import this_broker_id

    try:
        if not settings.dagster_per_broker():
            return BrokerScope()
    except ValueError as e:
        raise BrokerScopeError(str(e)) from None
    log_dirs, metadata_log_dir = settings.log_dirs(), settings.metadata_log_dir()
    try:
        broker_id = this_broker_id(log_dirs, metadata_log_dir)
    except (KafkaFormatError, ValueError) as e:  # a malformed meta.properties, log dirs that disagree
        raise BrokerScopeError(f"{settings.DAGSTER_PER_BROKER} is on, but the broker id cannot be read: {e}") from None
    if broker_id is None:
        where = ", ".join(str(d) for d in log_dirs)
        raise BrokerScopeError(f"{settings.DAGSTER_PER_BROKER} is on, but no meta.properties in {where} names a broker id "
                               "(node.id or broker.id)")
    return BrokerScope(broker_id)


@functools.cache
def current() -> BrokerScope:
    """This process's scope, read on first use (the Definitions' import) and kept."""
    return scope_from_environment()
