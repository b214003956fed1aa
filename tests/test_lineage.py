"""The leader-epoch lineage rules (kts_resources/tiering/lineage.py and, for which lineage is current,
kts_resources/metadata/lineage.py; issue 30 items 2-4): which lineage is the
partition's, where a replica starts copying (Kafka's findHighestRemoteOffset), and which segment
serves each offset — never one that ends before it, never one of another lineage."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kts_resources.kafka.checkpoints import EpochEntry as E
from kts_resources.metadata.lineage import current_lineage
from kts_resources.tiering.lineage import (
    copy_start_offset,
    diverges_at,
    on_lineage,
    readable_spans,
    unused_segments,
)


@dataclass(frozen=True, eq=False)
class Seg:
    start_offset: int
    end_offset: int
    segment_leader_epochs: dict
    segment_size_in_bytes: int = 0
    segment_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def __post_init__(self):
        if not self.segment_size_in_bytes:
            object.__setattr__(self, "segment_size_in_bytes", 10 * (self.end_offset - self.start_offset + 1))


OLD_LEADER = [E(0, 0), E(5, 100)]  # wrote epoch 5 on to offset 150 before an unclean election
NEW_LEADER = [E(0, 0), E(5, 100), E(6, 130)]  # had epoch 5 only up to 129, leads epoch 6 from 130


def test_the_lineage_with_the_newer_epoch_is_the_partitions_and_an_old_leader_never_takes_it_back():
    assert current_lineage(OLD_LEADER, NEW_LEADER) == NEW_LEADER
    assert current_lineage(NEW_LEADER, OLD_LEADER) == NEW_LEADER
    assert current_lineage([], OLD_LEADER) == OLD_LEADER and current_lineage(OLD_LEADER, []) == OLD_LEADER


def test_a_lineage_truncated_at_its_log_start_keeps_the_older_history_recorded():
    truncated = [E(5, 120), E(6, 130)]  # the new leader's checkpoint after its local retention
    assert current_lineage(OLD_LEADER, truncated) == [E(0, 0), E(5, 100), E(6, 130)]
    assert current_lineage([E(0, 0), E(3, 50)], [E(3, 60), E(7, 90)]) == [E(0, 0), E(3, 50), E(7, 90)]


def test_a_replica_behind_the_lineage_diverges_where_the_new_epoch_begins_and_a_lagging_follower_does_not():
    assert diverges_at(OLD_LEADER, NEW_LEADER) == 130
    assert diverges_at(NEW_LEADER, NEW_LEADER) is None
    assert diverges_at([E(0, 0)], NEW_LEADER) == 100  # still in epoch 0 where epoch 5 began: its offsets there differ
    assert diverges_at([E(5, 110)], NEW_LEADER) == 130  # truncated from the start: compared from its first offset


def test_copying_starts_where_kafkas_find_highest_remote_offset_says():
    highest = {5: 150}.get  # the old leader copied epoch 5 up to 150
    # The new leader's epoch 5 ends at 129: it copies from 130, the old leader's 130..150 not being its records.
    assert copy_start_offset(NEW_LEADER, 400, highest) == 130
    assert copy_start_offset(NEW_LEADER, 400, {5: 120}.get) == 121  # less of epoch 5 copied than it has
    assert copy_start_offset(NEW_LEADER, 400, {6: 300, 5: 129}.get) == 301  # the newest epoch with anything remote
    assert copy_start_offset(NEW_LEADER, 400, {}.get) == 0  # nothing of the lineage is remote


def test_a_segment_serves_only_where_its_epochs_agree_with_the_lineage():
    divergent = Seg(100, 150, {5: 100})
    assert on_lineage(divergent, NEW_LEADER) == [(100, 129)]
    assert on_lineage(divergent, OLD_LEADER) == [(100, 150)]
    assert on_lineage(Seg(200, 250, {4: 200}), NEW_LEADER) == []  # an epoch the lineage never had
    assert on_lineage(Seg(0, 99, {0: 0}), [E(5, 100), E(6, 130)]) == [(0, 99)]  # older than the lineage knows
    assert on_lineage(Seg(0, 9, {0: 0}), []) == [(0, 9)]  # no lineage at all: data without epochs


def test_each_offset_is_served_by_one_segment_of_the_lineage_never_one_that_ends_before_it():
    outer = Seg(39705, 43616, {5: 39705})
    inner = Seg(40655, 43337, {5: 40655})  # another replica's roll points: wholly inside
    spans = readable_spans([outer, inner], NEW_LEADER[:2])
    assert [(s.start_offset, s.end_offset, s.segment) for s in spans] == [(39705, 43616, outer)]
    assert unused_segments([outer, inner], spans, NEW_LEADER[:2]) == ([], [inner])


def test_after_an_unclean_election_the_old_leaders_records_are_never_served():
    old = Seg(100, 150, {5: 100})  # the old leader's, divergent from 130
    new = Seg(110, 250, {5: 110, 6: 130})  # the new leader's segment holding 130, copied whole
    gone = Seg(151, 170, {5: 151})  # the old leader's next segment: wholly off the lineage
    spans = readable_spans([old, new, gone], NEW_LEADER)
    assert [(s.start_offset, s.end_offset, s.segment) for s in spans] == [(100, 129, old), (130, 250, new)]
    assert unused_segments([old, new, gone], spans, NEW_LEADER) == ([gone], [])
    # Unique bytes: the old segment weighs only the 30 offsets it serves.
    assert spans[0].size_bytes == old.segment_size_in_bytes * 30 // 51


def test_a_hole_in_the_lineage_is_left_a_hole_and_spans_start_at_the_log_start_offset():
    a, b = Seg(0, 99, {0: 0}), Seg(200, 299, {0: 200})
    assert [(s.start_offset, s.end_offset) for s in readable_spans([a, b], [E(0, 0)])] == [(0, 99), (200, 299)]
    assert [(s.start_offset, s.end_offset) for s in readable_spans([a, b], [E(0, 0)], log_start_offset=250)] == [(250, 299)]
