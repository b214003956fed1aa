"""`kts delete-records` and `kts topic delete`: Kafka's DeleteRecords and topic deletion on kts's
tiers (kts_resources.tiering.partition_admin); `kts recover`: the metadata store rebuilt from the remote
tier alone (kts_resources.maintenance.recovery); `kts restore`: a partition's log dir rebuilt from the remote
tier (kts_resources.maintenance.restore). One clear line for bad input."""

from __future__ import annotations

from kts_assets.cli import EXIT_USAGE, CommandError, bounded, parse_duration_ms, print_json
from kts_assets.sizes import counted


def _tip(store, topic: str, partition: int):
    from kts_resources.kafka.partition import TopicPartition, topic_name_problem
    from kts_resources.remote_log import TopicIdPartition

    problem = topic_name_problem(topic)
    if problem is not None:
        raise CommandError(f"topic {topic!r}: {problem}", EXIT_USAGE)
    topic_id = store.topic_id(topic)
    if topic_id is None:
        raise CommandError(f"topic {topic!r} is not known to the metadata store (kts sync has not seen it)")
    return TopicIdPartition(topic_id, TopicPartition(topic, partition))


def cmd_delete_records(args) -> int:
    """Move the partition's log start offset to ``--before``; the next expiry deletes below it."""
    from kts_assets.cli import _metadata_store
    from kts_resources import settings
    from kts_resources.tiering.partition_admin import DeleteRecordsError, UnknownPartitionError, delete_records
    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.tiering.tiers import locate_partitions

    from kts_assets.cli import _remote_storage

    store = _metadata_store()
    storage = _remote_storage()
    try:
        tip = _tip(store, args.topic, args.partition)
        key = tip.topic_partition.dir_name
        located, _ = locate_partitions(settings.log_dirs(), [key], owned_log_dirs=settings.owned_log_dirs())
        # The tier records it too, so that `kts recover` brings it back.
        start = delete_records(located.get(key), tip, store, args.before, storage=storage)
        _report_changed(store, located.values(), "kts delete-records")
    except UnknownPartitionError as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    except DeleteRecordsError as e:
        raise CommandError(str(e)) from None
    except RemoteStorageError as e:  # only written after the store moved
        raise CommandError(f"{e}; the log start offset moved in the metadata store, but its record in the remote tier "
                           f"(for kts recover) was not written: run the same kts delete-records again") from None
    finally:
        storage.close()
        store.close()
    if args.json:
        print_json({"topic": args.topic, "partition": args.partition, "log_start_offset": start})
    else:
        print(f"{args.topic}-{args.partition}: log start offset {start}; records below it are no longer readable "
              f"and the next expiry (kts sync, or the retention sensor's run) deletes their segments")
    return 0


def _report_changed(store, located, changed_by: str) -> None:
    """The partitions a command changed, reported again to the Dagster instance (runless
    observations of local_segments and remote_segments), so the UI agrees with `kts status` at
    once. The change stands either way: a Dagster instance that cannot be written is one warning."""
    import sys

    try:
        from kts_assets.assets.reporting import tier_observations
        from kts_assets.cli import dagster_instance

        instance = dagster_instance()
        for loc in located:
            for observation in tier_observations(loc, store, changed_by=changed_by):
                instance.report_runless_asset_event(observation)
    except Exception as e:  # noqa: BLE001 - what the command did is done; only the UI lags
        print(f"kts: warning: the Dagster UI was not told of the change ({type(e).__name__}: {e}); "
              "the next run's report brings it up to date", file=sys.stderr)


def cmd_topic_delete(args) -> int:
    """Delete every remote segment and remote log index file of the topic, through the partition delete states."""
    from kts_assets.cli import _metadata_store, _remote_storage
    from kts_resources import settings
    from kts_resources.tiering.partition_admin import delete_topic_remote_data
    from kts_resources.tiering.quotas import SystemClock
    from kts_resources.tiering.tiers import log_dir_partitions

    storage = _remote_storage()
    store = _metadata_store()
    try:
        results = delete_topic_remote_data(args.topic, store, storage, clock=SystemClock(), home=settings.kts_home())
        _report_changed(store, [loc for loc in log_dir_partitions(settings.log_dirs()) if loc.partition.topic == args.topic],
                        "kts topic delete")
    except KeyError:
        raise CommandError(f"topic {args.topic!r} is not known to the metadata store") from None
    finally:
        storage.close()
        store.close()
    segments = sum(r.segments_deleted for r in results)
    if args.json:
        print_json({"topic": args.topic, "partitions": len(results), "segments_deleted": segments,
                    "index_files_deleted": sum(r.index_files_deleted for r in results)})
    else:
        print(f"{args.topic}: remote data of {counted(len(results), 'partition')} deleted ({counted(segments, 'segment')}); "
              f"DELETE_PARTITION_FINISHED. kts no longer copies it.")
    return 0


def cmd_recover(args) -> int:
    """Rebuild the metadata store (topics, partitions, finished segments, log start offsets) and
    the remote log indexes from the remote tier's listing and manifests alone."""
    import sys

    from kts_assets.cli import report
    from kts_resources import settings
    from kts_resources.maintenance.recovery import RecoveryError, recover

    def progress(line: str) -> None:
        print(f"kts recover: {line}", file=sys.stderr, flush=True)

    outcome = _on_the_tier(lambda store, storage: recover(store, storage, settings.kts_home(), progress=progress),
                           (RecoveryError,))
    if args.json:
        print_json(outcome.to_json())
    else:
        rebuilt = f", {outcome.segments_rebuilt} rebuilt from segment objects without a manifest" if outcome.segments_rebuilt else ""
        print(f"recovered {counted(outcome.segments_recovered, 'segment')} ({outcome.segments_present} already in the store{rebuilt}) of "
              f"{counted(outcome.partitions, 'partition')} of {counted(outcome.topics, 'topic')} from {counted(outcome.manifests, 'manifest')} "
              f"({counted(outcome.objects_listed, 'object')} listed); remote log index of {counted(outcome.index_partitions, 'partition')} "
              f"({counted(outcome.index_segments_read, 'segment')} read, {counted(outcome.index_files_written, 'file')} written, "
              f"{outcome.index_files_published} shipped)")
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

    from kts_assets.cli import directory_to_write
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
        _tip(store, args.topic, args.partition)  # an odd or unknown topic: one line
        return restore_partition(store, storage, args.topic, args.partition, to_dir, from_offset=args.from_offset,
                                 progress=progress)

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

    from kts_assets.cli import report
    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.maintenance.scrub import scrub

    def progress(line: str) -> None:
        print(f"kts scrub: {line}", file=sys.stderr, flush=True)

    if args.grace < 0:
        raise CommandError(f"--grace {args.grace} ms: a grace period is not negative", EXIT_USAGE)
    outcome = _on_the_tier(lambda store, storage: scrub(store, storage, deep=args.deep, grace_s=args.grace / 1000,
                                                        dry_run=args.dry_run, progress=progress),
                           (RemoteStorageError,), then="; nothing was deleted")
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


def _on_the_tier(work, errors: tuple[type[Exception], ...], *, then: str = ""):
    """``work(store, storage)`` on the metadata store and the remote tier this environment names,
    both closed after it; ``errors`` become one line (with ``then`` after it)."""
    from kts_assets.cli import _metadata_store, _remote_storage

    store = _metadata_store()
    storage = _remote_storage()
    try:
        return work(store, storage)
    except errors as e:
        raise CommandError(f"{e}{then}") from None
    finally:
        storage.close()
        store.close()


def add_admin_parsers(sub) -> None:
    p = sub.add_parser("delete-records", help="Kafka's DeleteRecords: move a partition's log start offset; expiry deletes below it")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=bounded(int, 0, 2**31 - 1))
    p.add_argument("--before", required=True, type=bounded(int, 0, 2**63 - 1), metavar="OFFSET")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_delete_records)
    p = sub.add_parser("topic", help="topic-level actions: delete (its remote data, through the partition delete states)")
    topic_sub = p.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    d = topic_sub.add_parser("delete", help="delete the topic's remote data and remote log index; kts stops copying it")
    d.add_argument("topic", metavar="TOPIC")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_topic_delete)
    p = sub.add_parser("recover", help="rebuild the metadata store (topics, partitions, finished segments, log start offsets) "
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

