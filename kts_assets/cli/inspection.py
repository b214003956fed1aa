"""Inspecting a broker's files, as Kafka's tools do, and writing broker-like ones: `kts segments`,
`kts dump` (DumpLogSegments), `kts index rebuild|verify` and `kts simulate`. No Dagster, PySpark
or metadata store: only ``kts_resources.kafka`` and its simulator."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from kts_assets.cli.common import (
    EXIT_FINDINGS,
    EXIT_USAGE,
    CommandError,
    b64,
    bounded,
    directory_to_write,
    existing_dir,
    existing_file,
    named_file,
    parse_duration_ms,
    parse_size,
    print_json,
    print_table,
    report,
    segment_file,
)
from kts_resources.kafka.errors import KafkaFormatError, shown


def add_inspection_parsers(sub, *, simulate_options: bool = True) -> None:
    p = sub.add_parser("segments", help="one row per segment of a partition directory, with CRC health")
    p.add_argument("partition_dir", metavar="PARTITION_DIR")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_segments)

    p = sub.add_parser("dump", help="the batches (and records) of a segment, like Kafka's DumpLogSegments; "
                                    "also .index, .timeindex, .snapshot and .txnindex files")
    p.add_argument("segment", metavar="SEGMENT.log")
    p.add_argument("--records", action="store_true", help="decode and print every record")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("index", help="rebuild or verify a segment's .index and .timeindex")
    index_sub = p.add_subparsers(dest="index_command", required=True, metavar="ACTION")
    r = index_sub.add_parser("rebuild", help="rebuild .index and .timeindex by the broker's rule, replaced atomically")
    r.add_argument("segment", metavar="SEGMENT.log")
    r.add_argument("--out", metavar="DIR", help="write the rebuilt indexes here instead of beside the segment")
    r.add_argument("--index-interval-bytes", type=bounded(parse_size, 0, 2**31 - 1), default=4096, metavar="N",
                   help="the topic's index.interval.bytes (default 4096)")
    r.set_defaults(func=cmd_index_rebuild)
    v = index_sub.add_parser("verify", help="check the indexes against the log; exit 1 on any finding")
    v.add_argument("segment", metavar="SEGMENT.log")
    v.set_defaults(func=cmd_index_verify)

    add_simulate_parser(sub, options=simulate_options)


def cmd_segments(args) -> int:
    from kts_resources.kafka.logdir import PartitionDir
    from kts_resources.kafka.segment import summarize_segment

    try:
        # The KRaft metadata log is inspected like any partition (DumpLogSegments does), never tiered.
        partition = PartitionDir.at(existing_dir(args.partition_dir), metadata_log=True)
    except ValueError as e:
        raise CommandError(f"{e} (kts segments takes a partition directory, <log dir>/<topic>-<partition>)", EXIT_USAGE) from None
    scan = partition.scan()
    # A .log that cannot be read (a dangling link, a link loop) hides offsets: a finding, not a note.
    unreadable = [f"{shown(partition.path / s.name)}: {s.reason}" for s in scan.unreadable_logs]
    for skipped in scan.skipped:
        if skipped not in scan.unreadable_logs:
            print(f"kts: note: {shown(partition.path / skipped.name)}: skipped: {skipped.reason}", file=sys.stderr)
    summaries = []
    for s in scan.segments:
        try:
            # Tallied in chunks, as the Spark inventory does: no batch objects, memory at a chunk.
            summaries.append(summarize_segment(s.log, s.base_offset, active=s.active))
        except KafkaFormatError as e:  # truncated while read: that segment's line, the rest go on
            unreadable.append(str(e))
    if args.json:
        print_json([s.to_json() for s in summaries])
    else:
        rows = [
            {
                "base_offset": s.base_offset,
                "last_offset": "-" if s.last_offset is None else s.last_offset,
                "next_offset": s.next_offset,
                "size_bytes": s.size_bytes,
                "batches": s.batch_count,
                "records": s.record_count,
                "max_timestamp": s.max_timestamp,
                "epochs": ",".join(map(str, s.leader_epochs)) or "-",
                "active": "yes" if s.active else "",
                "health": s.health,
            }
            for s in summaries
        ]
        print_table(rows, ["base_offset", "last_offset", "next_offset", "size_bytes", "batches", "records",
                           "max_timestamp", "epochs", "active", "health"])
    problems = unreadable + [line.replace(s.path, shown(s.path), 1) for s in summaries for line in s.problems()]
    report(problems)
    return EXIT_FINDINGS if problems else 0


def _entry_readers() -> dict[str, Callable]:
    from kts_resources.kafka.indexes import read_offset_index, read_time_index
    from kts_resources.kafka.snapshots import read_producer_snapshot, read_txn_index

    return {".index": read_offset_index, ".timeindex": read_time_index,
            ".snapshot": read_producer_snapshot, ".txnindex": read_txn_index}


def cmd_dump(args) -> int:
    from kts_resources.kafka.indexes import read_segment
    from kts_resources.kafka.records import decode_batch, parse_control_record, scan_batches

    path = existing_file(args.segment)
    readers = _entry_readers()
    reader = readers.get(path.suffix)
    if reader is not None:
        # Index entries are relative to the base offset the name carries.
        if path.suffix in (".index", ".timeindex"):
            path = named_file(args.segment, [path.suffix])
        return _dump_entries(path, reader, args.json)
    problems: list[str] = []
    out_batches = []
    # Read, not mapped: a broker truncating the log underneath (after a leader change) then gives
    # one line (FileChangedError), not SIGBUS.
    view = read_segment(path)
    scan = scan_batches(view, verify_crc=True)
    if not args.json:
        print(f"Dumping {shown(path)}")
    for batch in scan.batches:
        if batch.crc_ok is False:
            problems.append(f"{shown(path)}: byte {batch.position}: batch at offset {batch.base_offset} fails its CRC")
        records = None
        if args.records:
            try:
                records = decode_batch(view, batch, verify_crc=False)
            except KafkaFormatError as e:
                problems.append(str(e.located(path=path)))
        if args.json:
            item = batch.to_json()
            if records is not None:
                item["records"] = [_record_json(batch, r, parse_control_record) for r in records]
            out_batches.append(item)
        else:
            print(_batch_line(batch))
            for r in records or ():
                print(_record_line(batch, r, parse_control_record))
    if scan.invalid is not None:
        problems.append(f"{shown(path)}: byte {scan.invalid.position}: {scan.invalid.length} invalid bytes at the end ({scan.invalid.reason})")
    if args.json:
        print_json({
            "path": str(path),
            "batches": out_batches,
            "valid_bytes": scan.valid_bytes,
            "invalid_bytes": None if scan.invalid is None else {
                "position": scan.invalid.position, "length": scan.invalid.length, "reason": scan.invalid.reason},
        })
    report(problems)
    return EXIT_FINDINGS if problems else 0


def _dump_entries(path: Path, reader: Callable, as_json: bool) -> int:
    """The other files DumpLogSegments reads: offset and time indexes, producer snapshots, txn indexes."""
    import dataclasses

    entries = [dataclasses.asdict(e) for e in reader(path)]
    if as_json:
        print_json({"path": str(path), "entries": entries})
    else:
        print(f"Dumping {path}")
        for entry in entries:
            print(" ".join(f"{k}: {v}" for k, v in entry.items()))
    return 0


def _batch_line(b) -> str:
    ts_type = "LogAppendTime" if b.timestamp_type else "CreateTime"
    return (
        f"baseOffset: {b.base_offset} lastOffset: {b.last_offset} count: {b.record_count} "
        f"baseSequence: {b.base_sequence} partitionLeaderEpoch: {b.partition_leader_epoch} "
        f"isTransactional: {str(b.is_transactional).lower()} isControl: {str(b.is_control).lower()} "
        f"producerId: {b.producer_id} producerEpoch: {b.producer_epoch} position: {b.position} "
        f"{ts_type}: {b.max_timestamp} size: {b.size} magic: {b.magic} compresscodec: {b.codec_name} "
        f"crc: {b.crc} isvalid: {str(bool(b.crc_ok)).lower()}"
    )


def _record_line(batch, r, parse_control_record) -> str:
    ts_type = "LogAppendTime" if batch.timestamp_type else "CreateTime"
    line = (
        f"| offset: {r.offset} {ts_type}: {r.timestamp} keySize: {-1 if r.key is None else len(r.key)} "
        f"valueSize: {-1 if r.value is None else len(r.value)}"
    )
    if batch.magic >= 2 and batch.base_sequence >= 0:
        line += f" sequence: {batch.base_sequence + (r.offset - batch.base_offset)}"
    if r.headers:
        line += " headerKeys: [" + ",".join(k for k, _ in r.headers) + "]"
    if batch.is_control:
        try:
            marker = parse_control_record(r)
            if marker.coordinator_epoch is not None:
                line += f" endTxnMarker: {marker.type_name} coordinatorEpoch: {marker.coordinator_epoch}"
            else:  # a KRaft control record (leader change, snapshot header/footer, voters)
                line += f" controlType: {marker.type_name}"
        except KafkaFormatError as e:
            line += f" controlRecord: unreadable ({e.message})"
    return line


def _record_json(batch, r, parse_control_record) -> dict:
    item = {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": b64(r.key),
        "value": b64(r.value),
        "headers": [[k, b64(v)] for k, v in r.headers],
    }
    if batch.is_control:
        try:
            marker = parse_control_record(r)
            item["control"] = {"type": marker.type_name, "coordinator_epoch": marker.coordinator_epoch}
        except KafkaFormatError:
            item["control"] = None
    return item


def cmd_index_rebuild(args) -> int:
    from kts_resources.kafka.indexes import rebuild_segment_indexes

    path = segment_file(args.segment)
    out = directory_to_write(args.out, "--out") if args.out else None
    rebuilt = rebuild_segment_indexes(path, out_dir=out, index_interval_bytes=args.index_interval_bytes)
    print(f"rebuilt {shown(rebuilt.offset_index_path)} and {shown(rebuilt.time_index_path)} from {len(rebuilt.scan.batches)} batches")
    if rebuilt.scan.invalid is not None:
        inv = rebuilt.scan.invalid
        report([f"{shown(path)}: byte {inv.position}: {inv.length} invalid bytes at the end ({inv.reason}); indexed the valid prefix"])
        return EXIT_FINDINGS
    return 0


def cmd_index_verify(args) -> int:
    from kts_resources.kafka.indexes import verify_segment_indexes

    path = segment_file(args.segment)
    findings = verify_segment_indexes(path)
    if not findings:
        print(f"{shown(path)}: indexes ok")
        return 0
    report([str(f) for f in findings])
    return EXIT_FINDINGS


def cmd_simulate(args) -> int:
    import dataclasses
    import time

    from kts_resources import settings
    from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate

    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimulationConfig) if getattr(args, f.name, None) is not None}
    cluster = _cluster_options(args, options)
    try:
        config = SimulationConfig(**options)
        if cluster is not None:
            cluster.validate()
    except ValueError as e:
        raise CommandError(f"simulate: {e}", EXIT_USAGE) from None
    log_dir = directory_to_write(args.log_dir, "--log-dir") if args.log_dir else settings.log_dirs()[0]
    log_dir.mkdir(parents=True, exist_ok=True)
    last = {"at": 0.0, "done": False}

    def progress(written: int, total: int) -> None:
        # A line every couple of seconds: long runs show they are alive without flooding a log.
        now = time.monotonic()
        finished = written >= total
        if (now - last["at"] >= 2.0 and not last["done"]) or (finished and not last["done"]):
            last["at"], last["done"] = now, finished
            print(f"simulate: {written / 2**20:,.1f} / {total / 2**20:,.1f} MiB ({min(100.0, 100.0 * written / max(total, 1)):.0f}%)", file=sys.stderr)

    if cluster is not None:
        end_time_ms = _simulate_cluster(log_dir, config, cluster, progress, args.json)
    else:
        summary = simulate(log_dir, config, progress=progress)
        end_time_ms = summary.end_time_ms
        if args.json:
            print_json(summary.to_json())
        else:
            print(f"wrote {summary.bytes_written:,} bytes in {summary.batches_written:,} batches ({summary.records_written:,} records) "
                  f"to {len(summary.partitions)} partitions under {log_dir}")
            print(f"segments rolled {summary.segments_rolled}, deleted {summary.segments_deleted}; transactions committed "
                  f"{summary.transactions_committed}, aborted {summary.transactions_aborted}; leader epoch changes {summary.leader_epoch_changes}")
    week_ms = 7 * 24 * 3600 * 1000
    if end_time_ms < time.time() * 1000 - week_ms:
        # Reproducible runs use a fixed clock; say what Kafka's default retention will make of it.
        print(f"simulate: note: the records are stamped up to {end_time_ms} ms since the epoch, over 7 days ago: "
              f"Kafka's default retention.ms (7 days) expires them in kts sync's retention step; pass --start-time-ms, or "
              f"set retention.ms (kts config set) or log.retention.ms (kts broker-config set)", file=sys.stderr)
    return 0


# Options that belong to one broker's run only: in a cluster, broker b is node b and elections set the epochs.
_SINGLE_BROKER_OPTIONS = ("node_id", "leader_epoch_change_ratio")
_CLUSTER_OPTIONS = ("replication_factor", "leader_changes", "unclean_elections")


def _cluster_options(args, options: dict):
    """The cluster run's options when --brokers is given, else None; a usage error for options
    that belong to the other kind of run."""
    from kts_resources.kafka.simulator.simulate_cluster import ClusterOptions

    if args.brokers is None:
        given = [o for o in _CLUSTER_OPTIONS if getattr(args, o) is not None]
        if given:
            raise CommandError(f"simulate: --{given[0].replace('_', '-')} needs --brokers (a cluster)", EXIT_USAGE)
        return None
    given = [o for o in _SINGLE_BROKER_OPTIONS if o in options]
    if given:
        raise CommandError(f"simulate: --{given[0].replace('_', '-')} does not apply with --brokers "
                           "(broker b is node b; leader epochs come from --leader-changes and --unclean-elections)", EXIT_USAGE)
    return ClusterOptions(brokers=args.brokers, replication_factor=args.replication_factor,
                          leader_changes=args.leader_changes or 0, unclean_elections=args.unclean_elections or 0)


def _simulate_cluster(root: Path, config, cluster, progress, as_json: bool) -> int:
    from kts_resources.kafka.simulator.cluster_simulation import broker_log_dir
    from kts_resources.kafka.simulator.simulate_cluster import simulate_cluster

    for b in range(cluster.brokers):
        d = broker_log_dir(root, b)
        if d.is_dir() and any(d.iterdir()):
            raise CommandError(f"simulate: {shown(d)} already holds files: a cluster is written into new log dirs "
                               "(choose another --log-dir)", EXIT_USAGE)
    summary = simulate_cluster(root, config, cluster, progress=progress)
    if as_json:
        print_json(summary.to_json())
        return summary.end_time_ms
    replicas = sum(len(b.replicas) for b in summary.brokers)
    print(f"wrote {summary.bytes_written:,} bytes in {summary.batches_written:,} batches ({summary.records_written:,} records) "
          f"to {len(config.topic_partitions())} partitions × {summary.replication_factor} replicas ({replicas} in all) "
          f"on {len(summary.brokers)} brokers under {root}")
    print(f"leader changes {summary.leader_changes} clean, {summary.unclean_elections} unclean; {summary.truncations} replica "
          f"truncations where a log diverged; transactions committed {summary.transactions_committed}, aborted "
          f"{summary.transactions_aborted}; segments deleted {summary.segments_deleted}")
    for b in summary.brokers:
        print(f"broker {b.broker}: {b.log_dir} (leads {', '.join(b.leads) if b.leads else 'nothing'})")
    print("run one kts beside each broker: KTS_LOG_DIRS=<its log dir> (meta.properties names its node.id; its KRaft "
          "metadata log is __cluster_metadata-0 there), one shared KTS_DATABASE_URL and KTS_REMOTE_URI")
    return summary.end_time_ms


def add_simulate_parser(sub, *, options: bool = True) -> None:
    """One option per SimulationConfig field, so the CLI can never fall behind the simulator.
    ``options`` False: the command and its help only (another command runs; no simulator import)."""
    import dataclasses

    p = sub.add_parser("simulate", help="write (or keep appending to) broker-like partitions in a log dir, or a replicated cluster's",
                       description="Writes broker-like partitions: batches of every codec, rolls, indexes, "
                                   "producer snapshots, leader epochs, transactions, checkpoints. Deterministic per --seed; "
                                   "run it again on the same dir to keep appending. With --brokers N, writes a replicated "
                                   "cluster instead: D/broker-0 … D/broker-<N-1>, each with meta.properties and the KRaft "
                                   "metadata log; followers hold the leader's batches byte for byte with their own roll points "
                                   "and lagging high watermarks; --leader-changes and --unclean-elections script the "
                                   "leadership history (the other replicas truncate where an unclean election's lineage "
                                   "diverges). A cluster is written into new log dirs only.")
    p.set_defaults(func=cmd_simulate)
    if not options:
        return
    from kts_resources.kafka.simulator.simulate import OPTION_LIMITS, SimulationConfig

    p.add_argument("--log-dir", metavar="D", help="the broker log dir to write (default: first of KTS_LOG_DIRS, else KTS_HOME/logs); "
                                                  "with --brokers, the directory that holds the brokers' log dirs")
    p.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    p.add_argument("--brokers", type=bounded(int, 1, 1000), metavar="N", default=None,
                   help="simulate a cluster of N brokers (D/broker-0 … D/broker-<N-1>)")
    p.add_argument("--replication-factor", type=bounded(int, 1, 1000), metavar="R", default=None,
                   help="replicas per partition, at most --brokers (default min(3, N))")
    p.add_argument("--leader-changes", type=bounded(int, 0, 10_000), metavar="K", default=None,
                   help="clean leader elections (to an in-sync replica) spread over the run (default 0)")
    p.add_argument("--unclean-elections", type=bounded(int, 0, 10_000), metavar="U", default=None,
                   help="unclean elections of a lagging follower outside the ISR spread over the run (default 0)")
    for f in dataclasses.fields(SimulationConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name.endswith("_bytes") or f.name in ("record_size", "batch_size"):
            kind, metavar = parse_size, "BYTES"
        elif f.name.endswith("_ms"):
            kind, metavar = parse_duration_ms, "MS"
        elif isinstance(default, float):
            kind, metavar = float, "X"
        elif isinstance(default, int):
            kind, metavar = int, "N"
        elif isinstance(default, str):
            from kts_resources.kafka.simulator.simulate import TIMESTAMP_PROFILES

            kind, metavar = str, "|".join(TIMESTAMP_PROFILES)
        else:
            kind, metavar = str, "A,B"
            default = ",".join(default)
        if f.name in OPTION_LIMITS:
            kind = bounded(kind, *OPTION_LIMITS[f.name])
        aliases = [flag, "--rate"] if f.name == "messages_per_second" else [flag]
        p.add_argument(*aliases, dest=f.name, type=kind, metavar=metavar, default=None, help=f"default {default}")

