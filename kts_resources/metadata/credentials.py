"""The SCRAM credentials of the users `kts serve` authenticates (``kts users``), in the metadata
store's ``scram_credentials`` table: salt, StoredKey, ServerKey and iteration count per user and
mechanism, as Kafka keeps them (never a password; ``serving.scram`` derives them). Every process
sharing the store sees the same users, and a change applies to the next login."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine

from kts_resources.metadata import database
from kts_resources.metadata.models import scram_credentials as TABLE


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(frozen=True)
class ScramUser:
    name: str
    mechanism: str
    iterations: int
    updated_at: dt.datetime


def user_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user (None if it can): Kafka takes any non-empty name; kts also
    refuses blanks around it and control characters, which no one means to type."""
    if not name:
        return "a user name cannot be empty"
    if name != name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"user name {name!r} has blanks around it or control characters"
    return None


class ScramCredentials:
    """The ``scram_credentials`` table over ``engine`` (a migrated store's)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _tx(self, work):
        return database.in_transaction(self._engine, work)

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        row = self._tx(lambda conn, _: conn.execute(
            sa.select(TABLE.c.salt, TABLE.c.stored_key, TABLE.c.server_key, TABLE.c.iterations)
            .where(TABLE.c.user_name == user, TABLE.c.mechanism == mechanism)).first())
        return None if row is None else ScramCredential(bytes(row.salt), bytes(row.stored_key), bytes(row.server_key), row.iterations)

    def put(self, user: str, mechanism: str, credential: ScramCredential) -> bool:
        """Add the user, or replace its credential; True when it was new."""
        values = dict(salt=credential.salt, stored_key=credential.stored_key, server_key=credential.server_key,
                      iterations=credential.iterations)

        def work(conn, _attempt) -> bool:
            existed = conn.execute(sa.select(sa.literal(1)).where(
                TABLE.c.user_name == user, TABLE.c.mechanism == mechanism).with_for_update()).first() is not None
            conn.execute(pg_insert(TABLE).values(user_name=user, mechanism=mechanism, **values).on_conflict_do_update(
                index_elements=[TABLE.c.user_name, TABLE.c.mechanism], set_={**values, "updated_at": sa.func.now()}))
            return not existed
        return self._tx(work)

    def delete(self, user: str) -> bool:
        """Remove every credential of ``user``; False when there was none."""
        return self._tx(lambda conn, _: conn.execute(sa.delete(TABLE).where(TABLE.c.user_name == user)).rowcount > 0)

    def users(self) -> list[ScramUser]:
        rows = self._tx(lambda conn, _: conn.execute(
            sa.select(TABLE.c.user_name, TABLE.c.mechanism, TABLE.c.iterations, TABLE.c.updated_at)
            .order_by(TABLE.c.user_name, TABLE.c.mechanism)).all())
        return [ScramUser(r.user_name, r.mechanism, r.iterations, r.updated_at) for r in rows]
