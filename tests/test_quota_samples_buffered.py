"""The fetch quota's samples written in batches (kts_resources/tiering/quotas.py, BufferedSamples, as
`kts serve` records them): the recording process counts its own bytes at once, the shared store
(PostgreSQL) gets them within the flush interval in one transaction, a failed write keeps them for
the next, and closing writes what is left."""

from __future__ import annotations

import time

import pytest

from kts_resources.tiering.quotas import (
    BufferedSamples,
    FetchQuotaManager,
    InMemorySamples,
    ManualClock,
    PostgresSamples,
    RLMQuotaManager,
)

from .test_quotas import engine, quota_name, stored_windows  # noqa: F401 — fixtures


def test_a_buffering_process_counts_its_bytes_at_once_and_others_see_them_after_the_flush(engine, quota_name):  # noqa: F811
    clock = ManualClock(100_000)
    fetch = FetchQuotaManager(RLMQuotaManager(1000, window_num=3, clock=clock, samples=PostgresSamples(engine, quota_name)))
    other = RLMQuotaManager(1000, window_num=3, clock=clock, samples=PostgresSamples(engine, quota_name))
    samples = fetch.record_in_batches(interval_ms=60_000)  # no timed flush within the test
    assert fetch.record_in_batches() is samples  # asked again: the same buffer
    fetch.record(600)
    fetch.record(900)
    assert fetch.manager.measure().total_bytes == 1500 and fetch.is_quota_exceeded()
    assert stored_windows(engine, quota_name) == {} and other.measure().total_bytes == 0
    samples.flush()
    assert stored_windows(engine, quota_name) == {100_000: 1500} and other.is_quota_exceeded()
    assert fetch.manager.measure().total_bytes == 1500  # not counted twice
    clock.advance(1000)
    fetch.record(7)
    samples.close()
    assert stored_windows(engine, quota_name) == {100_000: 1500, 101_000: 7}


def test_the_flusher_thread_writes_within_its_interval(engine, quota_name):  # noqa: F811
    samples = BufferedSamples(PostgresSamples(engine, quota_name), interval_ms=20)
    samples.add(5000, 3)
    deadline = time.monotonic() + 10
    while stored_windows(engine, quota_name) != {5000: 3}:
        assert time.monotonic() < deadline, "not written"
        time.sleep(0.01)
    samples.close()


class _Unreachable(InMemorySamples):
    """A shared store that refuses writes while ``down``."""

    down = True

    def exclusive(self):
        if self.down:
            raise ConnectionError("the store is unreachable")
        return super().exclusive()


def test_a_failed_write_keeps_the_bytes_for_the_next_one():
    inner = _Unreachable()
    samples = BufferedSamples(inner, interval_ms=60_000)
    samples.add(1000, 5)
    with pytest.raises(ConnectionError):
        samples.flush()
    samples.add(1000, 2)
    assert samples.live(0, 2000) == (7, 1000)
    inner.down = False
    samples.close()
    assert inner.windows() == {1000: 7} and samples.live(0, 2000) == (7, 1000)
