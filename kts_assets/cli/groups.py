"""`kts groups [--json]`: the consumer groups that committed offsets through `kts serve` (kept in
the metadata store), per partition the committed offset, the log end offset (ListOffsets latest,
through the reader, as `kts offsets` answers it) and the lag between them, as Kafka's
kafka-consumer-groups.sh --describe shows them. Membership is not listed: it lives in the memory of
the `kts serve` coordinating the group."""

from __future__ import annotations

from kts_assets.cli.common import print_json, print_table
from kts_assets.cli.read import _reader

COLUMNS = ("group", "topic", "partition", "committed_offset", "log_end_offset", "lag")


def group_rows(reader) -> list[dict]:
    """One row per group and partition it committed, in group, topic, partition order; log end
    offset −1 and lag None for a partition kts no longer knows."""
    from kts_resources.metadata.group_offsets import GroupOffsets
    from kts_resources.reading.reader import ReadError

    rows = []
    for group_id, committed in GroupOffsets(reader.store.engine).all_groups().items():
        for offset in committed:
            try:
                end = reader.offsets(offset.topic, offset.partition, "latest").offset
            except ReadError:
                end = -1
            lag = max(0, end - offset.offset) if end >= 0 and offset.offset >= 0 else None
            rows.append({"group": group_id, "topic": offset.topic, "partition": offset.partition,
                         "committed_offset": offset.offset, "log_end_offset": end, "lag": lag})
    return rows


def cmd_groups(args) -> int:
    with _reader() as reader:
        rows = group_rows(reader)
    if args.json:
        print_json(rows)
    elif rows:
        print_table([{**row, "lag": "-" if row["lag"] is None else row["lag"]} for row in rows], COLUMNS)
    else:
        print("no consumer group has committed offsets")
    return 0


def add_groups_parser(sub) -> None:
    p = sub.add_parser("groups", help="consumer groups' committed offsets (through kts serve) and their lag")
    p.add_argument("--json", action="store_true", help="one object per group and partition")
    p.set_defaults(func=cmd_groups)
