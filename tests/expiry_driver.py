"""Runs one expiry pass over a partition in its own process, optionally killing itself with SIGKILL
at a chosen step (``python -m tests.expiry_driver LOG_DIR TOPIC NOW_MS [CRASH_AT]``, with
``KTS_DATABASE_URL`` and ``KTS_REMOTE_URI`` set; the log dir is owned). The kill is injected by
wrapping the store's and storage's methods from the outside: the expiry runs unchanged.

Crash points (in the first batch of expired segments):
  after-log-start    the new log start offset recorded, nothing deleted
  after-started      the first batch DELETE_SEGMENT_STARTED, its objects still there
  mid-manifests      some of the batch's manifests deleted, none of their other objects
  mid-objects        every manifest of the batch deleted, some of their other objects
  mid-local          the remote deletions done, a local segment renamed .deleted but not removed
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from kts_resources.tiering import expiry
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.tiering.quotas import ManualClock
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import locate_partitions, topic_id_partition
from .partition_steps import plan_and_expire

CRASH_POINTS = ("after-log-start", "after-started", "mid-objects", "mid-local")


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(crash_at: str, store: RemoteLogMetadataStore, storage) -> None:
    original_start = store.update_log_start_offset
    original_update = store.update_remote_log_segments_delete_state
    original_delete = storage._delete_objects
    original_local = expiry.delete_local_segment

    def update_log_start_offset(tip, offset):
        result = original_start(tip, offset)
        if crash_at == "after-log-start":
            die()
        return result

    def update(segment_ids, new_state, *args, **kwargs):
        result = original_update(segment_ids, new_state, *args, **kwargs)
        if crash_at == "after-started" and new_state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            die()
        return result

    calls = []

    def delete_objects(keys):
        # A batch's first delete is of its manifests, its second of their other objects.
        calls.append(keys)
        if (crash_at, len(calls)) in (("mid-manifests", 1), ("mid-objects", 2)):
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
    storage._delete_objects = delete_objects
    expiry.delete_local_segment = delete_local


def main(argv: list[str]) -> int:
    log_dir, topic, now_ms = Path(argv[0]), argv[1], int(argv[2])
    crash_at = argv[3] if len(argv) > 3 else None
    store = RemoteLogMetadataStore.from_env()
    storage = remote_storage_from_uri(os.environ["KTS_REMOTE_URI"])
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
