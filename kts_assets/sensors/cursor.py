"""A sensor's cursor: ``{partition key: offset}`` as versioned JSON, packed and zlib-compressed
once it grows large. The roll sensor keeps the newest base offset it requested per partition;
sensors that follow other offsets per partition (retention, index rebuild) keep theirs the same way.

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
CURSOR_VERSION = 1


def encode_cursor(offsets: Mapping[str, int]) -> str:
    """``{key: offset}`` as compact JSON; packed and zlib-compressed once it grows large.

    Packed, each topic is named once and followed by its ``partition, offset`` pairs: 10,000
    partitions with random 9-digit offsets take ~84 KB, about a third of the plain map.
    """
    plain = json.dumps({"v": CURSOR_VERSION, "requested": dict(sorted(offsets.items()))}, separators=(",", ":"))
    if len(plain) <= CURSOR_COMPRESS_ABOVE:
        return plain
    by_topic: dict[str, list[int]] = {}
    for key, offset in sorted(offsets.items(), key=lambda kv: _split_key(kv[0])):
        topic, partition = _split_key(key)
        by_topic.setdefault(topic, []).extend((partition, offset))
    packed = json.dumps(by_topic, separators=(",", ":")).encode()
    return json.dumps({"v": CURSOR_VERSION, "zlib": base64.b64encode(zlib.compress(packed, 9)).decode("ascii")},
                      separators=(",", ":"))


def _split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("-")  # topics may contain '-': the partition follows the last
    return topic, int(partition)


def decode_cursor(cursor: str | None) -> dict[str, int]:
    """The map :func:`encode_cursor` wrote; empty for no cursor. ValueError for anything else."""
    if not cursor:
        return {}
    try:
        data = json.loads(cursor)
        if data.get("v") != CURSOR_VERSION:
            raise ValueError(f"cursor version {data.get('v')!r}, expected {CURSOR_VERSION}")
        if "zlib" not in data:
            return {str(k): int(v) for k, v in data["requested"].items()}
        by_topic = json.loads(zlib.decompress(base64.b64decode(data["zlib"])))
        return {f"{topic}-{pairs[i]}": int(pairs[i + 1]) for topic, pairs in by_topic.items() for i in range(0, len(pairs), 2)}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, zlib.error) as e:
        raise ValueError(f"not a kts sensor cursor: {e}") from e
