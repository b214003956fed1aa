"""Which leader-epoch lineage is a partition's current one: the rule by which the metadata store
keeps the newest lineage any replica's kts saw (what the tier makes of it: ``tiering.lineage``).

One leader writes each epoch and epochs only grow, so of two lineages the one whose newest epoch
is higher is the newer leader's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kts_resources.kafka.checkpoints import EpochEntry


def current_lineage(recorded: Sequence[EpochEntry], own: Sequence[EpochEntry]) -> list[EpochEntry]:
    """The partition's lineage, from the one the store ``recorded`` and a replica's ``own``: the
    one whose newest epoch is higher (on a tie, the same leader's: either), with the other's
    history below its first offset (a lineage truncated at its log start offset keeps none)."""
    if not own or not recorded:
        return list(own or recorded)
    newer, older = (own, recorded) if own[-1].epoch > recorded[-1].epoch else (recorded, own)
    first = newer[0]
    head = [e for e in older if e.start_offset < first.start_offset and e.epoch <= first.epoch]
    if head and head[-1].epoch == first.epoch:
        return [*head, *newer[1:]]  # the epoch began earlier than the truncated lineage shows
    return [*head, *newer]
