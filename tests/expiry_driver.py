"""Runs one expiry pass over a partition in its own process, optionally killing itself with SIGKILL
at a chosen step (``python -m tests.expiry_driver LOG_DIR TOPIC NOW_MS [CRASH_AT]``, with
``KTS_DATABASE_URL`` and ``KTS_REMOTE_URI`` set; the log dir is owned). The kill is injected by
wrapping the store's and storage's methods from the outside: the expiry runs unchanged.

Batches of one segment, so that two expired segments make two batches, the second's bookkeeping
overlapping the first's deletes as in a pass over thousands. Crash points:
  after-log-start         the new log start offset recorded, nothing deleted
  after-started           the first batch DELETE_SEGMENT_STARTED, its objects still there
  mid-manifests           some of the first batch's manifests deleted, none of their other objects
  mid-objects             every manifest of the first batch deleted, some of their other objects
  after-second-started    the second batch DELETE_SEGMENT_STARTED, the first's objects going or gone, not FINISHED
  after-first-finished    the first batch DELETE_SEGMENT_FINISHED, the second's objects going
  mid-second-objects      the second batch's manifests deleted, some of its other objects
  mid-local               the remote deletions done, a local segment renamed .deleted but not removed
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from kts_resources.tiering import copier, expiry
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.tiering.quotas import ManualClock
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import locate_partitions, topic_id_partition
from .partition_steps import plan_and_expire

CRASH_POINTS = ("after-log-start", "after-started", "mid-objects", "after-second-started", "after-first-finished",
                "mid-second-objects", "mid-local")


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(crash_at: str, store: RemoteLogMetadataStore, storage) -> None:
    original_start = store.update_log_start_offset
    original_update = store.update_remote_log_segments_delete_state
    original_finish = store.finish_segment_deletes
    original_delete = storage._delete_objects
    original_local = expiry.delete_local_segment

    def update_log_start_offset(tip, offset):
        result = original_start(tip, offset)
        if crash_at == "after-log-start":
            die()
        return result

    started = []

    def update(segment_ids, new_state, *args, **kwargs):
        result = original_update(segment_ids, new_state, *args, **kwargs)
        if new_state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            started.append(segment_ids)
            if (crash_at, len(started)) in (("after-started", 1), ("after-second-started", 2)):
                die()
        return result

    def finish(*args, **kwargs):
        original_finish(*args, **kwargs)
        if crash_at == "after-first-finished":
            die()

    calls = []

    def delete_objects(keys):
        # A batch's first delete is of its manifests, its second of their other objects.
        calls.append(keys)
        if (crash_at, len(calls)) in (("mid-manifests", 1), ("mid-objects", 2), ("mid-second-objects", 4)):
            original_delete(keys[: len(keys) // 2])
            die()
        return original_delete(keys)

    def delete_local(partition, segment):
        if crash_at == "mid-local":
            os.replace(segment.log, segment.log.with_name(segment.log.name + expiry.DELETED_SUFFIX))
            die()
        return original_local(partition, segment)

    store.update_log_start_offset = update_log_start_offset
    store.update_remote_log_segments_delete_state = update
    store.finish_segment_deletes = finish
    storage._delete_objects = delete_objects
    expiry.delete_local_segment = delete_local


def main(argv: list[str]) -> int:
    log_dir, topic, now_ms = Path(argv[0]), argv[1], int(argv[2])
    crash_at = argv[3] if len(argv) > 3 else None
    store = RemoteLogMetadataStore.from_env()
    storage = remote_storage_from_uri(os.environ["KTS_REMOTE_URI"])
    copier.DELETE_BATCH_SEGMENTS = 1
    if crash_at:
        arm(crash_at, store, storage)
    key = f"{topic}-0"
    located, _ = locate_partitions([log_dir], [key], owned_log_dirs=[log_dir])
    loc = located[key]
    result = plan_and_expire(loc, topic_id_partition(loc.partition, store), store, storage, clock=ManualClock(now_ms))
    print(f"deleted remote {result.remote_deleted} local {result.local_deleted}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
