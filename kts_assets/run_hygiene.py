"""Runs that die must not block the runs after them.

A run carries the host, pid and start time of the process executing it, in one tag (``kts/process``,
``<host>:<pid>:<start>``; one tag, since every tag is a chip on the run's row in the UI): ``kts
sync`` sets it when it launches a run in-process, and a daemon-launched run worker tags itself when
its first step starts (``record_run_worker``). ``release_dead_runs`` — called by every ``kts sync``
and by the dead-run sensor — finds unfinished runs of this host whose process is gone (SIGKILL, OOM,
reboot), marks them failed and frees the pool slots they held. (Dagster's run monitoring frees the
slots of runs that ended, and its code server fails a run whose worker died while the server lived;
but the default run launcher has no worker health check, so a run orphaned by a reboot would stay
STARTED with its slot forever.) While a step waits on a pool slot, ``SlotWaitReporter`` says which
run holds it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator

import dagster as dg

# "<host>:<pid>:<start>": the process's start time tells a live pid from a recycled one.
PROCESS_TAG = "kts/process"
TRIGGER_TAG = "kts/trigger"

_UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
               dg.DagsterRunStatus.CANCELING]


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on, or [] when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return []
    # The command name (field 2) may hold spaces and parentheses; fields after its last ")" are plain.
    return stat.rsplit(")", 1)[-1].split()


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or ""."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def _is_zombie(pid: int) -> bool:
    """A killed process nobody has reaped (its parent died too) still answers kill(pid, 0)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in ("Z", "X")


def launch_tags(trigger: str = "kts sync") -> dict[str, str]:
    """Tags that let a later process tell whether this one is still alive."""
    pid = os.getpid()
    return {TRIGGER_TAG: trigger, PROCESS_TAG: f"{socket.gethostname()}:{pid}:{_process_start(pid)}"}


def _run_process(tags: dict[str, str]) -> tuple[str, int, str] | None:
    """(host, pid, start time) of the process a run's ``kts/process`` tag names, or None."""
    host, _, rest = tags.get(PROCESS_TAG, "").partition(":")
    pid, _, start = rest.partition(":")
    return (host, int(pid), start) if host and pid.isdigit() else None


def _process_gone(pid: int, recorded_start: str) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, under another account
    if _is_zombie(pid):
        return True
    return bool(recorded_start) and _process_start(pid) not in ("", recorded_start)


def record_run_worker(context: dg.AssetExecutionContext) -> None:
    """Tag a run with the process executing it, unless its launcher did (``kts sync``): a run the
    daemon launched then carries its run worker's host, pid and start time too, so
    ``release_dead_runs`` (the dead-run sensor) can tell when that worker is gone — Dagster's
    default run launcher has no health check, so after a reboot nothing else would fail the run."""
    run = context.run
    if PROCESS_TAG not in run.tags:
        context.instance.add_run_tags(run.run_id, launch_tags(run.tags.get(TRIGGER_TAG, "run worker")))


def release_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed every unfinished run of this host whose process is gone (an in-process ``kts
    sync``, or a run worker the daemon launched), and free the pool slots of every finished run that
    still holds one. Returns one line per run released."""
    lines = []
    host = socket.gethostname()
    # Unfinished runs are few: each one's tag is read here rather than matched by the query.
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=_UNFINISHED)):
        process = _run_process(run.tags)
        if process is None or process[0] != host or not _process_gone(process[1], process[2]):
            continue
        pid = process[1]
        message = f"the kts process (pid {pid} on {host}) that ran it is gone"
        instance.report_run_failed(run, message=f"run {run.run_id}: {message}; marked failed by kts's dead-run check")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        lines.append(f"run {run.run_id} ({run.job_name}) died with its process (pid {pid}): "
                     f"marked failed and its pool slots freed")
    for run_id in instance.event_log_storage.get_concurrency_run_ids():
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
            lines.append(f"run {run_id} ended but still held pool slots: freed")
    return lines


def stop_run(instance: dg.DagsterInstance, run_id: str, why: str) -> None:
    """Mark our own run canceled and free its slots: the process is about to exit under a signal."""
    run = instance.get_run_by_id(run_id)
    if run is not None and not run.is_finished:
        instance.report_run_canceled(run, message=why)
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def slot_waits(instance: dg.DagsterInstance, run_id: str) -> Iterator[tuple[str, list[str]]]:
    """(pool, runs holding its slots) for each pool ``run_id`` has a step waiting on."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    for pool in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(pool)
        if any(step.run_id == run_id and step.assigned_timestamp is None for step in info.pending_steps):
            yield pool, sorted({slot.run_id for slot in info.claimed_slots if slot.run_id != run_id})


class SlotWaitReporter:
    """While a run waits on a pool slot, ``say`` a line every ``interval_s`` naming who holds it."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str, say: Callable[[str], None], interval_s: float = 10.0):
        self._instance, self._run_id, self._say, self._interval = instance, run_id, say, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kts-slot-wait", daemon=True)

    def __enter__(self) -> "SlotWaitReporter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        # One look per interval, the first after a short grace: each look is several instance
        # queries, and a run that never waits (the usual case) should not pay them every second.
        wait_s = min(2.0, self._interval)
        while not self._stop.wait(wait_s):
            wait_s = self._interval
            try:
                waits = list(slot_waits(self._instance, self._run_id))
            except Exception:  # noqa: BLE001 - a report, never a reason to fail the pass
                continue
            for pool, holders in waits:
                held = f"held by run {', '.join(holders)}" if holders else "(no run holds it yet)"
                self._say(f"waiting for a free `{pool}` slot {held}")
