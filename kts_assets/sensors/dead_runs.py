"""The dead-run sensor: a run whose process died (SIGKILL, OOM, reboot) is failed and its pool slots
freed within a minute, so sensor- and schedule-started runs never queue behind it forever."""

from __future__ import annotations

import dagster as dg

from kts_assets.run_hygiene import release_dead_runs


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Fails runs of this host whose process is gone (killed, out of memory, rebooted) and "
                       "frees the pool slots they or finished runs still hold, so later runs never wait forever.")
def dead_run_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    released = release_dead_runs(context.instance)
    for line in released:
        context.log.warning(line)
    return dg.SkipReason("; ".join(released) if released else
                         "looked at this host's unfinished runs and the runs holding pool slots: every unfinished run's "
                         "process is alive and no finished run holds a slot, so nothing to release")
