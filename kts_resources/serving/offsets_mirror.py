"""Consumer groups' committed offsets, mirrored into the remote tier behind the store.

The store is where OffsetCommit writes and OffsetFetch reads; the tier is what `kts recover`
rebuilds a lost store from, so after a group commits, its whole set of committed offsets, read back
from the store, is written over the group's record in the tier (``manifest.put_group_offsets``).

Why behind and not inside the commit: the commit is acknowledged once the store has it (as Kafka
acknowledges once __consumer_offsets has it), and a slow or unreachable tier must not slow every
consumer's commits. One thread writes the groups in the order they committed; a group that commits
again before its record went out is written once, with whatever the store holds by then. Each
record is read from the store after the commits it follows, so the last one written is the
newest. What a crash can lose is the last commits of a second; a failed write is logged and
retried on the group's next commit.
"""

from __future__ import annotations

import logging
import threading
import time

from kts_resources.metadata.group_offsets import GroupOffsets
from kts_resources.remote_storage.base import RemoteStorageManager
from kts_resources.remote_storage.manifest import put_group_offsets

log = logging.getLogger(__name__)


class OffsetsMirror:
    """Writes groups' committed offsets from ``offsets`` (the store) to ``storage`` (the tier)."""

    def __init__(self, offsets: GroupOffsets, storage: RemoteStorageManager) -> None:
        self._offsets, self._storage = offsets, storage
        self._due: dict[str, None] = {}  # groups whose record is behind the store, in commit order
        self._writing: str | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.failed = 0

    def committed(self, group_id: str) -> None:
        """``group_id`` committed: its record is written again soon."""
        with self._changed:
            self._due[group_id] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_due, name="kts-serve-offsets-mirror", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every commit so far is in the tier (or failed); False when ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._due or self._writing is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _write_due(self) -> None:
        while True:
            with self._changed:
                while not self._due:
                    self._changed.wait()
                group_id = next(iter(self._due))
                del self._due[group_id]
                self._writing = group_id
            try:
                committed = self._offsets.committed(group_id)
                put_group_offsets(self._storage, group_id, [
                    (o.topic, o.partition, o.offset, o.leader_epoch, o.metadata) for o in committed.values()])
                self.written += 1
            except Exception as e:  # the store or the tier unreachable: the next commit writes it
                self.failed += 1
                log.warning("consumer group %r: its committed offsets were not written to the remote tier "
                            "(%s); the next commit writes them", group_id, e)
            finally:
                with self._changed:
                    self._writing = None
                    self._changed.notify_all()
