"""`kts fetch`, `kts offsets` and `kts broker-config`: reading the tiered log from the command line
(ARCHITECTURE.md's contract and JSON fields), and the broker-level settings reads and copies share."""

from __future__ import annotations

from kts_assets.cli.common import EXIT_USAGE, CommandError, b64, bounded, key_values, parse_size, print_json, print_table
from kts_assets.cli.environment import metadata_store, remote_uri


def _reader():
    from kts_resources.metadata.quota_config import QuotaConfigError
    from kts_resources.reading.reader import TieredLogReader

    remote_uri()
    try:
        return TieredLogReader.from_environment(metadata_store())
    except QuotaConfigError as e:
        raise CommandError(f"broker config: {e}") from None
    except ValueError as e:  # the remote tier's URI: its message names it
        raise CommandError(str(e), EXIT_USAGE) from None


def cmd_fetch(args) -> int:
    """Records from ``--offset`` on, local or remote, as a consumer fetch returns them."""
    from kts_resources.reading.reader import ReadError

    with _reader() as reader:
        try:
            result = reader.fetch(args.topic, args.partition, args.offset, args.max_bytes, args.isolation)
        except ReadError as e:
            raise CommandError(str(e)) from None
        records = result.records
    if args.json:
        print_json(result.to_json())
        return 0
    for r in records:
        headers = " ".join(f"{k}={b64(v)}" for k, v in r.headers)
        print(f"offset: {r.offset} timestamp: {r.timestamp} key: {_text(r.key)} value: {_text(r.value)}"
              + (f" headers: {headers}" if headers else ""))
    remote = sum(b.remote for b in result.batches)
    tail = "; the remote read was throttled (fetch quota): fetch again later" if result.throttled else ""
    print(f"{len(records)} records, next offset {result.next_offset} ({remote} of {len(result.batches)} batches "
          f"from the remote tier, {result.remote_requests} remote requests){tail}")
    return 0


def _text(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"base64:{b64(data)}"
    return text if text.isprintable() else f"base64:{b64(data)}"


def cmd_offsets(args) -> int:
    """ListOffsets across tiers: {"offset": N, "leader_epoch": E}, −1/−1 when there is none."""
    from kts_resources.reading.reader import ReadError

    spec = args.timestamp if args.timestamp is not None else args.spec
    with _reader() as reader:
        try:
            answer = reader.offsets(args.topic, args.partition, spec, args.isolation)
        except ReadError as e:
            raise CommandError(str(e)) from None
    if args.json:
        print_json(answer.to_json())
    else:
        print(f"offset: {answer.offset} leader_epoch: {answer.leader_epoch}")
    return 0


def cmd_broker_config(args) -> int:
    """The KIP-956 quota settings every kts process shares, kept in the metadata store."""
    from kts_resources.metadata.quota_config import QuotaConfigError
    from kts_resources.metadata.topic_config import InvalidTopicConfig
    from kts_resources.tiering.broker_config import InvalidBrokerConfig, broker_configs_in_force, update_broker_configs

    store = metadata_store()
    try:
        if args.action == "set":
            update_broker_configs(store, assignments=key_values(args.assignments))
        elif args.action == "delete":
            update_broker_configs(store, deletions=args.keys)
        stored = store.broker_configs()
        # The values in force: an unset key shows Kafka's default, which is what kts applies.
        config = broker_configs_in_force(stored)
    except (InvalidBrokerConfig, QuotaConfigError, InvalidTopicConfig) as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    finally:
        store.close()
    rows = {k: {"value": config[k], "source": "override" if k in stored else "default"} for k in sorted(config)}
    if args.json:
        print_json(rows)
    else:
        print_table([{"key": k, "value": v["value"], "source": "set" if v["source"] == "override" else "Kafka's default"}
                     for k, v in rows.items()], ["key", "value", "source"])
    return 0


def add_read_parsers(sub) -> None:
    from kts_resources.reading.fetch_options import DEFAULT_MAX_BYTES, ISOLATION_LEVELS

    partition = bounded(int, 0, 2**31 - 1)
    p = sub.add_parser("fetch", help="records from an offset, from the local log or the remote tier (Kafka's fetch)")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=partition)
    p.add_argument("--offset", required=True, type=bounded(int, 0, 2**63 - 1), metavar="N")
    p.add_argument("--max-bytes", type=bounded(parse_size, 1, 2**31 - 1), default=DEFAULT_MAX_BYTES, metavar="B",
                   help=f"bytes of batches to return at most, but at least the first batch (default {DEFAULT_MAX_BYTES})")
    p.add_argument("--isolation", choices=ISOLATION_LEVELS, default="read_uncommitted")
    p.add_argument("--json", action="store_true", help='print {"records": [...], "next_offset": N, "throttled": bool}')
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("offsets", help="ListOffsets across tiers: earliest, earliest-local, latest-tiered, latest, "
                                       "max-timestamp, or the first offset at or after a timestamp")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=partition)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--timestamp", type=bounded(int, 0, 2**63 - 1), metavar="T", help="ms since the epoch")
    for spec in ("earliest", "earliest-local", "latest-tiered", "latest", "max-timestamp"):
        which.add_argument(f"--{spec}", dest="spec", action="store_const", const=spec)
    p.add_argument("--isolation", choices=ISOLATION_LEVELS, default="read_uncommitted",
                   help="latest and timestamp answers stop at the high watermark, or the last stable offset")
    p.add_argument("--json", action="store_true", help='print {"offset": N, "leader_epoch": E}')
    p.set_defaults(func=cmd_offsets)

    p = sub.add_parser("broker-config", help="broker-level settings every kts process shares, kept in the metadata store: "
                                             "the KIP-956 quotas (remote.log.manager.copy/fetch.*) and the retention "
                                             "defaults of topics that do not set their own (log.retention.ms, …)")
    action = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    g = action.add_parser("get", help="print them")
    s = action.add_parser("set", help="e.g. remote.log.manager.fetch.max.bytes.per.second=10485760")
    s.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    d = action.add_parser("delete", help="back to Kafka's defaults")
    d.add_argument("keys", nargs="+", metavar="KEY")
    for a in (g, s, d):
        a.add_argument("--json", action="store_true", help="print JSON")
        a.set_defaults(func=cmd_broker_config)

