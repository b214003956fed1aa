"""The ``kts`` command line.

Bad input gets one line on stderr naming the file and byte position, and a non-zero exit: 1 for
findings in the data, 2 for a command used wrongly. Heavy modules (dagster, pyspark, boto3) are
imported only by the commands that need them, so inspection commands start fast.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from kts_resources.kafka.errors import KafkaFormatError, os_error_line, shown

EXIT_FINDINGS = 1
EXIT_USAGE = 2
# Commands run in the standing CLI server (kts_assets.cli_server) unless KTS_CLI_SERVER=off: the
# ones that run Dagster jobs, whose imports are most of their start-up.
SERVED_COMMANDS = ("sync",)


class CommandError(Exception):
    """A problem worth one line on stderr, and the exit status to leave with."""

    def __init__(self, message: str, status: int = EXIT_FINDINGS):
        super().__init__(message)
        self.status = status


# --- small parsers --------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024, "m": 1000**2, "mb": 1000**2,
               "mi": 1024**2, "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gi": 1024**3, "gib": 1024**3,
               "t": 1000**4, "tb": 1000**4, "ti": 1024**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """``4096``, ``64KiB``, ``1.5GB``: a byte count."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 1GiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``500``/``500ms``, ``30s``, ``10m``, ``1h``, ``7d``: milliseconds."""
    m = re.match(r"^\s*(-?\d+)\s*(ms|s|m|min|h|d)?\s*$", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 500ms, 30s, 1h, 7d)")
    return int(m.group(1)) * _DURATION_UNITS[m.group(2) or "ms"]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


def print_table(rows: list[dict], columns: Sequence[str]) -> None:
    """Left-aligned text columns, as wide as their widest cell."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def report(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"kts: {line}", file=sys.stderr)


def _unreachable(p: Path) -> None:
    """A path whose stat() fails otherwise than by its absence (a symbolic link loop, a component
    that is no directory, no permission): one line saying so, not "no such file"."""
    try:
        p.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise CommandError(os_error_line(e)) from None


def existing_file(path: str) -> Path:
    p = Path(path)
    _unreachable(p)
    if not p.exists():
        raise CommandError(f"{shown(path)}: no such file", EXIT_USAGE)
    if not p.is_file():
        raise CommandError(f"{shown(path)}: {'a directory' if p.is_dir() else 'not a regular file'}, not a file", EXIT_USAGE)
    return p


def existing_dir(path: str) -> Path:
    p = Path(path)
    _unreachable(p)
    if not p.exists():
        raise CommandError(f"{shown(path)}: no such directory", EXIT_USAGE)
    if not p.is_dir():
        raise CommandError(f"{shown(path)}: not a directory", EXIT_USAGE)
    return p


def directory_to_write(path: str, option: str) -> Path:
    """A directory an option names for output: existing, or creatable (its nearest existing
    ancestor is a directory). Checked before any work so a file there is a usage error. An empty
    path is refused: it would quietly mean the current directory."""
    if not path.strip():
        raise CommandError(f"{option} {path!r}: an empty path; name the directory (. for the current one)", EXIT_USAGE)
    p = Path(path)
    for ancestor in (p, *p.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                what = "is a file" if ancestor == p else f"is under {shown(ancestor)}, which is not a directory"
                raise CommandError(f"{option} {shown(path)}: {what}; a directory is needed", EXIT_USAGE)
            break
    return p


def bounded(kind: Callable[[str], int | float], lo: float, hi: float) -> Callable[[str], int | float]:
    """An argparse type: ``kind``'s value, a usage error outside ``lo..hi`` (or for a number too
    long to convert), so a count never starts unbounded work."""
    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}{'...' if len(text) > 40 else ''}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value:g} is outside {lo:g}..{hi:g}" if isinstance(value, float)
                                             else f"{value} is outside {lo}..{hi}")
        return value
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def named_file(path: str, suffixes: Sequence[str]) -> Path:
    """An existing ``<20-digit offset><suffix>`` file whose suffix is one of ``suffixes``."""
    from kts_resources.kafka.logdir import parse_offset_file_name

    p = existing_file(path)
    try:
        _, suffix = parse_offset_file_name(p.name)
    except ValueError:
        suffix = None
    if suffix not in suffixes:
        raise CommandError(f"{shown(path)}: not a {'/'.join(suffixes)} file name (expected <20-digit offset>{p.suffix or suffixes[0]})", EXIT_USAGE)
    return p


def segment_file(path: str) -> Path:
    """An existing ``<20-digit base offset>.log`` file: the base offset comes from the name."""
    from kts_resources.kafka.logdir import LOG_SUFFIX, parse_offset_file_name

    p = existing_file(path)
    try:
        _, suffix = parse_offset_file_name(p.name)
    except ValueError:
        suffix = None
    if suffix != LOG_SUFFIX:
        raise CommandError(f"{shown(path)}: not a segment file (expected <20-digit base offset>.log)", EXIT_USAGE)
    return p


# --- commands -------------------------------------------------------------------------------------


def cmd_segments(args) -> int:
    from kts_resources.kafka.indexes import read_segment
    from kts_resources.kafka.logdir import PartitionDir
    from kts_resources.kafka.records import scan_batches
    from kts_resources.kafka.segment import summarize_scan

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
            data = read_segment(s.log)
            summaries.append(summarize_scan(str(s.log), s.base_offset, s.active, len(data), scan_batches(data, verify_crc=True)))
        except KafkaFormatError as e:  # too large, or truncated while read: that segment's line, the rest go on
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


def _remote_storage():
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    try:
        return remote_storage_from_uri(_remote_uri())
    except ValueError as e:
        raise CommandError(f"KTS_REMOTE_URI: {e}", EXIT_USAGE) from None


def _remote_uri() -> str:
    """``KTS_REMOTE_URI`` (or its default), refused as a usage error before any work when the
    factory would not open it (a relative ``file:`` path, an unknown scheme)."""
    from kts_resources import settings
    from kts_resources.remote_storage.factory import check_remote_uri

    uri = settings.remote_uri()
    try:
        check_remote_uri(uri)
    except ValueError as e:
        raise CommandError(f"KTS_REMOTE_URI: {e}", EXIT_USAGE) from None
    return uri


def _metadata_store():
    from kts_resources.metadata.database import MetadataStoreMisconfigured
    from kts_resources.metadata.embedded import EmbeddedPostgresError
    from kts_resources.metadata.store import RemoteLogMetadataStore

    try:
        return RemoteLogMetadataStore.from_env()
    except (MetadataStoreMisconfigured, EmbeddedPostgresError) as e:
        raise CommandError(str(e)) from None


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


def key_values(assignments: Sequence[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` arguments as (key, value), trimmed; a usage error for one without ``=`` or
    a key given twice (which value would win is not the user's to guess), before anything is set."""
    pairs: list[tuple[str, str]] = []
    for assignment in assignments:
        key, eq, value = assignment.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CommandError(f"{assignment!r}: expected key=value", EXIT_USAGE)
        if key in (k for k, _ in pairs):
            raise CommandError(f"{key} is given twice; give each key once (nothing was set)", EXIT_USAGE)
        pairs.append((key, value.strip()))
    return pairs


def cmd_config(args) -> int:
    from kts_resources.metadata.topic_config import CONFIG_KEYS, REMOTE_STORAGE_ENABLE, InvalidTopicConfig

    store = _metadata_store()
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


def cmd_services(args) -> int:
    from kts_resources.servers.services import services, stop_services
    from kts_resources.settings import kts_home

    if getattr(args, "all", False):
        return _services_of_machine(args)
    if getattr(args, "under", None) is not None:
        print("kts: services: --under needs --all", file=sys.stderr)
        return 2
    home = kts_home()
    only = getattr(args, "only", None)
    what = f"embedded {only} server" if only else "embedded server"
    if args.services_command == "stop":
        stopped = stop_services(home, only)
        # Stopping what is not running is no error: the goal, nothing running, holds.
        print(f"stopped {', '.join(stopped)} of {home}" if stopped else f"no {what} of {home} is running")
        return 0
    found = services(home, only)
    if args.json:
        print_json([s.as_json() for s in found])
    elif found:
        print_table([{**s.as_json(), "pid": s.pid if s.pid is not None else "-", "port": s.port if s.port is not None else "-"}
                     for s in found], ["kind", "state", "pid", "port", "data_dir"])
    else:
        print(f"no {what} of {home} is running")
    return 0


def _services_of_machine(args) -> int:
    """``kts services [stop] --all [--under DIR]``: every kts server of this account, orphans included."""
    from kts_resources.servers.services import STOPPED, machine_servers, stop_machine_servers

    under = Path(args.under).absolute() if args.under is not None else None
    where = f" with a KTS_HOME under {under}" if under is not None else ""
    found = machine_servers(under)
    if args.services_command == "stop":
        done = stop_machine_servers(found)
        for s in done:
            if s.state == STOPPED:
                print(f"removed the orphaned cluster {s.data_dir.parent}")
            else:
                print(f"stopped {s.kind} (pid {s.pid}) of {s.kts_home or 'an unknown KTS_HOME'}{' (orphan)' if s.orphan else ''}")
        if not done:
            print(f"no kts server of this account{where} is running")
        return 0
    if args.json:
        print_json([s.as_json() for s in found])
    elif found:
        print_table([{key: ("-" if value is None else value) for key, value in s.as_json().items()} for s in found],
                    ["kind", "state", "pid", "port", "orphan", "kts_home", "data_dir"])
    else:
        print(f"no kts server of this account{where} is running")
    return 0


def add_services_parser(sub) -> None:
    p = sub.add_parser("services", help="the servers (PostgreSQL, Spark Connect, the CLI server) of this KTS_HOME "
                                        "(with --all: of every KTS_HOME); `stop` stops them")
    p.add_argument("services_command", nargs="?", choices=["list", "stop"], default="list", metavar="stop",
                   help="stop the embedded servers this KTS_HOME started (they run until then)")
    p.add_argument("--all", action="store_true",
                   help="every kts server of this account, whichever KTS_HOME started it, orphans (KTS_HOME gone) "
                        "included, and under root every cluster in /var/lib/kts/postgres; `stop --all` also "
                        "removes the orphaned clusters")
    p.add_argument("--under", metavar="DIR", help="with --all: only the servers whose KTS_HOME lies under DIR")
    p.add_argument("--json", action="store_true", help="print JSON (one object per server)")
    p.set_defaults(func=cmd_services)
    p = sub.add_parser("spark", help="the embedded Spark Connect server of this KTS_HOME: `status` (the default) or `stop`")
    p.add_argument("services_command", nargs="?", choices=["status", "stop"], default="status", metavar="status|stop",
                   help="show it, or stop it and its Python workers (the next process needing Spark starts a fresh one)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_services, only="spark-connect")


REPO_ROOT = Path(__file__).resolve().parent.parent


# An installed kts (no source checkout, so no repo dagster.yaml): the instance on kts's PostgreSQL,
# as the repo's dagster.yaml has it.
INSTALLED_DAGSTER_YAML = """\
telemetry:
  enabled: false
storage:
  custom:
    module: kts_resources.dagster_storage
    class: KtsDagsterStorage
"""


def dagster_home() -> Path:
    """The instance's home `kts sync` and `kts ui` share: DAGSTER_HOME, else the repo root holding
    dagster.yaml (a source checkout), else KTS_HOME/dagster (set into DAGSTER_HOME for Dagster)."""
    from kts_resources import settings

    if not os.environ.get("DAGSTER_HOME"):
        home = REPO_ROOT if (REPO_ROOT / "dagster.yaml").is_file() else settings.kts_home() / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "dagster.yaml").exists():
            (home / "dagster.yaml").write_text(INSTALLED_DAGSTER_YAML)
        os.environ["DAGSTER_HOME"] = str(home)
    return Path(os.environ["DAGSTER_HOME"])


def dagster_instance():
    """The instance `kts ui` shows: every CLI run shows in the UI."""
    import dagster as dg

    dagster_home()
    return dg.DagsterInstance.get()


def _quiet_dagster_warnings() -> None:
    """Dagster's notices about the beta/preview APIs kts uses on purpose are not the user's business."""
    import warnings

    warnings.filterwarnings("ignore", module=r"dagster\..*")
    warnings.filterwarnings("ignore", message=r".*(beta|preview).*")


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
        status = _sync(args)
        _leave_without_teardown[0] = True
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


def _sync(args) -> int:
    import logging

    from kts_resources import settings
    from kts_resources.kafka.logdir import LogDir
    from kts_resources.tiering.lost_ranges import describe

    keys: list[str] = []
    for path in settings.log_dirs():
        if path.is_dir():
            keys += [p.topic_partition.dir_name for p in LogDir(path).partitions()]
    _remote_uri()  # a tier URI kts would not open is a usage error, before any check
    from kts_assets import broker_scope

    broker_scope.current()  # so is a KTS_DAGSTER_PER_BROKER kts cannot honour (BrokerScopeError)
    problems = _preflight()
    if problems:
        report(problems)
        return EXIT_FINDINGS

    _quiet_dagster_warnings()
    from kts_assets import sync
    from kts_assets.batching import batch_key_ranges
    from kts_assets.definitions import defs
    from kts_assets.jobs import COPY_JOB_NAME
    from kts_assets.partitions import topic_partitions
    from kts_assets.run_hygiene import release_dead_runs
    from kts_assets.sensors.roll import advance_roll_cursor, survey_log_dirs

    instance = dagster_instance()
    for line in release_dead_runs(instance):
        sync.say_to_stderr(line)
    known = instance.get_dynamic_partitions(topic_partitions.name)
    new = sorted(set(keys) - set(known))
    if new:
        instance.add_dynamic_partitions(topic_partitions.name, new)
    ordered = instance.get_dynamic_partitions(topic_partitions.name)
    job = defs.resolve_job_def(COPY_JOB_NAME)
    # The terminal gets the pass's outcome: each failed partition once, with every cause, at the
    # end (sync.summary_lines), and the run to open in the UI, which has its full event log. The
    # run's own logging would say each failure again as it happened (the copy's error, the check's
    # verdict, a stack trace of the failed blocking check, the run's failure): KTS_LOG_LEVEL shows it.
    level = settings.log_level("CRITICAL")
    logging.getLogger().setLevel(level)
    run_config = {"loggers": {"console": {"config": {"log_level": level}}}}
    outcome = sync.PassOutcome()
    # What the roll sensor would ask for now; taken before the runs, so a roll during them is still
    # requested by the sensor later.
    eligible = survey_log_dirs(settings.log_dirs(), keys).eligible
    for batch in batch_key_ranges(ordered, keys):
        sync.say_to_stderr(f"copy_job over {batch.start} .. {batch.end} ({batch.span} partitions)")
        sync.run_batch(job, instance, batch, run_config, outcome, sync.say_to_stderr)
    # The roll sensor need not ask again for what this pass copied (failed partitions it still will).
    advance_roll_cursor(instance, {key: offset for key, offset in eligible.items() if key not in outcome.failed})
    # Topics no kts has seen in a log dir for the grace period lose their remote data, as a deletion would.
    from kts_resources.tiering.partition_admin import delete_topics_gone_from_log_dirs
    from kts_resources.tiering.quotas import SystemClock
    from kts_resources.tiering.status import status_rows_and_lost

    store = _metadata_store()
    storage = _remote_storage()
    try:
        for topic in delete_topics_gone_from_log_dirs(store, storage, {k.rpartition("-")[0] for k in keys},
                                                      clock=SystemClock(), home=settings.kts_home()):
            report([f"{topic}: in no log dir of any kts for the grace period (kts.topic.absence.grace.ms): "
                    f"its remote data is deleted, DELETE_PARTITION_FINISHED"])
        # The totals are what `kts status` reports now, computed by the same function.
        unreadable: dict[str, str] = {}
        with_lost = status_rows_and_lost(store, unreadable)
    finally:
        storage.close()
        store.close()
    rows = [row for row, _ in with_lost]
    from kts_assets.sizes import counted

    print(f"synced {counted(len(keys), 'partition')} ({len(new)} new): copied {counted(outcome.copied_segments, 'segment')} "
          f"({counted(outcome.copied_bytes, 'byte')}); remote tier now {counted(sum(r['remote_segments'] for r in rows), 'segment')} "
          f"({counted(sum(r['remote_bytes'] for r in rows), 'byte')}); copy lag {counted(sum(r['copy_lag_segments'] for r in rows), 'segment')} "
          f"({counted(sum(r['copy_lag_bytes'] for r in rows), 'byte')})"
          + (f"; re-copied {counted(outcome.recopied_segments, 'damaged remote segment')}" if outcome.recopied_segments else ""))
    damaged = [f"{r['topic']}-{r['partition']}: {counted(r['damaged_remote_segments'], 'remote segment')} damaged in the tier "
               "and not re-copied (their local segments are gone or differ)" for r in rows if r["damaged_remote_segments"]]
    # Every open lost range, on every pass until it is acknowledged: data loss never goes quiet.
    lost_lines = [f"{row['topic']}-{row['partition']}: {describe(r)}" for row, lost in with_lost for r in lost]
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
    unread = [line for key, line in sorted(unreadable.items()) if key not in outcome.failed]
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

    store = _metadata_store()
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
    store = _metadata_store()
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


def offset_range(text: str) -> tuple[int, int]:
    """``A..B``: first and last offset, inclusive, 0 ≤ A ≤ B."""
    match = re.fullmatch(r"\s*(\d{1,19})\s*\.\.\s*(\d{1,19})\s*", text)
    if match is None or int(match[1]) > int(match[2]) or int(match[2]) > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{text[:64]!r} is not an offset range A..B with 0 ≤ A ≤ B")
    return int(match[1]), int(match[2])


def add_simulate_parser(sub) -> None:
    """One option per SimulationConfig field, so the CLI can never fall behind the simulator."""
    import dataclasses

    from kts_resources.kafka.simulator.simulate import OPTION_LIMITS, SimulationConfig

    p = sub.add_parser("simulate", help="write (or keep appending to) broker-like partitions in a log dir, or a replicated cluster's",
                       description="Writes broker-like partitions: batches of every codec, rolls, indexes, "
                                   "producer snapshots, leader epochs, transactions, checkpoints. Deterministic per --seed; "
                                   "run it again on the same dir to keep appending. With --brokers N, writes a replicated "
                                   "cluster instead: D/broker-0 … D/broker-<N-1>, each with meta.properties and the KRaft "
                                   "metadata log; followers hold the leader's batches byte for byte with their own roll points "
                                   "and lagging high watermarks; --leader-changes and --unclean-elections script the "
                                   "leadership history (the other replicas truncate where an unclean election's lineage "
                                   "diverges). A cluster is written into new log dirs only.")
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
    p.set_defaults(func=cmd_simulate)


# --- wiring ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kts", description="Kafka tiered storage, orchestrated by Dagster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    add_simulate_parser(sub)
    add_config_parser(sub)
    from kts_assets.cli_admin import add_admin_parsers
    from kts_assets.cli_dagster import add_dagster_parsers
    from kts_assets.cli_read import add_read_parsers

    add_read_parsers(sub)
    add_admin_parsers(sub)
    add_services_parser(sub)
    p = sub.add_parser("sync", help="one full pass of the pipeline through Dagster: discover, inventory (Spark), copy")
    p.set_defaults(func=cmd_sync)
    add_dagster_parsers(sub)
    p = sub.add_parser("status", help="per partition: offsets, bytes and segments per tier, copy lag, open lost ranges")
    p.add_argument("--json", action="store_true", help="print JSON (one object per partition)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("ack-loss", help="acknowledge a lost offset range (deleted locally before it was copied): its alarm stops")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", metavar="PARTITION", type=bounded(int, 0, 2**31 - 1))
    p.add_argument("--range", required=True, type=offset_range, metavar="A..B", help="the lost range, as kts sync and kts status name it")
    p.add_argument("--reason", metavar="TEXT", help="why the loss is accepted (kept with the acknowledgement)")
    p.set_defaults(func=cmd_ack_loss)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    # Library warnings (a retried connection, a deferred clean-up) stay quiet unless asked for:
    # the command's own outcome is the one line a user reads.
    from kts_resources import settings

    try:
        level = settings.log_level("ERROR")
    except ValueError as e:  # KTS_LOG_LEVEL=BOGUS: the environment is used wrongly
        report([str(e)])
        return EXIT_USAGE
    logging.basicConfig(level=level, format="kts: %(levelname)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()
        return status
    except CommandError as e:
        report([str(e)])
        return e.status
    except KafkaFormatError as e:
        report([str(e)])
        return EXIT_FINDINGS
    except BrokenPipeError:
        # `kts dump ... | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ConnectionError as e:  # the metadata store or the remote tier cannot be reached
        report([str(e)])
        return EXIT_FINDINGS
    except OSError as e:  # a path kts cannot read or write: read-only, full, a symbolic link loop, ...
        report([os_error_line(e)])
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if isinstance(e, _expected_errors()):
            report([(str(e).strip() or type(e).__name__).splitlines()[0]])
            return EXIT_FINDINGS
        gone = _store_went_away(e)
        if gone is not None:
            report([gone])
            return EXIT_FINDINGS
        raise


def _store_went_away(e: BaseException) -> str | None:
    """The line for a connection to the metadata store lost mid-command that reached the top
    unretried (a driver error, not MetadataStoreUnavailable); None for any other error."""
    if "sqlalchemy" not in sys.modules and "psycopg2" not in sys.modules:
        return None  # neither was used: it cannot be theirs
    from sqlalchemy.exc import DBAPIError

    from kts_resources.metadata import database

    try:
        import psycopg2
        raw = isinstance(e, psycopg2.OperationalError) and getattr(e, "pgcode", None) is None
    except ImportError:
        raw = False
    if not raw and not (isinstance(e, DBAPIError) and database.is_connection_error(e)):
        return None
    return f"metadata store at {_store_location()} went away: {database._first_line(e)}"


def _store_location() -> str:
    """``host:port/database`` of the store this command used, never the password, and without
    starting the embedded server to find out."""
    from kts_resources import settings
    from kts_resources.metadata import database, embedded

    try:
        configured = settings.database_url()
        if configured:
            return database.describe_url(database.normalize_url(configured))
        server = embedded.recorded()
        return database.describe_url(server.url) if server is not None else f"{embedded.server_home()} (embedded)"
    except Exception:  # noqa: BLE001 - only a location for a message
        return "(unknown)"


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Errors a user meets through no bug of kts (a store down, a lock held, a bad setting): one line."""
    from kts_assets.broker_scope import BrokerScopeError
    from kts_resources.metadata.store import PartitionLockTimeout
    from kts_resources.remote_storage.base import RemoteStorageError

    return (RemoteStorageError, PartitionLockTimeout, TimeoutError, BrokerScopeError)


# Set by a finished `kts sync`: the process leaves without the interpreter's teardown (the Spark
# Connect client's channels, Dagster's threads, module finalisers: ~0.7 s of a no-op sync's ~7 s).
# Everything the pass wrote is committed by then, and stdout/stderr are flushed first.
_leave_without_teardown = [False]


def entry_point(argv: Sequence[str] | None = None) -> None:
    """``kts``: a sync runs in the standing CLI server of KTS_HOME (``kts_assets.cli_server``),
    every other command (and a sync with KTS_CLI_SERVER=off) in this process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in SERVED_COMMANDS:
        status = _in_cli_server(args)
        if status is not None:
            sys.exit(status)
    run_here(args)


def _in_cli_server(args: list[str]) -> int | None:
    """The command's exit status from the CLI server; None when it is to run in this process
    (switched off, or a server that cannot be started: said in one line, then run here)."""
    from kts_assets import cli_server
    from kts_resources import settings

    try:
        if not settings.cli_server_enabled():
            return None
    except ValueError as e:  # KTS_CLI_SERVER is neither on nor off
        report([str(e)])
        return EXIT_FINDINGS
    try:
        return cli_server.run_command(cli_server.state_dir(settings.kts_home()), args)
    except (cli_server.CliServerError, OSError) as e:
        report([f"{e}; running the command in this process"])
        return None


def run_here(argv: Sequence[str] | None = None) -> None:
    """The command in this process, then the process's exit with its status."""
    # CPython collects generation 0 every 700 allocations by default; importing Dagster, PySpark and
    # SQLAlchemy makes millions, so a command spent a fifth of its start-up in the collector.
    gc.set_threshold(50_000, 20, 20)
    status = main(argv)
    if _leave_without_teardown[0]:
        from kts_assets.sync import exit_now

        exit_now(status)
    sys.exit(status)


if __name__ == "__main__":
    # `python -m kts_assets.cli`: run the module's own copy, so that commands defined in other
    # modules (kts_assets.cli_read) raise the same CommandError this main() catches.
    from kts_assets.cli import entry_point as module_entry_point

    module_entry_point()
