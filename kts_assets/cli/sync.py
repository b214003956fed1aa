"""`kts sync`: one pass of the pipeline (:func:`kts_assets.sync.run_pass`) and its outcome in a few
lines; `kts status`: both tiers per partition; `kts ack-loss`: a lost range's alarm stopped."""

from __future__ import annotations

from kts_assets.cli.common import (
    EXIT_FINDINGS,
    CommandError,
    bounded,
    leave_without_teardown,
    offset_range,
    print_json,
    print_table,
    report,
)
from kts_assets.cli.environment import metadata_store, remote_storage, remote_uri


def _preflight() -> list[str]:
    """The environment, checked before Dagster or Spark start: one line per problem. With no log
    dir to work on, the database is not checked (that would start an embedded server for nothing)."""
    from kts_resources import preflight, settings
    from kts_resources.metadata.database import database_url
    from kts_resources.remote_storage.factory import default_remote_uri

    log_dir_problems = preflight.check_log_dirs(settings.log_dirs())
    problems = log_dir_problems + preflight.check_remote_tier(default_remote_uri())
    if not log_dir_problems:
        problems += preflight.check_metadata_store(database_url)
    return problems


def cmd_sync(args) -> int:
    """One full pass through Dagster, in-process: check the environment, release runs that died,
    discover partitions, then run copy_job (inventory with Spark, copy under the quota) over every
    partition in as few runs as batching allows. Exit 1 when any partition failed, naming each."""
    from kts_assets import sync

    from kts_resources.metadata.database import MetadataStoreUnavailable

    sync.install_stop_handlers()
    try:
        status = _sync()
        leave_without_teardown()
        return status
    except MetadataStoreUnavailable as e:
        # The preflight reached it: it went away during the pass (killed, restarted, the network).
        # Each write is a whole transaction and each copy resumable, so the next pass goes on.
        raise CommandError(e.went_away()) from None
    except sync.SyncInterrupted as stop:
        report([f"sync stopped by {stop}: the run was canceled and its partition locks released; "
                "the next kts sync finishes or cleans up the copies it left"])
        sync.exit_now(stop.status)
        return stop.status


def _sync() -> int:
    from kts_assets import broker_scope, sync
    from kts_assets.sizes import counted
    from kts_resources.tiering.lost_ranges import describe

    keys = sync.log_dir_partition_keys()
    remote_uri()  # a tier URI kts would not open is a usage error, before any check
    broker_scope.current()  # so is a KTS_DAGSTER_PER_BROKER kts cannot honour (BrokerScopeError)
    problems = _preflight()
    if problems:
        report(problems)
        return EXIT_FINDINGS

    done = sync.run_pass(keys, metadata_store, remote_storage)
    outcome = done.outcome
    report([f"{topic}: in no log dir of any kts for the grace period (kts.topic.absence.grace.ms): "
            f"its remote data is deleted, DELETE_PARTITION_FINISHED" for topic in done.topics_deleted])
    rows = [row for row, _ in done.status]
    print(f"synced {counted(len(keys), 'partition')} ({len(done.new_keys)} new): copied {counted(outcome.copied_segments, 'segment')} "
          f"({counted(outcome.copied_bytes, 'byte')}); remote tier now {counted(sum(r['remote_segments'] for r in rows), 'segment')} "
          f"({counted(sum(r['remote_bytes'] for r in rows), 'byte')}); copy lag {counted(sum(r['copy_lag_segments'] for r in rows), 'segment')} "
          f"({counted(sum(r['copy_lag_bytes'] for r in rows), 'byte')})"
          + (f"; re-copied {counted(outcome.recopied_segments, 'damaged remote segment')}" if outcome.recopied_segments else ""))
    damaged = [f"{r['topic']}-{r['partition']}: {counted(r['damaged_remote_segments'], 'remote segment')} damaged in the tier "
               "and not re-copied (their local segments are gone or differ)" for r in rows if r["damaged_remote_segments"]]
    # Every open lost range, on every pass until it is acknowledged: data loss never goes quiet.
    lost_lines = [f"{row['topic']}-{row['partition']}: {describe(r)}" for row, lost in done.status for r in lost]
    if outcome.failed:
        report(sync.summary_lines(outcome))
        # A failed non-blocking check leaves its run a success: then the pass's runs say more.
        runs = outcome.failed_runs or outcome.run_ids
        report([f"sync failed for {len(outcome.failed)} of {len(keys)} partitions; "
                f"run{'s' if len(runs) > 1 else ''} {', '.join(runs) or '-'} in the Dagster UI say{'' if len(runs) > 1 else 's'} more"])
    report(lost_lines)
    if lost_lines:
        report([f"{len(lost_lines)} lost range{'s' if len(lost_lines) > 1 else ''} not acknowledged"])
    report(damaged)
    # A partition whose files could not be read in the totals, though its run did not fail (read since, or
    # never located by a run): said here; the ones the pass failed were said above.
    unread = [line for key, line in sorted(done.unreadable.items()) if key not in outcome.failed]
    report(unread)
    return EXIT_FINDINGS if outcome.failed or lost_lines or damaged or unread else 0


def cmd_status(args) -> int:
    """Per partition: both tiers' offsets (Lx ≤ Ly ≤ Lz locally, Rx ≤ Ry remotely), bytes, segments
    and copy lag, from the log dirs and the metadata store (ARCHITECTURE.md's status fields).
    Neither Dagster nor PySpark is imported: ``kts_resources.tiering.tiers`` has all it needs. A log dir
    that is not there is a wrong environment, not an empty broker: one line each and exit 1 (an
    existing log dir with no partitions yet is a broker's first minutes, and prints an empty table)."""
    from kts_resources import preflight, settings
    from kts_resources.tiering.status import STATUS_FIELDS

    missing = preflight.missing_log_dirs(settings.log_dirs())
    if missing:
        report(missing)
        return EXIT_FINDINGS
    unreadable: dict[str, str] = {}
    rows = status_rows(unreadable)
    if args.json:
        print_json(rows)
    else:
        print_table([{**row, "lost_ranges": ",".join(f"{a}..{b}" for a, b in row["lost_ranges"]) or "-"} for row in rows],
                    STATUS_FIELDS)
    report(list(unreadable.values()))
    return EXIT_FINDINGS if unreadable else 0


def status_rows(unreadable: dict[str, str] | None = None) -> list[dict]:
    """One row of STATUS_FIELDS per partition in the log dirs: what `kts status` prints and what
    `kts sync` totals. ``lost_ranges``: the open (unacknowledged) lost ranges, [start, end] each;
    ``damaged_remote_segments``: finished segments found damaged in the tier, not yet re-copied.
    A partition whose files cannot be read goes into ``unreadable`` (key → one line) instead."""
    from kts_resources.tiering.status import status_rows_and_lost

    store = metadata_store()
    try:
        return [row for row, _ in status_rows_and_lost(store, unreadable)]
    finally:
        store.close()


def cmd_ack_loss(args) -> int:
    """Acknowledge an open lost range: the data-loss alarm for it stops, and the store keeps who
    (the OS user) and when, with the reason."""
    import getpass

    from kts_resources.kafka.partition import TopicPartition
    from kts_resources.metadata.store import RemoteResourceNotFoundError
    from kts_resources.remote_log import TopicIdPartition

    start, end = args.range
    store = metadata_store()
    topic_id = store.topic_id(args.topic)
    if topic_id is None:
        raise CommandError(f"topic {args.topic!r} is not known to the metadata store")
    tip = TopicIdPartition(topic_id, TopicPartition(args.topic, args.partition))
    try:
        acked = store.acknowledge_lost_range(tip, start, end, by=getpass.getuser(), reason=args.reason)
    except RemoteResourceNotFoundError as e:
        raise CommandError(str(e)) from None
    print(f"{tip.topic_partition}: lost range {acked} acknowledged by {acked.acknowledged_by} "
          f"at {acked.acknowledged_at:%Y-%m-%d %H:%M:%S %Z}")
    return 0


def add_sync_parser(sub) -> None:
    p = sub.add_parser("sync", help="one full pass of the pipeline through Dagster: discover, inventory (Spark), copy")
    p.set_defaults(func=cmd_sync)


def add_status_parsers(sub) -> None:
    p = sub.add_parser("status", help="per partition: offsets, bytes and segments per tier, copy lag, open lost ranges")
    p.add_argument("--json", action="store_true", help="print JSON (one object per partition)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("ack-loss", help="acknowledge a lost offset range (deleted locally before it was copied): its alarm stops")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=bounded(int, 0, 2**31 - 1))
    p.add_argument("--range", required=True, type=offset_range, metavar="A..B", help="the lost range, as kts sync and kts status name it")
    p.add_argument("--reason", metavar="TEXT", help="why the loss is accepted (kept with the acknowledgement)")
    p.set_defaults(func=cmd_ack_loss)
