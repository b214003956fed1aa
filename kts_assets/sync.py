"""One ``kts sync`` pass (:func:`run_pass`): ``copy_job`` in-process over every partition, the roll
sensor's cursor moved for what it copied, the remote data of topics gone from every log dir deleted,
and what it ended as with the tiers' totals after it. The CLI prints it; the CLI server runs it
through the CLI.

Each run executes in a worker thread, so that the main thread keeps the signal handlers (Dagster
replaces SIGINT/SIGTERM handlers only on the main thread, and there it defers them to step
boundaries, which a Spark step or a wait on a pool slot never reaches). On SIGINT/SIGTERM the run
is marked canceled and its pool slots freed, and the process exits at once: partition locks go
with its database sessions, and unfinished copies stay COPY_SEGMENT_STARTED for the next pass's
repair, exactly as after a crash.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Dagster is imported by the pass, not by the signal handling set up before it
    import dagster as dg

    from kts_assets.batching import KeyRangeBatch
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.remote_storage.base import RemoteStorageManager


class SyncInterrupted(BaseException):
    """SIGINT or SIGTERM arrived; the exit status is 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum


def _raise_interrupted(signum, _frame) -> None:
    raise SyncInterrupted(signum)


def install_stop_handlers() -> None:
    """SIGINT and SIGTERM raise SyncInterrupted in the main thread."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)


@dataclass
class PassOutcome:
    """What the runs of a pass did: copies per partition and each failed partition's causes."""

    copied_segments: int = 0
    copied_bytes: int = 0
    recopied_segments: int = 0  # damaged remote segments replaced by a new copy
    failed: dict[str, list[str]] = field(default_factory=dict)  # partition key → one-line causes
    failed_runs: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # every run of the pass, failed or not

    def fail(self, key: str, cause: str) -> None:
        causes = self.failed.setdefault(key, [])
        if cause not in causes:
            causes.append(cause)


def run_batch(job: dg.JobDefinition, instance: dg.DagsterInstance, batch: KeyRangeBatch, run_config: Mapping,
              outcome: PassOutcome, say: Callable[[str], None]) -> None:
    """One run over ``batch``'s key range, in a worker thread; its failures into ``outcome``."""
    from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
    from kts_assets.run_hygiene import SlotWaitReporter, launch_tags, stop_run
    run_id = str(uuid.uuid4())  # known before the run starts: to cancel it, to watch its slot waits
    box: dict[str, object] = {}

    def execute() -> None:
        try:
            box["result"] = job.execute_in_process(
                instance=instance,
                run_id=run_id,
                tags={PARTITION_RANGE_START_TAG: batch.start, PARTITION_RANGE_END_TAG: batch.end, **launch_tags()},
                raise_on_error=False,
                run_config=dict(run_config),
            )
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e

    worker = threading.Thread(target=execute, name="kts-sync-run")
    try:
        with SlotWaitReporter(instance, run_id, say), _event_log_failures_to_debug():
            worker.start()
            while worker.is_alive():
                worker.join(timeout=0.2)  # short waits: signals are handled between them
    except SyncInterrupted as stop:
        stop_run(instance, run_id, f"kts sync stopped by {stop}")
        raise
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    _collect(box["result"], batch, outcome)


_EVENT_LOG_FAILURE = "Exception while writing logger call to event log:"


class _EventLogFailureFilter:
    """sys.stderr, less Dagster's raw report of a log call its event log could not store (the
    SQL, parameters and all). It comes when the database went away mid-run, and kts says that
    itself in one line; the report goes to the debug log instead of the terminal."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        if text.startswith(_EVENT_LOG_FAILURE):
            import logging

            logging.getLogger(__name__).debug("%s", text.rstrip())
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _event_log_failures_to_debug():
    saved = sys.stderr
    sys.stderr = _EventLogFailureFilter(saved)
    try:
        yield
    finally:
        sys.stderr = saved


def _collect(result, batch: KeyRangeBatch, outcome: PassOutcome) -> None:
    from kts_assets.assets import local_and_remote_segments, remote_segments
    from kts_assets.partition_outcome import FAILED_PARTITIONS, PartitionsFailed, one_line

    copy_step = local_and_remote_segments.node_def.name

    outcome.run_ids.append(result.run_id)
    for event in result.asset_materializations_for_node(copy_step):
        if event.asset_key == remote_segments.key and event.partition in batch.keys:
            for name in ("copied_segments", "copied_bytes", "recopied_segments"):
                value = event.metadata.get(name)
                if value is not None:
                    setattr(outcome, name, getattr(outcome, name) + int(value.value))
    for event in result.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        if data.error is not None and data.error.cls_name == PartitionsFailed.__name__:
            continue  # the run's end for its failed checks: their evaluations below name the partitions and why
        metadata = data.user_failure_data.metadata if data.user_failure_data is not None else {}
        per_partition = metadata.get(FAILED_PARTITIONS)
        if per_partition is not None:
            for key, cause in per_partition.value.items():
                if key in batch.keys:
                    outcome.fail(key, f"{event.step_key}: {cause}")
            continue
        # A step that failed as a whole fails every partition it covered.
        cause = one_line(data.user_failure_data.description if data.user_failure_data and data.user_failure_data.description
                            else step_error_message(data.error))
        for key in batch.keys:
            outcome.fail(key, f"{event.step_key}: {cause}")
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed and evaluation.partition in batch.keys:
            outcome.fail(evaluation.partition, f"check {evaluation.check_name} failed: {one_line(evaluation.description or '')}")
    if not result.success:
        outcome.failed_runs.append(result.run_id)
        if not any(key in outcome.failed for key in batch.keys):
            for key in batch.keys:
                outcome.fail(key, f"run {result.run_id} failed")


# Dagster's wrappers of the error a step raised: what went wrong is their cause.
_WRAPPERS = ("RetryRequested", "DagsterExecutionStepExecutionError", "DagsterUserCodeExecutionError")
_OS_ERROR = re.compile(r"^\w*Error: \[Errno \d+\] (?P<what>[^:\n]+): '(?P<path>[^'\n]+)'\s*$")


def step_error_message(error) -> str:
    """What a failed step's error says went wrong (a SerializableErrorInfo). Under a RetryPolicy,
    Dagster's last attempt says only "Exceeded max_retries of 2": the error it wraps is the cause.
    An OSError reads as the CLI says one: ``<path>: no space left on device``."""
    if error is None:
        return "failed"
    while error.cause is not None and (error.message.startswith("Exceeded max_retries") or error.cls_name in _WRAPPERS):
        error = error.cause
    match = _OS_ERROR.match(error.message.strip())
    return f"{match['path']}: {match['what'].lower()}" if match else error.message


def summary_lines(outcome: PassOutcome) -> list[str]:
    """One line per failed partition: its key and its causes."""
    return [f"{key}: {'; '.join(causes)}" for key, causes in sorted(outcome.failed.items())]


def exit_now(status: int) -> None:
    """Leave without waiting for the run's thread or the Spark JVM: as after a crash, which the
    next pass repairs; stdout/stderr are flushed first so the last line is seen."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def say_to_stderr(line: str) -> None:
    print(f"sync: {line}", file=sys.stderr, flush=True)


def log_dir_partition_keys() -> list[str]:
    """The key (``<topic>-<partition>``) of every partition in the broker's log dirs."""
    from kts_resources import settings
    from kts_resources.kafka.logdir import LogDir

    keys: list[str] = []
    for path in settings.log_dirs():
        if path.is_dir():
            keys += [p.topic_partition.dir_name for p in LogDir(path).partitions()]
    return keys


@dataclass
class PassReport:
    """What a pass did, and the tiers after it as ``kts status`` reports them."""

    keys: list[str]  # every partition of the log dirs
    new_keys: list[str]  # the ones the instance first heard of in this pass
    outcome: PassOutcome
    # Topics in no log dir of any kts for the grace period, whose remote data was deleted.
    topics_deleted: list[str]
    # Each partition's status row (kts_resources.tiering.status) with its open lost ranges.
    status: list[tuple[dict, list]]
    unreadable: dict[str, str]  # partition key → one line, for a partition whose files could not be read


class _Unchanged:
    """The partitions a pass may leave out, and their fingerprints recorded after it (sync_skip)."""

    def __init__(self, instance: dg.DagsterInstance, store: RemoteLogMetadataStore, keys: list[str]):
        import time

        from kts_assets import sync_skip

        self.instance, self.store, self.keys = instance, store, keys
        self.before = sync_skip.recorded(instance)
        self.now = self._fingerprints() if self.before else {}  # nothing recorded: every partition is taken
        self.now_ms = int(time.time() * 1000)

    def _fingerprints(self) -> dict:
        from kts_assets import sync_skip
        from kts_resources import settings
        from kts_resources.kafka.errors import KafkaFormatError
        from kts_resources.tiering.leadership import broker_replicas
        from kts_resources.tiering.pass_fingerprint import pass_fingerprints

        try:
            role = broker_replicas(settings.log_dirs(), settings.metadata_log_dir()).role
        except (KafkaFormatError, ValueError):
            return {}  # who leads is unknown: every partition is taken (and its copy says why)
        return pass_fingerprints(settings.log_dirs(), self.store, settings.kts_home(), owned_log_dirs=settings.owned_log_dirs(),
                                 role=role, salt=sync_skip.code_salt())

    def partitions(self, storage: RemoteStorageManager) -> set[str]:
        """The keys to leave out: unchanged, nothing planned since, nothing due, their tier whole."""
        from kts_assets import sync_skip

        same = sync_skip.unchanged(self.keys, self.now, sync_skip.last_planned(self.instance, self.keys), self.before,
                                   self.now_ms)
        return sync_skip.tier_intact(same, self.now, storage, self.store) if same else set()

    def record(self, ran: list[str], failed: Mapping[str, list[str]], left_out: set[str]) -> None:
        """After the runs: the fingerprints of the partitions they took cleanly, as the runs left them."""
        from kts_assets import sync_skip

        clean = [key for key in ran if key not in failed]
        after = self._fingerprints() if clean else {}
        sync_skip.record(self.instance, clean, after, sync_skip.last_planned(self.instance, clean) if clean else {},
                         keep={key: self.before[key] for key in left_out})


def _quiet_dagster_warnings() -> None:
    """Dagster's notices about the beta/preview APIs kts uses on purpose are not the user's business."""
    import warnings

    warnings.filterwarnings("ignore", module=r"dagster\..*")
    warnings.filterwarnings("ignore", message=r".*(beta|preview).*")


def run_pass(keys: list[str], open_store: Callable[[], RemoteLogMetadataStore], open_storage: Callable[[], RemoteStorageManager],
             say: Callable[[str], None] = say_to_stderr) -> PassReport:
    """One full pass through Dagster, in-process, over the partitions ``keys``: release runs that
    died, register new partitions, run copy_job (inventory with Spark, copy under the quota) over
    every partition where something changed since its last clean pass (kts_assets.sync_skip) in as
    few runs as batching allows, move the roll sensor's cursor for what was copied, delete the
    remote data of topics gone from every log dir for the grace period, then total the tiers
    (``open_store`` and ``open_storage`` open the metadata store and the remote tier for what the
    pass reads itself). The environment is checked by the caller first."""
    import logging

    _quiet_dagster_warnings()
    from kts_assets.batching import batch_key_ranges
    from kts_assets.definitions import defs
    from kts_assets.instance import dagster_instance
    from kts_assets.jobs import COPY_JOB_NAME
    from kts_assets.partitions import topic_partitions
    from kts_assets.run_hygiene import release_dead_runs
    from kts_assets.sensors.roll import advance_roll_cursor, survey_log_dirs
    from kts_resources import settings

    instance = dagster_instance()
    for line in release_dead_runs(instance):
        say(line)
    known = instance.get_dynamic_partitions(topic_partitions.name)
    new = sorted(set(keys) - set(known))
    if new:
        instance.add_dynamic_partitions(topic_partitions.name, new)
    ordered = instance.get_dynamic_partitions(topic_partitions.name)
    job = defs.resolve_job_def(COPY_JOB_NAME)
    # The terminal gets the pass's outcome: each failed partition once, with every cause, at the
    # end (summary_lines), and the run to open in the UI, which has its full event log. The run's
    # own logging would say each failure again as it happened (the copy's error, the check's
    # verdict, the run's failure naming them again): KTS_LOG_LEVEL shows it.
    level = settings.log_level("CRITICAL")
    logging.getLogger().setLevel(level)
    run_config = {"loggers": {"console": {"config": {"log_level": level}}}}
    outcome = PassOutcome()
    # What the roll sensor would ask for now; taken before the runs, so a roll during them is still
    # requested by the sensor later.
    eligible = survey_log_dirs(settings.log_dirs(), keys).eligible
    from kts_assets.sensors.topic_deletion import delete_gone_topics_and_report
    from kts_resources.tiering.status import status_rows_and_lost

    store = open_store()
    storage = open_storage()
    try:
        # Partitions where nothing changed since their last clean pass have nothing to report again
        # (kts_assets.sync_skip): the runs take the others.
        skip = _Unchanged(instance, store, keys)
        left_out = skip.partitions(storage)
        if left_out:
            say(f"{len(left_out)} of {len(keys)} partitions unchanged since their last pass: not run")
        wanted = [key for key in keys if key not in left_out]
        for batch in batch_key_ranges(ordered, wanted):
            say(f"copy_job over {batch.start} .. {batch.end} ({batch.span} partitions)")
            run_batch(job, instance, batch, run_config, outcome, say)
        skip.record(wanted, outcome.failed, left_out)
        # The roll sensor need not ask again for what this pass copied (failed partitions it still will).
        advance_roll_cursor(instance, {key: offset for key, offset in eligible.items() if key not in outcome.failed})
        # Topics no kts has seen in a log dir for the grace period lose their remote data, as a deletion
        # would: the topic deletion job's function (the daemon's road), its partitions reported to the UI.
        deleted = delete_gone_topics_and_report(store, storage, settings.log_dirs(), settings.owned_log_dirs(),
                                                instance.report_runless_asset_event, changed_by="kts sync")
        # The totals are what `kts status` reports now, computed by the same function.
        unreadable: dict[str, str] = {}
        status = status_rows_and_lost(store, unreadable)
    finally:
        storage.close()
        store.close()
    return PassReport(keys, new, outcome, deleted, status, unreadable)
