"""The dead-run sensor's idle tick says what it looked at and why it released nothing (the runs it
does release: tests/test_run_hygiene.py)."""

from __future__ import annotations

import dagster as dg

from kts_assets.sensors import dead_run_sensor


def test_with_no_dead_run_the_skip_reason_says_what_was_looked_at():
    with dg.instance_for_test() as instance:
        result = dead_run_sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
    assert result.run_requests == []
    assert result.skip_message == ("looked at this host's unfinished runs and the runs holding pool slots: every unfinished "
                                   "run's process is alive and no finished run holds a slot, so nothing to release")
