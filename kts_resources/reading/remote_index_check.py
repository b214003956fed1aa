"""Is a partition's remote log index whole? The rule the asset check and the index-rebuild sensor
share: every COPY_SEGMENT_FINISHED segment covered exactly once — its entries' byte ranges
contiguous from byte 0 to the segment's size, their offsets within the segment's — and every
file set valid (entry CRCs, both indexes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kts_resources.reading import remote_index as ri
from kts_resources.remote_log import RemoteLogSegmentMetadata


def check_partition_index(directory: Path, finished: Sequence[RemoteLogSegmentMetadata]) -> tuple[list[str], int]:
    """(problems, entries of finished segments found) for the index files in ``directory``."""
    problems: list[str] = []
    by_segment: dict = {}
    for base in ri.file_set_offsets(directory):
        try:
            fs = ri.load_file_set(directory, base)
        except ri.RemoteIndexFormatError as e:
            problems.append(str(e))
            continue
        for _position, entry in fs.entries:
            by_segment.setdefault(entry.segment_id, []).append(entry)
    entries = 0
    for md in sorted(finished, key=lambda m: m.start_offset):
        found = by_segment.get(md.segment_id.id, [])
        entries += len(found)
        problems += segment_coverage_problems(md, found)
    return problems, entries


def segment_coverage_problems(md: RemoteLogSegmentMetadata, found: Sequence[ri.RemoteLogIndexEntry]) -> list[str]:
    """Why ``found`` (the entries of segment ``md``, in any order) do not cover it exactly once:
    byte ranges contiguous from 0 to its size, offsets within its own; [] when they do."""
    where = f"segment {md.start_offset}..{md.end_offset} ({md.segment_id.id})"
    if not found:
        return [f"{where}: not in the remote log index"]
    problems: list[str] = []
    found = sorted(found, key=lambda e: (e.first_offset, e.rdi.position))
    if any(e.segment_id != md.segment_id.id for e in found):
        problems.append(f"{where}: entries of another segment among its own")
    # A segment's first batch may start after its base offset (records removed by compaction
    # or a transaction marker's gap): the bytes, not the offsets, must be covered from 0.
    if found[0].first_offset < md.start_offset or found[-1].last_offset > md.end_offset:
        problems.append(f"{where}: its entries cover offsets {found[0].first_offset}..{found[-1].last_offset}, "
                        f"outside the segment")
    position = 0
    for a in found:
        if a.rdi.position != position:
            problems.append(f"{where}: the entry at offset {a.first_offset} starts at byte {a.rdi.position}, "
                            f"expected {position} (a gap or an overlap)")
            break
        position += a.data_length
    for a, b in zip(found, found[1:]):
        if b.first_offset <= a.last_offset:
            problems.append(f"{where}: entries at offsets {a.first_offset} and {b.first_offset} overlap (covered twice)")
            break
    if position != md.segment_size_in_bytes and not problems:
        problems.append(f"{where}: entries cover {position} bytes of {md.segment_size_in_bytes}")
    return problems
