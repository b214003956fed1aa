"""Remote-tier copy and fetch quotas (KIP-956), with the arithmetic Kafka's RLMQuotaManager uses.

Kafka measures a byte rate over ``window.num`` samples of ``window.size.seconds`` each and compares
it with ``*.max.bytes.per.second``:

* rate = bytes in the live samples / window size, where the window size is SimpleRate's: the time
  elapsed since the oldest live sample started, but at least one sample window (RLMQuotaManager
  registers a ``SimpleRate``, not a plain ``Rate``; ``simple_rate=False`` gives ``Rate``'s rule of at
  least ``window.num - 1`` windows instead);
* the quota is exceeded when rate > quota (``Quota.acceptable`` is ``value <= bound``);
* throttle time = (rate - quota) / quota * window size, rounded half up (``QuotaUtils.throttleTime``),
  which simplifies to ``1000 * bytes / quota - window_ms``: how long until the average falls back to the
  quota if nothing more is recorded.

Copy side: before each segment the copier waits while the quota is exceeded and then records the
segment's bytes (``wait_until_allowed`` + ``record`` after the upload, as KIP-956 words it; or
``acquire``, which checks and records in one atomic step before the upload, as Kafka's RemoteLogManager
actually does under its copy-quota lock). Fetch side: an exceeded quota means the fetch gets no remote
data and says it was throttled; it never waits (``FetchQuotaManager.try_acquire``).

Where kts differs from Kafka, and why: samples are aligned windows ``[k*w, (k+1)*w)`` rather than
windows opened by the first event, so that every concurrent copy process can add to the same sample
with one atomic upsert in PostgreSQL (``PostgresSamples``). A window is live while it is the current
one or one of the ``window_num - 1`` before it ("10 whole windows + 1 current window" for the default
11, as Kafka's documentation puts it). Admission is exact (integer arithmetic, not a rounded throttle
time of 0).

What this guarantees (proved in tests/test_quotas.py): for a copier that checks before and records
after every segment, the bytes recorded in any time interval no longer than ``(window_num - 1)`` windows
are at most ``quota * window_num * window_size`` plus the last segment recorded in that interval. The
reason: every earlier byte of such an interval is still in a live window when the last segment is
admitted, admission requires live bytes <= quota * window size, and the window size is always less
than ``window_num`` windows. With P copiers that record after their uploads the slack is one segment
per copier; with ``acquire`` it stays one segment in all. It is no stronger than that: the live
windows hold at most ``quota * window_num * window_size`` (``window_allowance_bytes``), and a segment
larger than that is forgotten after ``window_num`` windows however long its bytes "should" take at the
quota -- so keep the allowance above the segment size (Kafka behaves the same).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from kts_resources.metadata.models import quota_samples
from kts_resources.metadata.quota_config import DEFAULT_WINDOW_NUM, DEFAULT_WINDOW_SIZE_SECONDS, LONG_MAX, QuotaConfig

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

T = TypeVar("T")
log = logging.getLogger(__name__)

# Kafka's RLM waits on its copy-quota condition for at most this long before checking again, so a
# waiting copier notices other copiers' records and expired windows.
DEFAULT_MAX_WAIT_STEP_MS = 1000

COPY_QUOTA_NAME = "remote.log.manager.copy"
FETCH_QUOTA_NAME = "remote.log.manager.fetch"


# --------------------------------------------------------------------------------------------- clocks


class Clock(Protocol):
    """Milliseconds and sleeping, injectable so tests control time."""

    def now_ms(self) -> int: ...

    def sleep(self, ms: int) -> None: ...


class SystemClock:
    """Wall-clock time: windows are shared by processes (and hosts) through the database, so a
    process-local monotonic clock would not line up."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep(self, ms: int) -> None:
        if ms > 0:
            time.sleep(ms / 1000)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it. Thread-safe."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._lock = threading.Lock()
        self.slept_ms = 0  # total asked of sleep(), for tests

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def sleep(self, ms: int) -> None:
        with self._lock:
            if ms > 0:
                self._now += ms
                self.slept_ms += ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("time does not go backwards")
        with self._lock:
            self._now += ms


# ------------------------------------------------------------------------------------- sample stores


class SampleStore(Protocol):
    """Per-window byte totals, keyed by the window's start in ms.

    ``exclusive()`` yields a view whose operations are atomic with respect to every other
    ``exclusive()`` holder on the same quota (a check-then-record step needs that)."""

    def add(self, window_start_ms: int, value: int) -> None: ...

    def live(self, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        """(sum of bytes, oldest window start) over windows starting in [first_window_ms, now_ms]."""
        ...

    def purge(self, before_ms: int) -> None:
        """Forget windows starting before ``before_ms``."""
        ...

    def exclusive(self) -> contextlib.AbstractContextManager[SampleStore]: ...


class InMemorySamples:
    """Samples for one process (all threads of it)."""

    def __init__(self) -> None:
        self._windows: dict[int, int] = {}
        self._lock = threading.RLock()  # re-entrant: exclusive() holders call add/live

    def add(self, window_start_ms: int, value: int) -> None:
        with self._lock:
            self._windows[window_start_ms] = self._windows.get(window_start_ms, 0) + value

    def live(self, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        with self._lock:
            starts = [s for s in self._windows if first_window_ms <= s <= now_ms]
            return sum(self._windows[s] for s in starts), min(starts, default=None)

    def purge(self, before_ms: int) -> None:
        with self._lock:
            for start in [s for s in self._windows if s < before_ms]:
                del self._windows[start]

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[InMemorySamples]:
        with self._lock:
            yield self

    def windows(self) -> dict[int, int]:
        with self._lock:
            return dict(self._windows)


def _is_disconnect(exc: BaseException) -> bool:
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


class _PgOps:
    """The SQL, run on one connection (autocommitting engine.begin() or a caller's transaction)."""

    def __init__(self, table: sa.Table, quota_name: str) -> None:
        self.table = table
        self.quota_name = quota_name
        t = table.c
        stmt = pg_insert(table)
        # One statement, so concurrent processes adding to one window never lose an update.
        self._upsert = stmt.on_conflict_do_update(
            index_elements=[t.quota, t.window_start_ms],
            set_={"bytes": table.c.bytes + stmt.excluded.bytes},
        )
        self._live = sa.select(sa.func.coalesce(sa.func.sum(t.bytes), 0), sa.func.min(t.window_start_ms)).where(
            t.quota == sa.bindparam("q"),
            t.window_start_ms >= sa.bindparam("first"),
            t.window_start_ms <= sa.bindparam("now"),
        )
        self._purge = sa.delete(table).where(t.quota == sa.bindparam("q"), t.window_start_ms < sa.bindparam("before"))

    def add(self, conn: Connection, window_start_ms: int, value: int) -> None:
        conn.execute(self._upsert, {"quota": self.quota_name, "window_start_ms": window_start_ms, "bytes": value})

    def live(self, conn: Connection, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        total, oldest = conn.execute(self._live, {"q": self.quota_name, "first": first_window_ms, "now": now_ms}).one()
        return int(total), (None if oldest is None else int(oldest))

    def purge(self, conn: Connection, before_ms: int) -> None:
        conn.execute(self._purge, {"q": self.quota_name, "before": before_ms})


class _PgTransactionView:
    """PostgresSamples inside one transaction that holds the quota's advisory lock."""

    def __init__(self, ops: _PgOps, conn: Connection) -> None:
        self._ops = ops
        self._conn = conn

    def add(self, window_start_ms: int, value: int) -> None:
        self._ops.add(self._conn, window_start_ms, value)

    def live(self, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        return self._ops.live(self._conn, first_window_ms, now_ms)

    def purge(self, before_ms: int) -> None:
        self._ops.purge(self._conn, before_ms)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[_PgTransactionView]:
        yield self  # already exclusive


class PostgresSamples:
    """Samples in the metadata store's ``quota_samples`` table (kts_resources.metadata.models), shared by every process using the
    same ``quota_name`` (all of them must use the same window size, or their windows won't line up).

    Single operations are retried (up to RETRIES times) on a dropped connection; a retried add may
    count its bytes twice, which throttles a little more, never less."""

    RETRIES = 2

    def __init__(self, engine: Engine, quota_name: str, *, table: sa.Table | None = None) -> None:
        self.engine = engine
        self.quota_name = quota_name
        self._ops = _PgOps(table if table is not None else quota_samples, quota_name)

    def _run(self, fn: Callable[..., T], *args: int) -> T:
        attempt = 0
        while True:
            try:
                with self.engine.begin() as conn:
                    return fn(conn, *args)
            except DBAPIError as exc:
                attempt += 1
                if not _is_disconnect(exc) or attempt > self.RETRIES:
                    raise

    def add(self, window_start_ms: int, value: int) -> None:
        self._run(self._ops.add, window_start_ms, value)

    def live(self, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        return self._run(self._ops.live, first_window_ms, now_ms)

    def purge(self, before_ms: int) -> None:
        self._run(self._ops.purge, before_ms)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[_PgTransactionView]:
        with self.engine.begin() as conn:
            # Two-key form: its key space is separate from single-bigint locks other kts code may take.
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext('kts.quota'), hashtext(:q))"), {"q": self.quota_name}
            )
            yield _PgTransactionView(self._ops, conn)


class BufferedSamples:
    """A SampleStore that gathers this process's ``add``s in memory and writes them to ``inner`` (the
    shared store) in one transaction every ``interval_ms``, on a thread of its own: for a process
    that records a remote read per fetch (`kts serve`), where a store transaction per fetch cost more
    than the read itself. This process's own reads count at once (``live`` adds what is not written
    yet); other processes see them at most ``interval_ms`` (plus one transaction) later, so the
    quota's bound across processes loosens by what this one reads in that time. A failed write keeps
    its bytes for the next; ``close`` writes what is left."""

    def __init__(self, inner: SampleStore, interval_ms: int = 100) -> None:
        self.inner, self.interval_s = inner, interval_ms / 1000
        self._pending: dict[int, int] = {}
        self._purge_before: int | None = None
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one write at a time, in order
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, window_start_ms: int, value: int) -> None:
        with self._lock:
            self._pending[window_start_ms] = self._pending.get(window_start_ms, 0) + value
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="kts-quota-samples", daemon=True)
                self._thread.start()

    def live(self, first_window_ms: int, now_ms: int) -> tuple[int, int | None]:
        total, oldest = self.inner.live(first_window_ms, now_ms)
        with self._lock:
            mine = [(s, v) for s, v in self._pending.items() if first_window_ms <= s <= now_ms]
        starts = [s for s, _v in mine] + ([] if oldest is None else [oldest])
        return total + sum(v for _s, v in mine), min(starts, default=None)

    def purge(self, before_ms: int) -> None:
        with self._lock:  # done with the next write, in its transaction
            self._purge_before = max(before_ms, self._purge_before or before_ms)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[SampleStore]:
        self.flush()
        with self.inner.exclusive() as view:
            yield view

    def flush(self) -> None:
        """Write what this process recorded since the last write (one transaction)."""
        with self._flushing:
            with self._lock:
                pending, self._pending = self._pending, {}
                purge, self._purge_before = self._purge_before, None
            if not pending and purge is None:
                return
            try:
                with self.inner.exclusive() as view:
                    for start, value in sorted(pending.items()):
                        view.add(start, value)
                    if purge is not None:
                        view.purge(purge)
            except Exception:
                with self._lock:  # written on the next try
                    for start, value in pending.items():
                        self._pending[start] = self._pending.get(start, 0) + value
                raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()
        self.flush()

    def _run(self) -> None:
        failed = False
        while not self._closed:
            self._wake.wait(self.interval_s)
            try:
                self.flush()
                failed = False
            except Exception as e:  # noqa: BLE001 — the bytes stay pending; said once until it works again
                if not failed:
                    log.warning("fetch quota samples not written yet (kept for the next try): %s", e)
                failed = True


# ------------------------------------------------------------------------------------ the rate itself


def _round_half_up(x: Fraction) -> int:
    """Java's Math.round: floor(x + 1/2)."""
    return math.floor(x + Fraction(1, 2))


@dataclass(frozen=True)
class RateReading:
    """One measurement: bytes in the live windows over Kafka's window size."""

    total_bytes: int
    window_ms: int
    elapsed_ms: int = field(default=0, compare=False)  # since the oldest live window started

    @property
    def bytes_per_second(self) -> float:
        return self.total_bytes * 1000 / self.window_ms

    def exceeds(self, quota: int) -> bool:
        # rate > quota, without floating point: total / (window / 1000) > quota
        return self.total_bytes * 1000 > quota * self.window_ms

    def throttle_ms(self, quota: int) -> int:
        """QuotaUtils.throttleTime: (rate - quota) / quota * window, i.e. 1000*bytes/quota - window."""
        if not self.exceeds(quota):
            return 0
        return _round_half_up(Fraction(self.total_bytes * 1000, quota) - self.window_ms)


class SampledRate:
    """Kafka's SimpleRate (or Rate) over a WindowedSum, on aligned windows in a SampleStore."""

    def __init__(
        self,
        samples: SampleStore,
        *,
        window_num: int = DEFAULT_WINDOW_NUM,
        window_size_ms: int = DEFAULT_WINDOW_SIZE_SECONDS * 1000,
        simple: bool = True,
    ) -> None:
        if window_num < 1:
            raise ValueError(f"window_num must be at least 1, got {window_num}")
        if window_size_ms < 1:
            raise ValueError(f"window_size_ms must be at least 1, got {window_size_ms}")
        self.samples = samples
        self.window_num = window_num
        self.window_size_ms = window_size_ms
        self.simple = simple
        self._last_purge_window: int | None = None

    def window_start(self, now_ms: int) -> int:
        return now_ms - now_ms % self.window_size_ms

    def first_live_window(self, now_ms: int) -> int:
        return self.window_start(now_ms) - (self.window_num - 1) * self.window_size_ms

    def record(self, value: int, now_ms: int, store: SampleStore | None = None) -> None:
        store = store if store is not None else self.samples
        window = self.window_start(now_ms)
        store.add(window, value)
        if window != self._last_purge_window:
            # Once per window per process is plenty; keep window_num spare windows so a process whose
            # clock lags a little still finds what it considers live.
            self._last_purge_window = window
            store.purge(self.first_live_window(now_ms) - self.window_num * self.window_size_ms)

    def window_ms(self, oldest_start_ms: int | None, now_ms: int) -> int:
        """Rate.windowSize / SimpleRate.windowSize for the given oldest live sample."""
        elapsed = 0 if oldest_start_ms is None else now_ms - oldest_start_ms
        w = self.window_size_ms
        if self.simple:
            return max(elapsed, w)
        full_windows = elapsed // w
        min_full_windows = self.window_num - 1
        if full_windows < min_full_windows:
            elapsed += (min_full_windows - full_windows) * w
        return max(elapsed, 1)

    def measure(self, now_ms: int, store: SampleStore | None = None) -> RateReading:
        store = store if store is not None else self.samples
        total, oldest = store.live(self.first_live_window(now_ms), now_ms)
        return RateReading(total, self.window_ms(oldest, now_ms), 0 if oldest is None else now_ms - oldest)

    def wait_estimate_ms(self, reading: RateReading, quota: int) -> int:
        """How long to sleep before checking an exceeded quota again. Kafka's throttle time assumes the
        window grows from now on, but SimpleRate's window stays clamped at one window until that much
        time has elapsed; for it the exact wait (no new records, no expiry) is until the elapsed time
        reaches 1000 * bytes / quota. Rate's padded window is never shorter than the elapsed time, so
        Kafka's figure is used there, re-checked as Kafka does. Either way, wake when the oldest live
        window expires: that changes the rate too (a segment too large for the quota is let go then)."""
        wait = reading.throttle_ms(quota)
        if self.simple:
            wait = max(wait, math.ceil(Fraction(reading.total_bytes * 1000, quota)) - reading.elapsed_ms)
        if reading.total_bytes:
            wait = min(wait, self.window_num * self.window_size_ms - reading.elapsed_ms)
        return max(wait, 1)


# ---------------------------------------------------------------------------------- quota managers


@dataclass(frozen=True)
class QuotaMetrics:
    """What one manager has seen, for asset metadata (Kafka: remote-copy/fetch-throttle-time, ...)."""

    quota_bytes_per_second: int | None  # None = unbounded
    bytes_recorded: int  # by this manager
    records: int
    throttle_count: int  # waits (copy) or refused fetches
    throttle_time_ms_total: int  # copy: time actually waited; fetch: throttle times reported
    throttle_time_ms_max: int
    current_rate_bytes_per_second: float  # shared: every process recording to the same samples

    def as_metadata(self) -> dict[str, int | float | None]:
        return {
            "quota_bytes_per_second": self.quota_bytes_per_second,
            "bytes_recorded": self.bytes_recorded,
            "records": self.records,
            "throttle_count": self.throttle_count,
            "throttle_time_ms_total": self.throttle_time_ms_total,
            "throttle_time_ms_max": self.throttle_time_ms_max,
            "current_rate_bytes_per_second": self.current_rate_bytes_per_second,
        }


def _normalise_quota(quota: float | None) -> int | None:
    """None for unbounded (None, inf or Kafka's Long.MAX_VALUE default), else a positive int."""
    if quota is None or quota == math.inf or quota >= LONG_MAX:
        return None
    if isinstance(quota, bool) or quota != int(quota) or quota < 1:
        raise ValueError(f"quota must be a whole number of bytes per second >= 1, got {quota!r}")
    return int(quota)


class RLMQuotaManager:
    """A byte-rate quota as Kafka's RLMQuotaManager keeps it, plus the copy-side waiting loop."""

    def __init__(
        self,
        quota_bytes_per_second: float | None = None,
        *,
        window_num: int = DEFAULT_WINDOW_NUM,
        window_size_seconds: float = DEFAULT_WINDOW_SIZE_SECONDS,
        clock: Clock | None = None,
        samples: SampleStore | None = None,
        simple_rate: bool = True,
        max_wait_step_ms: int = DEFAULT_MAX_WAIT_STEP_MS,
    ) -> None:
        self._quota = _normalise_quota(quota_bytes_per_second)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rate = SampledRate(
            samples if samples is not None else InMemorySamples(),
            window_num=window_num,
            window_size_ms=round(window_size_seconds * 1000),
            simple=simple_rate,
        )
        if max_wait_step_ms < 1:
            raise ValueError("max_wait_step_ms must be at least 1")
        self.max_wait_step_ms = max_wait_step_ms
        self._lock = threading.Lock()  # guards the counters below
        self._bytes = 0
        self._records = 0
        self._throttle_count = 0
        self._throttle_total = 0
        self._throttle_max = 0

    # -- configuration

    @property
    def quota_bytes_per_second(self) -> int | None:
        return self._quota

    @property
    def unbounded(self) -> bool:
        return self._quota is None

    @property
    def window_allowance_bytes(self) -> int | None:
        """quota x window_num x window_size: the most the live windows admit. A segment larger than
        this is forgotten after window_num windows however long its bytes "should" take at the quota
        (Kafka behaves the same), so the quota holds only for segments up to this size."""
        if self._quota is None:
            return None
        return self._quota * self.rate.window_num * self.rate.window_size_ms // 1000

    def update_quota(self, quota_bytes_per_second: float | None) -> None:
        """The quota is dynamic in Kafka (updateCopyQuota / updateFetchQuota); samples are kept."""
        self._quota = _normalise_quota(quota_bytes_per_second)

    # -- measuring

    def measure(self) -> RateReading:
        return self.rate.measure(self.clock.now_ms())

    def is_quota_exceeded(self) -> bool:
        return self._quota is not None and self.measure().exceeds(self._quota)

    def throttle_time_ms(self) -> int:
        """How long until the rate is back within the quota if nothing more is recorded (0 if it is)."""
        if self._quota is None:
            return 0
        return self.measure().throttle_ms(self._quota)

    def current_rate(self) -> float:
        return self.measure().bytes_per_second

    def record(self, value: int) -> None:
        """Count bytes moved (after an upload or a remote read). Recorded even when unbounded, so the
        rate is known if a quota is set later."""
        if value < 0:
            raise ValueError(f"cannot record {value} bytes")
        self.rate.record(value, self.clock.now_ms())
        self._count(value)

    # -- copy side

    def wait_until_allowed(self) -> int:
        """Block while the quota is exceeded; return the milliseconds it cost. Call before each segment
        and ``record`` its bytes after the upload."""
        if self._quota is None:
            return 0
        start = self.clock.now_ms()
        while True:
            reading = self.rate.measure(self.clock.now_ms())
            if not reading.exceeds(self._quota):
                break
            self._sleep_step(reading)
        return self._note_wait(start)

    def acquire(self, value: int) -> int:
        """Wait while the quota is exceeded, then record ``value`` in the same atomic step, before the
        upload (what Kafka's RemoteLogManager does under its copy-quota lock): concurrent copiers then
        cannot all pass the check together. Returns the milliseconds waited."""
        if value < 0:
            raise ValueError(f"cannot record {value} bytes")
        if self._quota is None:
            self.record(value)
            return 0
        start = self.clock.now_ms()
        disconnects = 0
        while True:
            try:
                with self.rate.samples.exclusive() as store:
                    now = self.clock.now_ms()
                    reading = self.rate.measure(now, store)
                    admitted = not reading.exceeds(self._quota)
                    if admitted:
                        self.rate.record(value, now, store)
            except DBAPIError as exc:
                # The transaction rolled back, so nothing was recorded: safe to try again.
                disconnects += 1
                if not _is_disconnect(exc) or disconnects > PostgresSamples.RETRIES:
                    raise
                continue
            if admitted:
                break
            self._sleep_step(reading)
        self._count(value)
        return self._note_wait(start)

    # -- metrics

    def metrics(self) -> QuotaMetrics:
        with self._lock:
            counters = (self._bytes, self._records, self._throttle_count, self._throttle_total, self._throttle_max)
        return QuotaMetrics(self._quota, *counters, current_rate_bytes_per_second=self.current_rate())

    # -- internals

    def _sleep_step(self, reading: RateReading) -> None:
        # The estimate assumes no window expires and nobody else records meanwhile: re-check at least
        # every step, as Kafka's copier does.
        assert self._quota is not None
        self.clock.sleep(min(self.rate.wait_estimate_ms(reading, self._quota), self.max_wait_step_ms))

    def _note_wait(self, start_ms: int) -> int:
        waited = max(self.clock.now_ms() - start_ms, 0)
        if waited:
            self._note_throttle(waited)
        return waited

    def _note_throttle(self, ms: int) -> None:
        with self._lock:
            self._throttle_count += 1
            self._throttle_total += ms
            self._throttle_max = max(self._throttle_max, ms)

    def _count(self, value: int) -> None:
        with self._lock:
            self._bytes += value
            self._records += 1


class FetchQuotaManager:
    """The remote-read quota: an exceeded quota refuses the fetch (no remote data, reported as
    throttled) instead of waiting, as ReplicaManager does; ``record`` the bytes after each remote read
    (0 for a failed one, as RemoteLogReader does)."""

    def __init__(self, manager: RLMQuotaManager) -> None:
        self.manager = manager
        self.last_throttle_time_ms = 0

    def try_acquire(self) -> bool:
        """True: go ahead and read remote data. False: the quota is exceeded; serve no remote data
        for this partition and report ``last_throttle_time_ms``. Never waits."""
        quota = self.manager.quota_bytes_per_second
        if quota is None:
            self.last_throttle_time_ms = 0
            return True
        reading = self.manager.measure()
        if not reading.exceeds(quota):
            self.last_throttle_time_ms = 0
            return True
        self.last_throttle_time_ms = reading.throttle_ms(quota)
        self.manager._note_throttle(self.last_throttle_time_ms)
        return False

    def record(self, value: int) -> None:
        self.manager.record(value)

    def record_in_batches(self, interval_ms: int = 100) -> BufferedSamples:
        """Record into a ``BufferedSamples`` over the shared store from now on (``close`` it when done)."""
        samples = self.manager.rate.samples
        if not isinstance(samples, BufferedSamples):
            samples = self.manager.rate.samples = BufferedSamples(samples, interval_ms)
        return samples

    def throttle_time_ms(self) -> int:
        return self.manager.throttle_time_ms()

    def is_quota_exceeded(self) -> bool:
        return self.manager.is_quota_exceeded()

    def update_quota(self, quota_bytes_per_second: float | None) -> None:
        self.manager.update_quota(quota_bytes_per_second)

    def metrics(self) -> QuotaMetrics:
        return self.manager.metrics()


def _samples(engine: Engine | None, quota_name: str) -> SampleStore:
    return PostgresSamples(engine, quota_name) if engine is not None else InMemorySamples()


def copy_quota_manager(
    config: QuotaConfig,
    engine: Engine | None = None,
    *,
    clock: Clock | None = None,
    quota_name: str = COPY_QUOTA_NAME,
) -> RLMQuotaManager:
    """The copy quota; with an engine, shared by every process using the same metadata store."""
    return RLMQuotaManager(
        config.copy_max_bytes_per_second,
        window_num=config.copy_window_num,
        window_size_seconds=config.copy_window_size_seconds,
        clock=clock,
        samples=_samples(engine, quota_name),
    )


def fetch_quota_manager(
    config: QuotaConfig,
    engine: Engine | None = None,
    *,
    clock: Clock | None = None,
    quota_name: str = FETCH_QUOTA_NAME,
) -> FetchQuotaManager:
    """The fetch quota; with an engine, shared by every process using the same metadata store."""
    return FetchQuotaManager(
        RLMQuotaManager(
            config.fetch_max_bytes_per_second,
            window_num=config.fetch_window_num,
            window_size_seconds=config.fetch_window_size_seconds,
            clock=clock,
            samples=_samples(engine, quota_name),
        )
    )
