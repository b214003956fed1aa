"""The data-loss rule: which offsets of a partition are in neither tier although kts should have
copied them, and recording them in the metadata store so the alarm persists until acknowledged.

Every offset from where kts's watch begins up to the local log start offset (Lx) must be in a
COPY_SEGMENT_FINISHED remote segment; any that is not was deleted locally (by the broker's own
retention, which knows nothing of the remote tier, or by a faulty clean-up) before it was copied.
The watch begins at the lower of the first local log start offset kts observed for the partition
(``partitions.first_observed_offset``, recorded by the first copy pass) and the remote log start
offset, raised to the log start offset kts recorded in the store (DeleteRecords, remote
retention, the broker's log start at kts's first look): data below either was gone, or deleted on purpose, before kts had to copy it.

The broker's log-start-offset-checkpoint is no such floor: its size and time retention advance it
too, and that is exactly the loss to catch.

Plain values and the store in, no Dagster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from kts_resources.kafka.logdir import SegmentFiles
from kts_resources.tiering.lineage import readable_spans
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition

if TYPE_CHECKING:
    from kts_resources.metadata.store import LostOffsetRange, RemoteLogMetadataStore

Range = tuple[int, int]  # first and last offset, inclusive


def uncovered(start: int, end: int, covered: Iterable[Range]) -> list[Range]:
    """The parts of ``start``..``end`` (inclusive) that no range of ``covered`` holds, ascending."""
    holes: list[Range] = []
    at = start
    for first, last in sorted(covered):
        if last < at:
            continue
        if first > end:
            break
        if first > at:
            holes.append((at, first - 1))
        at = max(at, last + 1)
        if at > end:
            return holes
    if at <= end:
        holes.append((at, end))
    return holes


def lost_offset_ranges(
    *,
    remote: Iterable[Range],
    local_log_start_offset: int,
    first_observed_offset: int | None,
    recorded_log_start_offset: int = 0,
    known_lost: Iterable[Range] = (),
    held_locally: Iterable[Range] | None = None,
) -> list[Range]:
    """The ranges below the local log start offset that are in no finished remote segment
    (``remote``) and not already recorded as lost (``known_lost``, acknowledged or not): new loss.

    A local log with no segments (−1) bounds nothing, so only holes between remote segments count.
    Nothing is lost before kts has observed the partition or copied any of it.

    ``held_locally``: the ranges the local segments hold (see :func:`local_holdings`). Given, a
    hole between remote segments above the local log start offset that no local segment holds is
    lost too: a segment that vanished from the middle of the local log before it was copied.
    """
    remote = list(remote)
    starts = [offset for offset in (first_observed_offset, min((r[0] for r in remote), default=None)) if offset is not None]
    if not starts:
        return []
    start = max(min(starts), recorded_log_start_offset)
    remote_end = max((r[1] for r in remote), default=-1)
    end = local_log_start_offset - 1 if local_log_start_offset >= 0 else remote_end
    if held_locally is not None:
        end = max(end, remote_end)
    if end < start:
        return []
    return uncovered(start, end, [*remote, *known_lost, *(held_locally or ())])


def local_holdings(segments: Sequence[SegmentFiles], remote: Iterable[Range]) -> list[Range]:
    """The offsets the local ``segments`` hold, as far as kts knows: a segment copied (a remote
    range starting at its base offset) up to its copy's end, its last batch; any other from its
    base offset to the next file's base offset - 1 (the active one without end)."""
    copied_ends = {first: last for first, last in remote}
    held = []
    for s in segments:
        if s.base_offset in copied_ends:
            held.append((s.base_offset, copied_ends[s.base_offset]))
        else:
            held.append((s.base_offset, s.next_base_offset - 1 if s.next_base_offset is not None else _NO_END))
    return held


_NO_END = 2**63 - 1


def detect_lost_ranges(store: "RemoteLogMetadataStore", tip: TopicIdPartition, segments: Sequence[SegmentFiles],
                       *, how_found: str) -> list[Range]:
    """Apply the rule to the partition's local ``segments`` (listed by the caller, before the
    remote tier is read) and record what is newly lost; returns the ranges recorded.

    Call it holding the partition lock: a copy finishing, or kts deleting a copied local segment,
    between the two reads would otherwise look like loss, and a recorded range stays until a
    person acknowledges it.
    """
    finished = store.list_remote_log_segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})
    state = store.partition_state(tip)
    # What the tier holds is what a reader can read there: the partition's lineage's offsets.
    remote = [(span.start_offset, span.end_offset) for span in readable_spans(finished, list(state.lineage))]
    found = lost_offset_ranges(
        remote=remote,
        local_log_start_offset=segments[0].base_offset if segments else -1,
        first_observed_offset=store.first_observed_offset(tip),
        recorded_log_start_offset=state.log_start_offset,
        known_lost=[(r.start_offset, r.end_offset) for r in store.lost_ranges(tip, include_acknowledged=True)],
        held_locally=local_holdings(segments, remote),
    )
    return [r for r in found if store.record_lost_range(tip, r[0], r[1], how_found)]


# A lost range's one cause, however it is reported (the copy pass's log, the data-loss check,
# `kts sync`, `kts status`): kts sees only that the files are gone, never who removed them (the
# broker's retention, a clean-up, a person), so it names no one.
LOST_CAUSE = "were deleted from the local log before they were copied to the remote tier"


def describe(lost: "LostOffsetRange") -> str:
    """One line for an open lost range: what, since when, and how to acknowledge it."""
    tp = lost.tip.topic_partition
    return (f"offsets {lost.start_offset}..{lost.end_offset} {LOST_CAUSE} "
            f"(found by the {lost.how_found} at {lost.detected_at:%Y-%m-%d %H:%M:%S %Z}); once accepted: "
            f"kts ack-loss {tp.topic} {tp.partition} --range {lost.start_offset}..{lost.end_offset}")
