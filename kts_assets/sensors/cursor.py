"""The roll sensor's cursor: named ``{partition key: int}`` maps — the newest base offset it
requested per partition (``requested``) and the copy lag it last reported — as versioned JSON,
packed and zlib-compressed once it grows large. ``kts sync`` moves it too
(``sensors.roll.advance_roll_cursor``).

The other sensors keep small cursors of their own, which are not maps over every partition: the
retention sensor an event-log position and the partitions whose retention.ms falls due, the
index-rebuild sensor its place in the round of partitions; discovery and dead runs keep none.

No Dagster here: the codec is plain data, tested and benchmarked on its own.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Mapping

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
    packed = json.dumps({name: _by_topic(m) for name, m in maps.items()}, separators=(",", ":")).encode()
    return json.dumps({"v": CURSOR_VERSION, "zlib": base64.b64encode(zlib.compress(packed, 9)).decode("ascii")},
                      separators=(",", ":"))


def _by_topic(values: Mapping[str, int]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for key, value in sorted(values.items(), key=lambda kv: _split_key(kv[0])):
        topic, partition = _split_key(key)
        by_topic.setdefault(topic, []).extend((partition, value))
    return by_topic


def _from_topics(by_topic: Mapping[str, list[int]]) -> dict[str, int]:
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
