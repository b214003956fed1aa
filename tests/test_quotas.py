"""Copy and fetch quotas (KIP-956) in kts_resources.tiering.quotas (their settings: kts_resources.metadata.quota_config), checked against Kafka's arithmetic.

Kafka's rule (RLMQuotaManager with a SimpleRate, QuotaUtils.throttleTime): rate = bytes in the live
samples / window size, window size = time since the oldest live sample started but at least one
sample window; throttle time = (rate - quota) / quota * window size, rounded half up.

The property the copy side is held to, with N = window_num, w = window size, Q = quota:

    for every time interval I no longer than (N - 1) * w,
        bytes recorded in I  <=  Q * N * w  +  the last segment recorded in I.

Why (N - 1) windows: a sample is live while it is the current window or one of the N - 1 before it,
so the live windows reach back between N - 1 and N windows; (N - 1) whole windows is the longest span
that is still entirely live when its last segment is checked. Every earlier byte of I is then counted
in that check, and the check admits only while live bytes <= Q * window size < Q * N * w. Hence one
"quota window" of allowance (Q * N * w) plus the one segment admitted last. With P copiers that record
after their upload, each may have one admitted segment not yet recorded: the slack is P segments. With
``acquire`` (check and record in one atomic step, as Kafka's RemoteLogManager does) it stays one.

The bound is tight (a test attains it to within 2 bytes), and it does not extend to spans of N
windows: there two segments larger than Q * N * w fit, each forgotten N windows after its window
began however long its bytes "should" take at the quota (tests show both). Kafka's rule has the
same limits; keep Q * N * w above the segment size.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.metadata.models import quota_samples
from kts_resources.metadata.quota_config import (
    COPY_MAX_BYTES_PER_SECOND,
    COPY_QUOTA_WINDOW_NUM,
    COPY_QUOTA_WINDOW_SIZE_SECONDS,
    FETCH_MAX_BYTES_PER_SECOND,
    FETCH_QUOTA_WINDOW_NUM,
    FETCH_QUOTA_WINDOW_SIZE_SECONDS,
    LONG_MAX,
    QuotaConfig,
    QuotaConfigError,
)
from kts_resources.tiering.quotas import (
    FetchQuotaManager,
    InMemorySamples,
    ManualClock,
    PostgresSamples,
    RateReading,
    RLMQuotaManager,
    SystemClock,
    copy_quota_manager,
    fetch_quota_manager,
)

Records = list[tuple[int, int]]  # (time recorded in ms, bytes), in the order they were recorded


# ------------------------------------------------------------------------------------------ helpers


def log_records(manager: RLMQuotaManager, log: Records) -> None:
    """Note the exact time and size of everything the manager records (record() and acquire())."""
    inner = manager.rate.record

    def record(value: int, now_ms: int, store=None) -> None:  # type: ignore[no-untyped-def]
        inner(value, now_ms, store)
        log.append((now_ms, value))

    manager.rate.record = record  # type: ignore[method-assign]


def worst_excess(records: Records, span_ms: int, allowance: float, slack_segments: int | None = None) -> float:
    """max over intervals I of length span_ms of bytes(I) - allowance - slack, where the slack is the
    last segment recorded in I, or (with slack_segments=P) the P largest segments in I. Intervals may
    be taken to start at a record: the records of any interval are a prefix of those of the interval
    starting at its first record."""
    order = sorted(range(len(records)), key=lambda i: (records[i][0], i))
    worst = -math.inf
    for a, j in enumerate(order):
        total = 0
        sizes: list[int] = []
        for k in order[a:]:
            t, size = records[k]
            if t >= records[j][0] + span_ms:
                break
            total += size
            sizes.append(size)
            slack = size if slack_segments is None else sum(sorted(sizes)[-slack_segments:])
            worst = max(worst, total - allowance - slack)
    return worst


def allowance_bytes(quota: int, window_num: int, window_ms: int) -> float:
    return quota * window_num * window_ms / 1000


quota_params = st.fixed_dictionaries(
    {
        "quota": st.integers(1, 1_000_000),
        "window_num": st.integers(1, 12),
        "window_ms": st.sampled_from([1, 7, 100, 1000]),
        "simple": st.booleans(),
    }
)


def manager_for(p: dict, clock: ManualClock, samples=None) -> RLMQuotaManager:  # type: ignore[no-untyped-def]
    return RLMQuotaManager(
        p["quota"],
        window_num=p["window_num"],
        window_size_seconds=p["window_ms"] / 1000,
        clock=clock,
        samples=samples,
        simple_rate=p["simple"],
    )


def segment_sizes(p: dict) -> st.SearchStrategy[int]:
    # Around and beyond one quota window's allowance, where the rule is most strained.
    allowance = int(allowance_bytes(p["quota"], p["window_num"], p["window_ms"])) + 1
    one_window = int(allowance_bytes(p["quota"], 1, p["window_ms"])) + 1
    return st.one_of(
        st.integers(0, 3),
        st.integers(0, allowance),
        st.integers(max(allowance - one_window, 0), allowance + one_window),
        st.integers(0, 3 * allowance),
    )


def times(p: dict) -> st.SearchStrategy[int]:
    # Often to just before, at or after a window boundary (from an aligned start), where a window's
    # start and its last millisecond are furthest apart.
    w = p["window_ms"]
    span = p["window_num"] * w
    near_boundary = st.builds(lambda k, d: max(k * w + d, 0), st.integers(0, p["window_num"] + 1), st.integers(-1, 1))
    return st.one_of(st.just(0), st.integers(0, 2), near_boundary, st.integers(0, 3 * span))


# ----------------------------------------------------------------------------------------- clocks


def test_manual_clock_moves_only_when_slept_or_advanced() -> None:
    clock = ManualClock(5)
    assert clock.now_ms() == clock.now_ms() == 5
    clock.sleep(10)
    clock.advance(3)
    assert clock.now_ms() == 18 and clock.slept_ms == 10
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_system_clock_reads_wall_milliseconds() -> None:
    import time

    assert abs(SystemClock().now_ms() - time.time() * 1000) < 1000


# ------------------------------------------------------------------------- Kafka's rate arithmetic


def test_throttle_time_matches_kafkas_rlm_quota_manager_test() -> None:
    # RLMQuotaManagerTest.testQuotaExceeded: quota 50 B/s, 11 x 1 s, 500 bytes recorded at 0.
    clock = ManualClock(0)
    quota = RLMQuotaManager(50, window_num=11, window_size_seconds=1, clock=clock)
    assert quota.throttle_time_ms() == 0
    quota.record(500)
    clock.advance(1000)
    assert quota.throttle_time_ms() == 9000  # 500 B/s over 1 s: (500-50)/50 * 1000
    clock.advance(8000)
    assert quota.throttle_time_ms() == 1000  # 500/9 B/s over 9 s: 10000 - 9000
    clock.advance(1000)
    assert quota.throttle_time_ms() == 0 and not quota.is_quota_exceeded()  # exactly 50 B/s is allowed
    clock.advance(1000)
    assert quota.current_rate() == 0  # the 0 s window has left the 11 live ones


def test_simple_rate_window_is_time_since_oldest_live_window_but_at_least_one_window() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, window_num=11, window_size_seconds=1, clock=clock)
    quota.record(100)
    clock.advance(250)
    assert quota.measure() == RateReading(100, 1000)
    clock.advance(2250)
    assert quota.measure() == RateReading(100, 2500)
    assert quota.current_rate() == 40


def test_kafka_rate_window_counts_at_least_window_num_minus_one_windows() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, window_num=11, window_size_seconds=1, clock=clock, simple_rate=False)
    quota.record(100)
    clock.advance(250)
    assert quota.measure() == RateReading(100, 250 + 10 * 1000)  # 0 full windows: add 10
    clock.advance(10_250)
    assert quota.measure() == RateReading(100, 10_500)  # 10 full windows: elapsed as is
    empty = RLMQuotaManager(1000, window_num=1, clock=ManualClock(0), simple_rate=False)
    assert empty.measure() == RateReading(0, 1)  # never a zero window


def test_throttle_time_over_several_windows_is_hand_computed() -> None:
    # quota 100 B/s, 3 x 1 s: 150 bytes at 0 ms and at 1500 ms.
    clock = ManualClock(0)
    quota = RLMQuotaManager(100, window_num=3, window_size_seconds=1, clock=clock)
    quota.record(150)
    clock.advance(1500)
    quota.record(150)
    clock.advance(500)  # 2000: windows 0, 1000, 2000 live; 300 bytes over 2 s = 150 B/s
    assert quota.throttle_time_ms() == 1000  # 1000 * 300 / 100 - 2000
    clock.advance(400)
    assert quota.throttle_time_ms() == 600
    clock.advance(600)  # 3000: window 0 expired; 150 bytes since 1000 = 75 B/s
    assert quota.measure() == RateReading(150, 2000) and quota.throttle_time_ms() == 0


def test_throttle_time_rounds_half_up_like_java_math_round() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(2000, window_num=2, clock=clock)
    quota.record(2001)  # 1000 * 2001 / 2000 - 1000 = 0.5
    assert quota.throttle_time_ms() == 1


def test_an_excess_that_rounds_to_zero_throttle_time_still_waits_until_within_the_quota() -> None:
    # Kafka would let this copy go (throttle time 0); kts admits only at rate <= quota exactly. And
    # the window stays one window long until 1000 ms have elapsed, so that is how long it takes.
    clock = ManualClock(0)
    quota = RLMQuotaManager(5000, window_num=2, clock=clock)
    quota.record(5002)  # excess worth 0.4 ms
    assert quota.is_quota_exceeded() and quota.throttle_time_ms() == 0
    assert quota.wait_until_allowed() == 1001
    assert not quota.is_quota_exceeded()


def test_waiting_sleeps_until_the_window_has_grown_enough_not_in_small_steps() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(100, window_num=11, clock=clock)
    quota.record(500)  # at 0: Kafka's throttle time is 5000 - 1000, the real wait 5000
    assert quota.throttle_time_ms() == 4000
    assert quota.wait_until_allowed() == 5000
    assert clock.slept_ms == 5000


def test_a_window_is_live_for_window_num_windows_from_its_start() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(1, window_num=3, window_size_seconds=1, clock=clock)
    quota.record(7)
    clock.advance(2999)
    assert quota.measure().total_bytes == 7
    clock.advance(1)
    assert quota.measure().total_bytes == 0


def test_quota_update_applies_to_bytes_already_recorded() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(50, clock=clock)
    quota.record(51)
    assert quota.is_quota_exceeded()
    quota.update_quota(60)
    assert not quota.is_quota_exceeded()
    quota.update_quota(None)
    assert quota.unbounded and quota.throttle_time_ms() == 0


# ---------------------------------------------------------------------------------------- copy side


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(0, 2**40), max_size=30), unbounded=st.sampled_from([None, math.inf, LONG_MAX]))
def test_an_unbounded_quota_never_waits(sizes: list[int], unbounded: float | None) -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(unbounded, clock=clock)
    for size in sizes:
        assert quota.wait_until_allowed() == 0
        quota.record(size)
        assert quota.acquire(size) == 0
    assert clock.now_ms() == 0
    assert quota.metrics().bytes_recorded == 2 * sum(sizes)
    assert RLMQuotaManager(clock=clock).unbounded  # the default, as Kafka's Long.MAX_VALUE


def test_wait_until_allowed_sleeps_the_throttle_time_and_returns_it() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(50, window_num=11, clock=clock)
    quota.record(500)
    clock.advance(1000)
    assert quota.wait_until_allowed() == 9000
    assert clock.now_ms() == 10_000 and clock.slept_ms == 9000
    assert quota.wait_until_allowed() == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), p=quota_params)
def test_a_copy_loop_moves_at_most_one_quota_window_plus_one_segment_in_any_n_minus_1_windows(
    data: st.DataObject, p: dict
) -> None:
    """Check before each segment, upload (time passes), record after: the bound of the docstring."""
    clock = ManualClock(data.draw(st.sampled_from([0, 10**6 + 1])))  # aligned to every window size, or not
    quota = manager_for(p, clock)
    log: Records = []
    log_records(quota, log)
    for size in data.draw(st.lists(segment_sizes(p), max_size=30)):
        clock.advance(data.draw(times(p)))  # idle before the segment
        waited = quota.wait_until_allowed()
        assert not quota.is_quota_exceeded()
        assert waited >= 0
        clock.advance(data.draw(times(p)))  # the upload
        quota.record(size)
    span = (p["window_num"] - 1) * p["window_ms"]
    assert worst_excess(log, span, allowance_bytes(p["quota"], p["window_num"], p["window_ms"])) <= 0
    assert quota.metrics().bytes_recorded == sum(size for _, size in log)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), p=quota_params, copiers=st.integers(2, 4), atomic=st.booleans())
def test_concurrent_copiers_sharing_samples_exceed_it_by_one_segment_each_or_one_with_acquire(
    data: st.DataObject, p: dict, copiers: int, atomic: bool
) -> None:
    """Copiers interleave arbitrarily (each step: time passes, one copier moves on). Recording after
    the upload lets each have one admitted segment in flight; acquire() records at admission."""
    clock = ManualClock(0)
    shared = InMemorySamples()
    managers = [manager_for(p, clock, shared) for _ in range(copiers)]
    log: Records = []
    for manager in managers:
        log_records(manager, log)
    todo = [data.draw(st.lists(segment_sizes(p), max_size=8)) for _ in range(copiers)]
    in_flight: list[int | None] = [None] * copiers
    while active := [i for i in range(copiers) if todo[i] or in_flight[i] is not None]:
        i = data.draw(st.sampled_from(active))
        clock.advance(data.draw(times(p)))
        if in_flight[i] is None:  # check (and with acquire, record), then start the upload
            size = todo[i].pop(0)
            if atomic:
                managers[i].acquire(size)
            else:
                managers[i].wait_until_allowed()
            in_flight[i] = size
        else:  # the upload finished
            if not atomic:
                managers[i].record(in_flight[i])  # type: ignore[arg-type]
            in_flight[i] = None
    span = (p["window_num"] - 1) * p["window_ms"]
    allowance = allowance_bytes(p["quota"], p["window_num"], p["window_ms"])
    assert worst_excess(log, span, allowance, slack_segments=None if atomic else copiers) <= 0


def test_the_bound_is_attained_within_two_bytes() -> None:
    # 1000 B/s over 11 x 1 s: allowance 11000. A segment at the end of a window is counted from the
    # window's start, so the next may follow just under 10 s later.
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, window_num=11, window_size_seconds=1, clock=clock)
    log: Records = []
    log_records(quota, log)
    clock.advance(10_999)
    assert quota.wait_until_allowed() == 0
    quota.record(10_998)
    assert quota.wait_until_allowed() == 9999  # admitted at 20998: 10998 bytes over 10.998 s
    quota.record(50_000)
    assert log == [(10_999, 10_998), (20_998, 50_000)]
    assert worst_excess(log, 10 * 1000, 11_000) == -2


def test_a_segment_larger_than_the_window_allowance_is_forgotten_after_window_num_windows() -> None:
    # Kafka's rule too: the throttle time says 999 s, but the samples expire after 11 s.
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, window_num=11, window_size_seconds=1, clock=clock)
    assert quota.window_allowance_bytes == 11_000
    quota.record(1_000_000)
    assert quota.throttle_time_ms() == 999_000
    assert quota.wait_until_allowed() == 11_000  # re-checked at least every second


def test_over_window_num_windows_two_segments_can_exceed_the_allowance_plus_the_larger_one() -> None:
    # Why the property speaks of N - 1 windows: a segment recorded at the end of a window leaves the
    # live windows N windows after that window's start, so the next one may follow 1 window + 1 ms
    # short of N windows later.
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, window_num=11, window_size_seconds=1, clock=clock)
    log: Records = []
    log_records(quota, log)
    clock.advance(999)
    quota.wait_until_allowed()
    quota.record(50_000)
    assert quota.wait_until_allowed() == 10_001
    quota.record(50_000)
    assert log == [(999, 50_000), (11_000, 50_000)]
    assert worst_excess(log, 11 * 1000, 11_000, slack_segments=1) == 50_000 - 11_000
    assert worst_excess(log, 10 * 1000, 11_000) <= 0


def test_acquire_records_at_admission() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(50, window_num=11, clock=clock)
    assert quota.acquire(500) == 0
    clock.advance(1000)
    assert quota.acquire(10) == 9000
    assert quota.measure() == RateReading(510, 10_000)


def test_metrics_report_bytes_throttle_time_and_current_rate() -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(100, window_num=2, clock=clock)
    quota.record(300)
    quota.wait_until_allowed()  # 1000 * 300 / 100 - 1000 = 2000 ms; window 0 expires at 2000
    quota.record(50)
    m = quota.metrics()
    assert (m.bytes_recorded, m.records, m.throttle_count, m.throttle_time_ms_total, m.throttle_time_ms_max) == (
        350,
        2,
        1,
        2000,
        2000,
    )
    assert m.current_rate_bytes_per_second == 50.0  # 50 bytes in window 2000, at least one window
    assert m.as_metadata()["throttle_time_ms_total"] == 2000
    assert m.as_metadata()["quota_bytes_per_second"] == 100


# --------------------------------------------------------------------------------------- fetch side


def test_fetch_quota_refuses_without_waiting_and_reports_the_throttle_time() -> None:
    clock = ManualClock(0)
    fetch = FetchQuotaManager(RLMQuotaManager(50, window_num=11, clock=clock))
    assert fetch.try_acquire()
    fetch.record(500)  # after the remote read
    clock.advance(1000)
    assert not fetch.try_acquire()
    assert clock.now_ms() == 1000 and fetch.last_throttle_time_ms == 9000
    clock.advance(8000)
    assert not fetch.try_acquire() and fetch.last_throttle_time_ms == 1000
    clock.advance(1000)
    assert fetch.try_acquire() and fetch.last_throttle_time_ms == 0
    m = fetch.metrics()
    assert (m.throttle_count, m.throttle_time_ms_total, m.bytes_recorded) == (2, 10_000, 500)


def test_an_unbounded_fetch_quota_always_admits() -> None:
    fetch = FetchQuotaManager(RLMQuotaManager(None, clock=ManualClock(0)))
    fetch.record(2**50)
    assert fetch.try_acquire() and fetch.throttle_time_ms() == 0


# ------------------------------------------------------------------------------------ configuration


def test_quota_config_defaults_are_kafkas() -> None:
    config = QuotaConfig.from_properties({"unrelated.key": "x"})
    assert config == QuotaConfig(LONG_MAX, 11, 1, LONG_MAX, 11, 1)
    assert copy_quota_manager(config).unbounded and fetch_quota_manager(config).manager.unbounded


def test_quota_config_reads_numbers_and_decimal_strings() -> None:
    props = {
        COPY_MAX_BYTES_PER_SECOND: " 1048576 ",
        COPY_QUOTA_WINDOW_NUM: 61,
        COPY_QUOTA_WINDOW_SIZE_SECONDS: "2",
        FETCH_MAX_BYTES_PER_SECOND: 5000,
        FETCH_QUOTA_WINDOW_NUM: "5",
        FETCH_QUOTA_WINDOW_SIZE_SECONDS: 3,
    }
    config = QuotaConfig.from_properties(props)
    assert config == QuotaConfig(1_048_576, 61, 2, 5000, 5, 3)
    assert QuotaConfig.from_properties(config.to_properties()) == config
    clock = ManualClock(0)
    copy = copy_quota_manager(config, clock=clock)
    assert (copy.quota_bytes_per_second, copy.rate.window_num, copy.rate.window_size_ms) == (1_048_576, 61, 2000)
    fetch = fetch_quota_manager(config, clock=clock)
    assert (fetch.manager.quota_bytes_per_second, fetch.manager.rate.window_num) == (5000, 5)
    assert fetch.manager.rate.window_size_ms == 3000 and fetch.manager.clock is clock


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (COPY_MAX_BYTES_PER_SECOND, 0),
        (COPY_MAX_BYTES_PER_SECOND, -1),
        (COPY_MAX_BYTES_PER_SECOND, "ten"),
        (COPY_MAX_BYTES_PER_SECOND, 1.5),
        (COPY_MAX_BYTES_PER_SECOND, True),
        (COPY_MAX_BYTES_PER_SECOND, 2**63),
        (COPY_QUOTA_WINDOW_NUM, 0),
        (COPY_QUOTA_WINDOW_NUM, 2**31),
        (COPY_QUOTA_WINDOW_SIZE_SECONDS, "0"),
        (FETCH_MAX_BYTES_PER_SECOND, None),
        (FETCH_QUOTA_WINDOW_NUM, "1.0"),
        (FETCH_QUOTA_WINDOW_SIZE_SECONDS, -5),
    ],
)
def test_quota_config_rejects_what_kafkas_config_def_rejects(key: str, value: object) -> None:
    with pytest.raises(QuotaConfigError, match=key.replace(".", r"\.")):
        QuotaConfig.from_properties({key: value})


def test_a_manager_rejects_a_quota_below_one_byte_per_second() -> None:
    for bad in (0, -1, 0.5):
        with pytest.raises(ValueError):
            RLMQuotaManager(bad)


# -------------------------------------------------------------------------- PostgreSQL-shared samples


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    """A fresh, migrated metadata-store database (tests/fixtures_postgres.py) with quota_samples."""
    engine = sa.create_engine(pg_url, pool_size=10)
    yield engine
    engine.dispose()


_names = iter(range(10**9))


@pytest.fixture
def quota_name() -> str:
    return f"test-{os.getpid()}-{next(_names)}"


def stored_windows(engine: sa.Engine, quota_name: str) -> dict[int, int]:
    table = quota_samples
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.window_start_ms, table.c.bytes).where(table.c.quota == quota_name))
        return {int(start): int(size) for start, size in rows}


def test_postgres_samples_add_concurrently_without_losing_an_update(engine: sa.Engine, quota_name: str) -> None:
    def add_many() -> None:
        samples = PostgresSamples(engine, quota_name)
        for _ in range(40):
            samples.add(5000, 3)

    threads = [threading.Thread(target=add_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stored_windows(engine, quota_name) == {5000: 8 * 40 * 3}


def test_postgres_samples_read_live_windows_and_purge_old_ones(engine: sa.Engine, quota_name: str) -> None:
    clock = ManualClock(100_000)
    quota = RLMQuotaManager(1000, window_num=3, clock=clock, samples=PostgresSamples(engine, quota_name))
    quota.record(10)  # window 100000
    clock.advance(1500)
    quota.record(20)  # window 101000
    assert quota.measure() == RateReading(30, 1500)
    clock.advance(1500)  # 103000: window 100000 left the live three
    assert quota.measure() == RateReading(20, 2000)
    assert set(stored_windows(engine, quota_name)) == {100_000, 101_000}
    clock.advance(10_000)
    quota.record(1)  # the first record in a new window purges those long gone
    assert stored_windows(engine, quota_name) == {113_000: 1}


def test_postgres_samples_retry_when_the_server_drops_their_connection(
    pg_url: str, engine: sa.Engine, quota_name: str
) -> None:
    clock = ManualClock(0)
    quota = RLMQuotaManager(1000, clock=clock, samples=PostgresSamples(engine, quota_name))
    quota.record(5)  # leaves a pooled connection behind
    killer = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    with killer.connect() as conn:
        killed = conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar()
    killer.dispose()
    assert killed >= 1
    quota.record(7)  # the dead pooled connection fails once, the retry succeeds
    assert quota.acquire(1) == 0
    assert stored_windows(engine, quota_name) == {0: 13}


def test_postgres_exclusive_sections_on_one_quota_run_one_at_a_time(engine: sa.Engine, quota_name: str) -> None:
    import time

    events: list[str] = []
    seen: list[tuple[int, int | None]] = []
    first_inside = threading.Event()

    def hold() -> None:
        with PostgresSamples(engine, quota_name).exclusive() as store:
            events.append("first in")
            first_inside.set()
            time.sleep(0.3)
            store.add(0, 1)
            events.append("first out")

    def follow() -> None:
        first_inside.wait()
        with PostgresSamples(engine, quota_name).exclusive() as store:
            events.append("second in")
            seen.append(store.live(0, 0))

    threads = [threading.Thread(target=hold), threading.Thread(target=follow)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert events == ["first in", "first out", "second in"]
    assert seen == [(1, 0)]  # the second sees what the first committed
    with PostgresSamples(engine, quota_name + "-other").exclusive():  # another quota: no waiting
        pass


@pytest.mark.parametrize("atomic", [True, False], ids=["acquire", "check-then-record"])
def test_two_managers_sharing_postgres_samples_keep_their_combined_rate_within_the_quota(
    engine: sa.Engine, quota_name: str, atomic: bool
) -> None:
    """Two threads, each its own manager and PostgresSamples, one ManualClock."""
    p = {"quota": 10_000, "window_num": 4, "window_ms": 1000, "simple": True}
    clock = ManualClock(1_000_000)
    log: Records = []
    sizes = [[3000, 9000, 500, 7000, 12_000, 2500, 4000, 100], [8000, 1000, 6000, 6000, 300, 15_000, 2000, 5000]]

    def copier(i: int) -> None:
        manager = manager_for(p, clock, PostgresSamples(engine, quota_name))
        log_records(manager, log)
        for size in sizes[i]:
            if atomic:
                manager.acquire(size)
                clock.sleep(37)  # the upload
            else:
                manager.wait_until_allowed()
                clock.sleep(37)
                manager.record(size)

    threads = [threading.Thread(target=copier, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(size for _, size in log) == sorted(sizes[0] + sizes[1])
    allowance = allowance_bytes(p["quota"], p["window_num"], p["window_ms"])
    assert worst_excess(log, 3 * 1000, allowance, slack_segments=None if atomic else 2) <= 0
    assert clock.now_ms() - 1_000_000 > 16 * 37  # the quota made them wait, not just the uploads


def _copy_in_another_process(url: str, quota_name: str, sizes: list[int], start_at_ms: int) -> tuple[Records, int]:
    """One copy process: real clock, acquire() before each 'upload' of 20 ms."""
    engine = sa.create_engine(url)
    clock = SystemClock()
    manager = RLMQuotaManager(
        100_000,
        window_num=3,
        window_size_seconds=0.2,
        clock=clock,
        samples=PostgresSamples(engine, quota_name),
        max_wait_step_ms=50,
    )
    log: Records = []
    log_records(manager, log)
    clock.sleep(start_at_ms - clock.now_ms())  # start together
    for size in sizes:
        manager.acquire(size)
        clock.sleep(20)
    engine.dispose()
    return log, manager.metrics().throttle_time_ms_total


def test_two_processes_sharing_postgres_samples_keep_their_combined_rate_within_the_quota(
    pg_url: str, engine: sa.Engine, quota_name: str
) -> None:
    # 100 kB/s over 3 x 200 ms: allowance 60 kB; 2 x 10 segments of 10 kB take about 1.5 s.
    sizes = [10_000] * 10
    start_at = SystemClock().now_ms() + 1500  # after both interpreters have started
    # Not multiprocessing.Pool: its terminate() can miss a worker its maintenance thread respawns
    # and wait for it forever (CI17 hung here until pytest's timeout); this executor raises instead.
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_copy_in_another_process, pg_url, quota_name, sizes, start_at) for _ in range(2)]
        results = [future.result(timeout=120) for future in futures]
    log = [record for records, _ in results for record in records]
    assert len(log) == 20
    assert worst_excess(log, 2 * 200, allowance_bytes(100_000, 3, 200)) <= 0
    assert sum(throttled for _, throttled in results) > 0
