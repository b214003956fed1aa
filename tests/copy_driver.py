"""Runs one copy pass in its own process, optionally killing itself with SIGKILL at a chosen step.

The crash-safety tests start it as a subprocess (``python -m tests.copy_driver LOG_DIR [CRASH_AT]``)
with ``KTS_DATABASE_URL`` and ``KTS_REMOTE_URI`` (and ``KTS_S3_ENDPOINT_URL``) set. The kill is
injected by wrapping the store's and storage's methods from the outside: the copier runs unchanged.

Crash points (each on the second eligible segment, so one segment is already finished):
  after-started   COPY_SEGMENT_STARTED recorded, nothing uploaded
  mid-upload      the .log uploaded, killed while uploading the .index
  after-upload    every object uploaded, killed before COPY_SEGMENT_FINISHED
  mid-delete      the upload fails, killed half-way through deleting its objects
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from kts_resources.kafka.logdir import LogDir
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.base import RemoteStorageError
from kts_resources.remote_storage.factory import remote_storage_from_uri
from .partition_steps import copy_each_partition

CRASH_POINTS = ("after-started", "mid-upload", "after-upload", "mid-delete")


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(crash_at: str, store: RemoteLogMetadataStore, storage) -> None:
    adds = {"n": 0}
    original_add = store.add_remote_log_segment_metadata
    original_update = store.update_remote_log_segment_metadata
    original_copy = storage.copy_log_segment_data
    original_put = storage._put_object
    original_delete = storage._delete_objects

    def add(md):
        original_add(md)
        adds["n"] += 1
        if crash_at == "after-started" and adds["n"] == 2:
            die()

    def update(segment_id, new_state, *args, **kwargs):
        if crash_at == "after-upload" and adds["n"] == 2 and new_state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
            die()
        return original_update(segment_id, new_state, *args, **kwargs)

    def put(key, source):
        if crash_at == "mid-upload" and adds["n"] == 2 and key.endswith(".index"):
            # Read half of the index into the upload, then die with it in flight.
            buffer = bytearray(max(1, source.size // 2))
            source.readinto(memoryview(buffer))
            die()
        return original_put(key, source)

    def copy(md, data):
        custom = original_copy(md, data)
        if crash_at == "mid-delete" and adds["n"] == 2:
            raise RemoteStorageError("injected failure after upload")
        return custom

    def delete(keys):
        if crash_at == "mid-delete" and adds["n"] == 2 and len(keys) > 1:
            original_delete(keys[: len(keys) // 2])
            die()
        return original_delete(keys)

    store.add_remote_log_segment_metadata = add
    store.update_remote_log_segment_metadata = update
    storage._put_object = put
    storage.copy_log_segment_data = copy
    storage._delete_objects = delete


def main(argv: list[str]) -> int:
    log_dir = LogDir(Path(argv[0]))
    crash_at = argv[1] if len(argv) > 1 else None
    store = RemoteLogMetadataStore.from_env()
    storage = remote_storage_from_uri()
    if crash_at is not None:
        if crash_at not in CRASH_POINTS:
            raise SystemExit(f"unknown crash point {crash_at!r}")
        arm(crash_at, store, storage)
    # One partition at a time: the crash points count calls, and the test asserts the one state
    # the crash left (side by side, other partitions would be mid-way too).
    results = copy_each_partition(log_dir, store, storage)
    print(json.dumps({str(r.topic_partition): [md.start_offset for md in r.copied] for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
