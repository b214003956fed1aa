"""`kts recover`: the metadata store rebuilt from the remote tier alone (kts_resources.maintenance.recovery);
`kts restore`: a partition's log dir rebuilt from the remote tier (kts_resources.maintenance.restore);
`kts scrub`: the remote tier reconciled with the metadata store (kts_resources.maintenance.scrub).
One clear line for bad input."""

from __future__ import annotations

from kts_assets.cli.common import EXIT_USAGE, CommandError, bounded, directory_to_write, parse_duration_ms, print_json, report
from kts_assets.cli.environment import known_partition, metadata_store, remote_storage
from kts_assets.cli.ui_report import report_changed_partitions
from kts_assets.sizes import counted


def cmd_recover(args) -> int:
    """Rebuild the metadata store (topics, partitions, finished segments, log start offsets, the
    consumer groups' committed offsets) and the remote log indexes from the remote tier alone."""
    import sys

    from kts_resources import settings
    from kts_resources.maintenance.recovery import RecoveryError, recover

    def progress(line: str) -> None:
        print(f"kts recover: {line}", file=sys.stderr, flush=True)

    def recover_and_report(store, storage):
        outcome = recover(store, storage, settings.kts_home(), progress=progress)
        # The store now has their segments and log start offsets: both tiers' numbers and the delete lag moved.
        report_changed_partitions(store, outcome.partitions_recovered, "kts recover", retention=True)
        return outcome

    outcome = _on_the_tier(recover_and_report, (RecoveryError,))
    if args.json:
        print_json(outcome.to_json())
    else:
        rebuilt = f", {outcome.segments_rebuilt} rebuilt from segment objects without a manifest" if outcome.segments_rebuilt else ""
        print(f"recovered {counted(outcome.segments_recovered, 'segment')} ({outcome.segments_present} already in the store{rebuilt}) of "
              f"{counted(outcome.partitions, 'partition')} of {counted(outcome.topics, 'topic')} from {counted(outcome.manifests, 'manifest')} "
              f"({counted(outcome.objects_listed, 'object')} listed); remote log index of {counted(outcome.index_partitions, 'partition')} "
              f"({counted(outcome.index_segments_read, 'segment')} read, {counted(outcome.index_files_written, 'file')} written, "
              f"{outcome.index_files_published} shipped)"
              + (f"; {counted(outcome.group_offsets_restored, 'committed offset')} of "
                 f"{counted(outcome.consumer_groups, 'consumer group')}" if outcome.consumer_groups else ""))
    lines = list(outcome.rebuilt) + outcome.lost_ranges_closed
    if outcome.objects_without_manifest:
        lines.append(f"{counted(len(outcome.objects_without_manifest), 'object')} of {counted(outcome.segments_without_manifest, 'segment')} "
                     f"have no manifest and were not recovered: they hold no record that finished segments do not "
                     f"(leftovers of copies that never finished), e.g. " + ", ".join(outcome.unmanifested_sample))
    lines += outcome.incomplete_segments + outcome.skipped + outcome.index_errors
    if lines:
        report(lines)
    return 0 if outcome.clean else 1


def cmd_restore(args) -> int:
    """Rebuild a partition's log directory under ``--to`` from the remote tier, byte for byte."""
    import sys
    import time

    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.maintenance.restore import RestoreError, restore_partition

    to_dir = directory_to_write(args.to, "--to")
    last = {"at": 0.0}

    def progress(done, total: int) -> None:
        now = time.monotonic()
        if now - last["at"] >= 2.0 or done.segments == total:  # a line every couple of seconds
            last["at"] = now
            print(f"kts restore: {done.segments}/{total} segments, {done.bytes:,} bytes", file=sys.stderr, flush=True)

    def restore(store, storage):
        tip = known_partition(store, args.topic, args.partition)  # an odd or unknown topic: one line
        result = restore_partition(store, storage, args.topic, args.partition, to_dir, from_offset=args.from_offset,
                                   progress=progress)
        if _is_a_log_dir(result.partition_dir.parent):  # restored where kts status looks: the local numbers moved
            report_changed_partitions(store, [tip.topic_partition], "kts restore")
        return result

    result = _on_the_tier(restore, (RestoreError, RemoteStorageError))
    summary = {"partition_dir": str(result.partition_dir), "segments": result.segments, "files": result.files,
               "bytes": result.bytes, "already_whole": result.already_whole, "log_start_offset": result.log_start_offset,
               "log_end_offset": result.log_end_offset}
    if args.json:
        print_json(summary)
    else:
        print(f"restored {counted(result.segments, 'segment')} ({result.bytes:,} bytes in {counted(result.files, 'file')}"
              f"{f', {result.already_whole} already whole' if result.already_whole else ''}) of {args.topic}-{args.partition} "
              f"into {result.partition_dir}: offsets {result.log_start_offset}..{result.log_end_offset - 1}")
    return 0


def cmd_scrub(args) -> int:
    """Reconcile the remote tier with the metadata store (kts_resources.maintenance.scrub); exit 1 on damage."""
    import sys

    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.maintenance.scrub import scrub

    def progress(line: str) -> None:
        print(f"kts scrub: {line}", file=sys.stderr, flush=True)

    if args.grace < 0:
        raise CommandError(f"--grace {args.grace} ms: a grace period is not negative", EXIT_USAGE)
    def scrub_and_report(store, storage):
        outcome = scrub(store, storage, deep=args.deep, grace_s=args.grace / 1000, dry_run=args.dry_run, progress=progress)
        # Damage recorded or cleared, interrupted deletes finished: the remote numbers moved.
        report_changed_partitions(store, outcome.partitions_changed, "kts scrub")
        return outcome

    outcome = _on_the_tier(scrub_and_report, (RemoteStorageError,), then="; nothing was deleted")
    if args.json:
        print_json(outcome.to_json())
    else:
        verb = "would delete" if outcome.dry_run else "deleted"
        print(f"scrubbed {counted(outcome.objects_listed, 'object')} and {counted(outcome.segments_checked, 'finished segment')}"
              f"{' (deep)' if args.deep else ''}: {verb} {counted(len(outcome.orphans_deleted), 'orphaned object')} and "
              f"{counted(len(outcome.index_files_deleted), 'superseded remote log index file')}, finished "
              f"{counted(outcome.deletes_finished, 'interrupted delete')}, aborted {counted(outcome.uploads_aborted, 'stale upload')}; "
              f"{counted(len(outcome.damaged), 'damaged segment')}")
    if outcome.problems:
        hint = ["damaged segments are re-copied by the next copy pass while their local segments exist"] if outcome.damaged else []
        if outcome.wrong_tier:
            hint = ["nothing was deleted: check KTS_REMOTE_URI"]
        report(outcome.problems + hint)
    return 0 if outcome.clean else 1


def _is_a_log_dir(path) -> bool:
    """``path`` is one of the broker's log dirs (KTS_LOG_DIRS), which `kts status` and the UI show."""
    from kts_resources import settings

    return any(path.resolve() == log_dir.expanduser().resolve() for log_dir in settings.log_dirs())


def _on_the_tier(work, errors: tuple[type[Exception], ...], *, then: str = ""):
    """``work(store, storage)`` on the metadata store and the remote tier this environment names,
    both closed after it; ``errors`` become one line (with ``then`` after it)."""

    store = metadata_store()
    storage = remote_storage()
    try:
        return work(store, storage)
    except errors as e:
        raise CommandError(f"{e}{then}") from None
    finally:
        storage.close()
        store.close()


def add_maintenance_parsers(sub) -> None:
    p = sub.add_parser("recover", help="rebuild the metadata store (topics, partitions, finished segments, log start offsets, consumer groups' committed offsets) "
                                       "and the remote log indexes from the remote tier's listing and manifests alone")
    p.add_argument("--json", action="store_true", help="print what was recovered and reported as JSON")
    p.set_defaults(func=cmd_recover)
    p = sub.add_parser("restore", help="rebuild a partition's log directory (segments, indexes, snapshots, leader-epoch "
                                       "checkpoint, partition.metadata, checkpoints) from the remote tier, byte for byte")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=bounded(int, 0, 2**31 - 1))
    p.add_argument("--to", required=True, metavar="DIR", help="the log dir to restore into (its partition dir must hold no segments)")
    p.add_argument("--from-offset", type=bounded(int, 0, 2**63 - 1), metavar="N", help="start at the segment holding offset N")
    p.add_argument("--json", action="store_true", help="print what was restored as JSON")
    p.set_defaults(func=cmd_restore)
    p = sub.add_parser("scrub", help="reconcile the remote tier with the metadata store: delete orphaned objects, finish "
                                     "interrupted deletes, abort stale uploads, record missing or (--deep) corrupt objects")
    p.add_argument("--deep", action="store_true", help="read every object of every finished segment and check its CRC-32C")
    p.add_argument("--grace", type=parse_duration_ms, default=24 * 3600 * 1000, metavar="DURATION",
                   help="leave objects younger than this alone (a copy may be in flight; default 1d)")
    p.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_scrub)

