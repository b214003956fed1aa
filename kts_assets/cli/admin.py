"""`kts config`: a topic's tiering configs, with Kafka's names and validation; `kts delete-records`
and `kts topic delete`: Kafka's DeleteRecords and topic deletion on kts's tiers
(kts_resources.tiering.partition_admin). One clear line for bad input."""

from __future__ import annotations

from kts_assets.cli.common import EXIT_USAGE, CommandError, bounded, key_values, print_json, print_table
from kts_assets.cli.environment import known_partition, metadata_store, remote_storage
from kts_assets.cli.ui_report import report_changed_partitions
from kts_assets.sizes import counted


def cmd_delete_records(args) -> int:
    """Move the partition's log start offset to ``--before``; the next expiry deletes below it."""
    from kts_resources import settings
    from kts_resources.tiering.partition_admin import DeleteRecordsError, UnknownPartitionError, delete_records
    from kts_resources.remote_storage.base import RemoteStorageError
    from kts_resources.tiering.tiers import locate_partitions

    store = metadata_store()
    storage = remote_storage()
    try:
        tip = known_partition(store, args.topic, args.partition)
        key = tip.topic_partition.dir_name
        located, _ = locate_partitions(settings.log_dirs(), [key], owned_log_dirs=settings.owned_log_dirs())
        # The tier records it too, so that `kts recover` brings it back.
        start = delete_records(located.get(key), tip, store, args.before, storage=storage)
        # Its log start offset moved, and what lies below it is now past retention (the delete lag).
        report_changed_partitions(store, [tip.topic_partition], "kts delete-records", retention=True)
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


def cmd_topic_delete(args) -> int:
    """Delete every remote segment and remote log index file of the topic, through the partition delete states."""
    from kts_resources import settings
    from kts_resources.tiering.partition_admin import delete_topic_remote_data
    from kts_resources.tiering.quotas import SystemClock

    storage = remote_storage()
    store = metadata_store()
    try:
        results = delete_topic_remote_data(args.topic, store, storage, clock=SystemClock(), home=settings.kts_home())
        report_changed_partitions(store, [r.tip.topic_partition for r in results], "kts topic delete", retention=True)
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


def _known_topic(store, topic: str) -> None:
    """Make sure the store knows ``topic``: a topic kts has not copied yet is looked up in the log
    dirs (its id is in partition.metadata), so configs can be set before the first copy."""
    from kts_resources import settings
    from kts_resources.kafka.logdir import LogDir

    if store.topic_id(topic) is not None:
        return
    for path in settings.log_dirs():
        if not path.is_dir():
            continue
        for partition in LogDir(path).partitions():
            metadata = partition.metadata() if partition.topic == topic else None
            if metadata is not None:
                store.ensure_topic(topic, metadata.topic_id)
                return
    raise CommandError(f"topic {topic!r} is neither in the metadata store nor in the log dirs ({', '.join(map(str, settings.log_dirs()))})")


def cmd_config(args) -> int:
    from kts_resources.metadata.topic_config import CONFIG_KEYS, REMOTE_STORAGE_ENABLE, InvalidTopicConfig

    store = metadata_store()
    try:
        _known_topic(store, args.topic)
        if args.config_command == "set":
            for key, value in key_values(args.assignments):
                store.set_topic_config(args.topic, key, value)
        elif args.config_command == "delete":
            for key in args.keys:
                store.delete_topic_config(args.topic, key)
        config = store.topic_configs(args.topic)
        for key in (args.keys if args.config_command == "get" else ()):
            config.get(key)  # an unknown key is an error, as in Kafka
    except InvalidTopicConfig as e:
        raise CommandError(f"{args.topic}: {e}", EXIT_USAGE) from None
    keys = args.keys if args.config_command == "get" and args.keys else sorted(CONFIG_KEYS)
    overrides = config.overrides
    tiered = config.tiering_enabled(args.topic)
    rows = {}
    for key in keys:
        rows[key] = {"value": overrides[key] if key in overrides else CONFIG_KEYS[key].default,
                     "source": "override" if key in overrides else "default"}
    if REMOTE_STORAGE_ENABLE in rows and REMOTE_STORAGE_ENABLE not in overrides:
        # kts tiers a topic unless told not to (Kafka's own default is false): show what kts does.
        rows[REMOTE_STORAGE_ENABLE] = {"value": "true" if tiered else "false",
                                       "source": "kts default" if tiered else "default (internal or compacted topic)"}
    if args.json:
        print_json({"topic": args.topic, "tiered": tiered, "copy_enabled": config.copy_enabled(args.topic), "configs": rows})
    else:
        print_table([{"key": k, **v} for k, v in rows.items()], ["key", "value", "source"])
        print(f"{args.topic} is {'tiered' if tiered else 'not tiered'} by kts")
    return 0


def add_config_parser(sub) -> None:
    p = sub.add_parser("config", help="a topic's tiering configs, with Kafka's names and validation")
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    g = config_sub.add_parser("get", help="print the topic's configs (all, or the keys named)")
    g.add_argument("topic", metavar="TOPIC")
    # default=[]: without it argparse lists an optional KEY among the required arguments.
    g.add_argument("keys", nargs="*", default=[], metavar="KEY")
    s = config_sub.add_parser("set", help="set configs, e.g. local.retention.ms=3600000 remote.storage.enable=true")
    s.add_argument("topic", metavar="TOPIC")
    s.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    d = config_sub.add_parser("delete", help="return configs to Kafka's defaults")
    d.add_argument("topic", metavar="TOPIC")
    d.add_argument("keys", nargs="+", metavar="KEY")
    for action in (g, s, d):
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(func=cmd_config)


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
