"""Sensor cursors: a short cursor naming a state kept in the Dagster instance, and the codec of
the roll sensor's per-partition maps.

A cursor is shown whole on the sensor's page in the UI, and a state over thousands of partitions
does not fit there (the retention sensor's was tens of kilobytes). So a sensor's state is kept in
the instance's key-value store, under the sensor's name, and the cursor is a few dozen bytes:
``{"v":3,"state":<digest of the state>, ...a few counts}`` (:func:`state_cursor`,
:func:`sensor_state`). The last few states are kept, so a tick that failed after storing its state
(its cursor not committed) still finds the state its cursor names. Cursors from before, which
carried their state inline, are read as they are.

The roll sensor's state: named ``{partition key: int}`` maps — the newest base offset it
requested per partition (``requested``), the copy lag it last reported, its retries — as
versioned JSON, packed and zlib-compressed once it grows large. ``kts sync`` moves it too
(``sensors.roll.advance_roll_cursor``).

No Dagster here but the key-value store's two calls: the codec is plain data, tested and
benchmarked on its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import dagster as dg

# Above this many bytes of JSON the cursor is stored zlib-compressed: a cursor is written with
# every tick, and 10,000 partitions' offsets are ~250 KB of plain JSON.
CURSOR_COMPRESS_ABOVE = 4096
# 2: named maps side by side (the roll sensor's requested offsets and the copy lag it last
# reported); 1, the requested map alone, is still read.
CURSOR_VERSION = 2
REQUESTED = "requested"


def encode_cursor(offsets: Mapping[str, int], more: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """``{key: offset}`` (and any further named ``{key: int}`` maps) as compact JSON; packed and
    zlib-compressed once it grows large.

    Packed, each topic is named once per map and followed by its ``partition, value`` pairs:
    10,000 partitions with random 9-digit offsets take ~84 KB, about a third of the plain map.
    """
    maps = {REQUESTED: offsets, **(more or {})}
    plain = json.dumps({"v": CURSOR_VERSION, **{name: dict(sorted(m.items())) for name, m in maps.items()}},
                       separators=(",", ":"))
    if len(plain) <= CURSOR_COMPRESS_ABOVE:
        return plain
    packed = json.dumps({name: _by_topic(m) if all(_is_partition_key(k) for k in m) else dict(m)
                         for name, m in maps.items()}, separators=(",", ":")).encode()
    return json.dumps({"v": CURSOR_VERSION, "zlib": base64.b64encode(zlib.compress(packed, 9)).decode("ascii")},
                      separators=(",", ":"))


def _by_topic(values: Mapping[str, int]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for key, value in sorted(values.items(), key=lambda kv: _split_key(kv[0])):
        topic, partition = _split_key(key)
        by_topic.setdefault(topic, []).extend((partition, value))
    return by_topic


def _is_partition_key(key: str) -> bool:
    topic, _, partition = key.rpartition("-")
    return bool(topic) and partition.isdigit()


def _from_topics(by_topic: Mapping[str, list[int] | int]) -> dict[str, int]:
    """A packed map back: ``{topic: [partition, value, …]}``, or a small map of other keys as it was."""
    if all(isinstance(v, int) for v in by_topic.values()):
        return {str(k): int(v) for k, v in by_topic.items()}
    return {f"{topic}-{pairs[i]}": int(pairs[i + 1]) for topic, pairs in by_topic.items() for i in range(0, len(pairs), 2)}


def _split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("-")  # topics may contain '-': the partition follows the last
    return topic, int(partition)


def decode_cursor(cursor: str | None) -> dict[str, int]:
    """The ``{key: offset}`` map :func:`encode_cursor` wrote; empty for no cursor. ValueError for anything else."""
    return decode_cursor_maps(cursor).get(REQUESTED, {})


def decode_cursor_maps(cursor: str | None) -> dict[str, dict[str, int]]:
    """Every named map :func:`encode_cursor` wrote (``"requested"`` for the offsets); empty for no
    cursor. ValueError for anything else."""
    if not cursor:
        return {}
    try:
        data = json.loads(cursor)
        version = data.get("v")
        if version not in (1, CURSOR_VERSION):
            raise ValueError(f"cursor version {version!r}, expected {CURSOR_VERSION}")
        if "zlib" not in data:
            if REQUESTED not in data:
                raise KeyError(REQUESTED)
            return {name: {str(k): int(v) for k, v in m.items()} for name, m in data.items() if name != "v"}
        packed = json.loads(zlib.decompress(base64.b64decode(data["zlib"])))
        if version == 1:  # one map, unnamed
            return {REQUESTED: _from_topics(packed)}
        return {name: _from_topics(by_topic) for name, by_topic in packed.items()}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, zlib.error) as e:
        raise ValueError(f"not a kts sensor cursor: {e}") from e


# --- a short cursor naming a state kept in the instance ---------------------------------------------

STATE_CURSOR_VERSION = 3
# States kept per sensor: the newest, and those a cursor not yet committed (a failed tick, or
# `kts sync` moving the cursor beside a tick) may still name.
KEEP_STATES = 4
_STATE_KEY = "kts/sensor_state/{sensor}"


def _digest(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def state_cursor(instance: "dg.DagsterInstance", sensor: str, state: str, previous: str | None = None,
                 **counts: int) -> str:
    """Keep ``state`` in ``instance`` for ``sensor`` and return the short cursor naming it
    (``counts``, e.g. how many partitions, ride along for the person reading the cursor). The
    state ``previous`` names is kept beside it; the same state gives the same cursor."""
    from kts_assets.dagster_internals import read_key_values, write_key_values

    key = _STATE_KEY.format(sensor=sensor)
    digest = _digest(state)
    kept = _kept_states(read_key_values(instance, {key}).get(key))
    if not kept or kept[0][0] != digest:
        named = _named_digest(previous)
        kept = [[digest, state]] + sorted((e for e in kept if e[0] != digest), key=lambda e: e[0] != named)
        write_key_values(instance, {key: json.dumps(kept[:KEEP_STATES], separators=(",", ":"))})
    return json.dumps({"v": STATE_CURSOR_VERSION, "state": digest, **counts}, separators=(",", ":"))


def sensor_state(instance: "dg.DagsterInstance", sensor: str, cursor: str | None) -> str | None:
    """The state ``cursor`` names (None for no cursor). A cursor from before states were kept
    in the instance is its own state, returned as it is. ValueError when the state it names is
    no longer kept (the sensor starts over)."""
    digest = _named_digest(cursor)
    if digest is None:
        return cursor or None
    from kts_assets.dagster_internals import read_key_values

    key = _STATE_KEY.format(sensor=sensor)
    for kept_digest, state in _kept_states(read_key_values(instance, {key}).get(key)):
        if kept_digest == digest:
            return state
    raise ValueError(f"the state {digest} the cursor names is no longer kept in the instance")


def _named_digest(cursor: str | None) -> str | None:
    if not cursor or not cursor.startswith("{"):
        return None
    try:
        data = json.loads(cursor)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("v") == STATE_CURSOR_VERSION and isinstance(data.get("state"), str):
        return data["state"]
    return None


def _kept_states(value: str | None) -> list[list[str]]:
    try:
        kept = json.loads(value) if value else []
    except ValueError:
        return []
    return [e for e in kept if isinstance(e, list) and len(e) == 2] if isinstance(kept, list) else []


def is_state_cursor(cursor: str | None) -> bool:
    """Whether ``cursor`` is a short one naming a state kept in the instance (not an older,
    inline cursor that the next change rewrites)."""
    return _named_digest(cursor) is not None
