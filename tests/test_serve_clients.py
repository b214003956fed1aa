"""`kts serve` read by independent Kafka clients besides kafka-python (tests/test_serve.py):
confluent-kafka (librdkafka), aiokafka and kcat each consume every record of the tiered partitions
from offset 0 to the end, equal to kafka-python's record reader over the original segment files,
and under read_committed without the aborted transactions' records."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from .test_serve import PARTITIONS, TOPIC, original_records, served, tiered  # noqa: F401 - fixtures

ISOLATIONS = ("read_uncommitted", "read_committed")


def expected(originals, partition: int, isolation: str, end: int) -> list[tuple]:
    records = original_records(originals / f"{TOPIC}-{partition}", read_committed=isolation == "read_committed")
    assert len(records) > 500
    return [r for r in records if r[0] < end]


def confluent_consume(bootstrap: str, partition: int, isolation: str) -> tuple[list[tuple], int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kts-serve-test", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True})
    try:
        _low, end = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=20)
        if isolation == "read_committed":
            # librdkafka's watermarks are read_uncommitted's; the stable end is ListOffsets' answer.
            end = consumer.offsets_for_times([TopicPartition(TOPIC, partition, -1)], timeout=20)[0].offset
        consumer.assign([TopicPartition(TOPIC, partition, OFFSET_BEGINNING)])
        got, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF: the end of what is fetchable
                    break
                raise AssertionError(message.error())
            got.append((message.offset(), message.timestamp()[1], message.key(), message.value(),
                        [(k, v) for k, v in (message.headers() or [])]))
        return got, end
    finally:
        consumer.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_confluent_kafka_consumer_reads_every_record_as_the_original_log_holds_it(served, isolation):
    server, originals = served
    for partition in range(PARTITIONS):
        got, end = confluent_consume(server.bootstrap, partition, isolation)
        want = expected(originals, partition, isolation, end)
        assert got == want, f"partition {partition}: {len(got)} read, {len(want)} below {end}"


async def aiokafka_consume(bootstrap: str, partition: int, isolation: str) -> tuple[list[tuple], int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation)
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        got, deadline = [], time.monotonic() + 120
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]
        return got, end
    finally:
        await consumer.stop()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_aiokafka_consumer_reads_every_record_as_the_original_log_holds_it(served, isolation):
    server, originals = served
    for partition in range(PARTITIONS):
        got, end = asyncio.run(aiokafka_consume(server.bootstrap, partition, isolation))
        want = expected(originals, partition, isolation, end)
        assert got == want, f"partition {partition}: {len(got)} read, {len(want)} below {end}"


def end_offset(bootstrap: str, partition: int, isolation: str) -> int:
    """ListOffsets latest (the last stable offset under read_committed), asked by kafka-python."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        tp = TopicPartition(TOPIC, partition)
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def kcat_records(output: str) -> list[tuple]:
    """Lines of ``-f '%o\\t%T\\t%K\\t%k\\t%S\\t%s\\t%h\\n'``: a length of -1 is a null key or value;
    kcat prints a null header value as NULL (no simulated header value is that word)."""
    out = []
    for line in output.splitlines():
        offset, timestamp, key_len, key, value_len, value, headers = line.split("\t")
        pairs = [h.split("=", 1) for h in headers.split(",")] if headers else []
        headers = [(name, None if text == "NULL" else text.encode()) for name, text in pairs]
        out.append((int(offset), int(timestamp), None if key_len == "-1" else key.encode(),
                    None if value_len == "-1" else value.encode(), headers))
    return out


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (Debian's package kcat; .ci/setup installs it)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_kcat_consumes_from_the_beginning_to_the_end_every_record_as_the_original_log_holds_it(served, isolation):
    server, originals = served
    for partition in range(PARTITIONS):
        result = subprocess.run(["kcat", "-C", "-b", server.bootstrap, "-t", TOPIC, "-p", str(partition), "-e", "-o", "beginning",
                                 "-X", f"isolation.level={isolation}", "-f", "%o\t%T\t%K\t%k\t%S\t%s\t%h\n"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        got = kcat_records(result.stdout)
        want = expected(originals, partition, isolation, end_offset(server.bootstrap, partition, isolation))
        assert got == want and len(got) > 500
