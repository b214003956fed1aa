"""What `kts serve` counts, and the small stats file it keeps them in (``KTS_HOME/serve/stats.json``).

The counters live in the server's event loop (every handler runs there, so no lock): requests and
errors per API, the record bytes Fetch served and how many of them came from the remote tier or
the local log, and the throttle time the KIP-956 fetch quota asked clients to wait. ``write_every``
writes them whole and renamed every ``STATS_INTERVAL_S`` while the server runs, and the server
writes them once more when it stops, so `kts serve --status` (and `kts services --json`) read the
counters of the running server, at most a few seconds old, or the last ones of a stopped one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

STATS_FILE = "stats.json"
# Often enough for a watcher, rarely enough that a busy server does not notice the write.
STATS_INTERVAL_S = 2.0


@dataclass
class ServeStats:
    """Requests and errors per API (errors: each error code in an answer, a refused write, a
    connection closed for a request it could not take), bytes served (remote and local of them),
    throttle time."""

    started: float = field(default_factory=time.time)
    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    bytes_served: int = 0
    remote_bytes: int = 0
    throttle_time_ms: int = 0
    # Frames that are no request (wrong size, cut short, garbage): no API to count them under.
    malformed_frames: int = 0

    def request(self, api: str) -> None:
        self.requests[api] = self.requests.get(api, 0) + 1

    def error(self, api: str, n: int = 1) -> None:
        if n:
            self.errors[api] = self.errors.get(api, 0) + n

    def as_json(self, *, running: bool) -> dict:
        return {"running": running, "started": round(self.started, 3), "written": round(time.time(), 3),
                "requests": dict(sorted(self.requests.items())), "errors": dict(sorted(self.errors.items())),
                "bytes_served": self.bytes_served, "remote_bytes": self.remote_bytes,
                "local_bytes": self.bytes_served - self.remote_bytes, "throttle_time_ms": self.throttle_time_ms,
                "malformed_frames": self.malformed_frames}


def stats_path(home: Path) -> Path:
    """The stats file of the server whose state dir is ``home`` (``KTS_HOME/serve``)."""
    return home / STATS_FILE


def write(home: Path, stats: ServeStats, *, running: bool) -> None:
    from kts_resources.servers.lifecycle import write_json

    write_json(stats_path(home), stats.as_json(running=running))


def read(home: Path) -> dict | None:
    """The last counters written under ``home``; None when there are none (never started, or unreadable)."""
    try:
        raw = json.loads(stats_path(home).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


async def write_every(home: Path, stats: ServeStats, interval_s: float = STATS_INTERVAL_S) -> None:
    """Write ``stats`` now and then every ``interval_s`` until cancelled (a failed write is logged
    and retried next time: the counters are for watching, never a reason to stop serving)."""
    while True:
        try:
            write(home, stats, running=True)
        except OSError as e:
            log.warning("cannot write %s: %s", stats_path(home), e)
        await asyncio.sleep(interval_s)
