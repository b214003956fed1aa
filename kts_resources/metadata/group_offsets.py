"""Consumer groups' committed offsets in the metadata store (migration 0008): what `kts serve`'s
OffsetCommit writes and OffsetFetch reads, and what `kts groups` lists. Membership is not here:
it lives in the memory of the `kts serve` that coordinates the group; the offsets outlive it, so a
restarted `kts serve`, or another one sharing the store, resumes every group where it stopped.

A commit is an upsert of whole rows (the last commit of a partition wins, as in Kafka's
__consumer_offsets), so repeating one after a lost reply is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine

from kts_resources.metadata import database
from kts_resources.metadata.models import group_offsets as OFFSETS


@dataclass(frozen=True)
class CommittedOffset:
    """One partition's committed position: the offset of the next record the group reads."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


class GroupOffsets:
    """The committed offsets of every consumer group, in the store behind ``engine``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def commit(self, group_id: str, offsets: Iterable[CommittedOffset]) -> None:
        rows = [{"group_id": group_id, "topic": o.topic, "partition": o.partition, "committed_offset": o.offset,
                 "leader_epoch": o.leader_epoch, "metadata": o.metadata} for o in offsets]
        if not rows:
            return

        def work(conn: Connection, _attempt: int) -> None:
            insert = pg_insert(OFFSETS).values(rows)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[OFFSETS.c.group_id, OFFSETS.c.topic, OFFSETS.c.partition],
                set_={"committed_offset": insert.excluded.committed_offset, "leader_epoch": insert.excluded.leader_epoch,
                      "metadata": insert.excluded.metadata, "committed_at": sa.func.now()}))

        database.in_transaction(self._engine, work)

    def restore(self, group_id: str, offsets: Iterable[CommittedOffset]) -> int:
        """``kts recover``: the offsets the tier kept for ``group_id``, each where the store has no
        commit for its partition (a commit the store has is as new as the tier's, or newer). How
        many were written."""
        rows = [{"group_id": group_id, "topic": o.topic, "partition": o.partition, "committed_offset": o.offset,
                 "leader_epoch": o.leader_epoch, "metadata": o.metadata} for o in offsets]
        if not rows:
            return 0

        def work(conn: Connection, _attempt: int) -> int:
            insert = pg_insert(OFFSETS).values(rows).on_conflict_do_nothing(
                index_elements=[OFFSETS.c.group_id, OFFSETS.c.topic, OFFSETS.c.partition])
            return conn.execute(insert).rowcount

        return database.in_transaction(self._engine, work)

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        """(topic, partition) → the group's committed offset, for every partition it committed."""
        stmt = sa.select(OFFSETS).where(OFFSETS.c.group_id == group_id)
        rows = database.in_transaction(self._engine, lambda conn, _: conn.execute(stmt).all())
        return {(row.topic, row.partition): _offset(row) for row in rows}

    def all_groups(self) -> dict[str, list[CommittedOffset]]:
        """Group id → its committed offsets in (topic, partition) order, every group in id order."""
        stmt = sa.select(OFFSETS).order_by(OFFSETS.c.group_id, OFFSETS.c.topic, OFFSETS.c.partition)
        rows = database.in_transaction(self._engine, lambda conn, _: conn.execute(stmt).all())
        groups: dict[str, list[CommittedOffset]] = {}
        for row in rows:
            groups.setdefault(row.group_id, []).append(_offset(row))
        return groups


def _offset(row) -> CommittedOffset:
    return CommittedOffset(row.topic, row.partition, row.committed_offset, row.leader_epoch, row.metadata)
