"""Local segment indexes that need rebuilding: a closed segment's ``.index`` or ``.timeindex``
missing (a segment from before Kafka 0.10.1 has no time index: KIP-33's migration case) or not a
whole number of entries (a torn write). Only stat() calls: the index-rebuild sensor asks it of many
segments every tick. Rebuilding is Kafka's own recovery (``indexes.rebuild_segment_indexes``, the
LogSegment.recover rule), and only in log dirs kts owns: a broker's live files are never written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kts_resources.kafka.indexes import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE
from kts_resources.kafka.logdir import SegmentFiles


def index_problems(segment: SegmentFiles) -> list[str]:
    """What is wrong with a closed segment's two index files (nothing is checked of the active one:
    the broker preallocates and trims its indexes as it writes)."""
    if segment.next_base_offset is None:
        return []
    problems = []
    for path, entry_size, what in ((segment.offset_index, OFFSET_ENTRY_SIZE, "offset index"),
                                   (segment.time_index, TIME_ENTRY_SIZE, "time index")):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{path}: the {what} is missing")
            continue
        except OSError as e:  # a symbolic link loop in its place: rebuilt like a missing one
            problems.append(f"{path}: the {what} cannot be read ({(e.strerror or str(e)).lower()})")
            continue
        if size % entry_size:
            problems.append(f"{path}: {size} bytes is not a whole number of {entry_size}-byte {what} entries")
    return problems


def segments_to_reindex(segments: Sequence[SegmentFiles]) -> list[tuple[SegmentFiles, list[str]]]:
    """The closed segments whose indexes need rebuilding, with why."""
    return [(s, found) for s in segments if (found := index_problems(s))]


def repair_hint(segment_log: Path | str, owned: bool) -> str:
    """How a segment's missing or torn indexes get repaired, said where they are reported (the
    ``local_indexes_whole`` check, the index-rebuild sensor): in an owned log dir kts rebuilds them
    itself; in a broker's, it never writes, and says so."""
    if owned:
        return "kts rebuilds them (index_rebuild_job, requested by the index_rebuild sensor): the log dir is in KTS_OWNED_LOG_DIRS"
    return (f"kts does not write broker-owned log dirs: repair with `kts index rebuild {segment_log}` while the broker "
            f"is stopped, or list the log dir in KTS_OWNED_LOG_DIRS if kts may edit it")
