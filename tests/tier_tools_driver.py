"""Runs ``kts restore`` or ``kts scrub`` work in its own process and kills it with SIGKILL after its
Nth remote read or delete (``python -m tests.tier_tools_driver restore|scrub N ...``, with
``KTS_DATABASE_URL`` and ``KTS_REMOTE_URI`` set). The kill is injected by wrapping the tier's
methods from the outside: the restore and the scrub run unchanged.

  restore N TOPIC PARTITION DIR   killed as the Nth ranged read of an object returns
  scrub N                         killed after the Nth delete request (grace 0: every orphan is due)
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.remote_storage.factory import remote_storage_from_uri


def _kill_after(obj, name: str, n: int) -> None:
    original = getattr(obj, name)
    calls = [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] >= n:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(obj, name, wrapped)


def main(argv: list[str]) -> int:
    what, n = argv[0], int(argv[1])
    store = RemoteLogMetadataStore.from_url(os.environ["KTS_DATABASE_URL"], migrate=False)
    storage = remote_storage_from_uri(os.environ["KTS_REMOTE_URI"])
    if what == "restore":
        from kts_resources.maintenance.restore import restore_partition

        _kill_after(storage, "fetch_range", n)
        restore_partition(store, storage, argv[2], int(argv[3]), Path(argv[4]))
    else:
        from kts_resources.maintenance.scrub import scrub

        _kill_after(storage, "delete_objects", n)
        scrub(store, storage, grace_s=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
