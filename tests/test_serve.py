"""`kts serve`: any Kafka consumer reads the tiered log (issue 29, the read side).

A simulated log dir (every codec, idempotent and transactional producers with aborts) is copied to
a file tier and its closed segments are deleted locally, so only the tier holds them; `kts serve`
runs as its own process on a free loopback port, and real clients read it: kafka-python's
KafkaConsumer (read_uncommitted and read_committed), raw frames for what a consumer never sends
(a Produce, an ApiVersions of a future version, garbage). What they read is compared with
kafka-python's own record reader over copies of the original segment files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecords

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.partition import TopicPartition as KafkaTopicPartition
from kts_resources.remote_log import RemoteLogSegmentState, TopicIdPartition
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .conftest import REPO_ROOT
from .test_sync_outcome import kts, sync_env
from .partition_steps import copy_each_partition

TOPIC = "orders"
PARTITIONS = 2
CONFIG = SimulationConfig(seed=29, topics=(TOPIC,), partitions=PARTITIONS, total_bytes=600 * 1024, segment_bytes=48 * 1024,
                          codecs=("none", "gzip", "snappy", "lz4", "zstd"), transactional_producers=2,
                          transactional_ratio=0.4, abort_ratio=0.4)


# --- the independent decoder: kafka-python's record reader over the original segment files -------


def original_batches(partition_dir: Path) -> list:
    batches = []
    for log in sorted(partition_dir.glob("*.log")):
        records = MemoryRecords(log.read_bytes())
        while (batch := records.next_batch()) is not None:
            batches.append(batch)
    return batches


def original_records(partition_dir: Path, *, read_committed: bool) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every data record, in offset order; with
    ``read_committed``, without the records of aborted transactions (told by their ABORT markers)."""
    batches = original_batches(partition_dir)
    aborted: set[tuple[int, int]] = set()  # (producer id, base offset) of aborted transactional batches
    open_batches: dict[int, list[int]] = {}
    for batch in batches:
        if batch.is_control_batch:
            marker = next(iter(batch))
            if struct.unpack(">hh", marker.key)[1] == 0:  # ABORT
                aborted.update((batch.producer_id, base) for base in open_batches.get(batch.producer_id, []))
            open_batches.pop(batch.producer_id, None)
        elif batch.is_transactional:
            open_batches.setdefault(batch.producer_id, []).append(batch.base_offset)
    out = []
    for batch in batches:
        if batch.is_control_batch or (read_committed and (batch.producer_id, batch.base_offset) in aborted):
            continue
        out += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    return out


# --- the tiered partition and the server -----------------------------------------------------------


def delete_copied_segments(log_dir: Path, topic_partition, copied_to: int) -> None:
    """Every closed segment the tier holds whole, deleted locally (as the broker's local retention would)."""
    partition = LogDir(log_dir).partition_dir(topic_partition)
    for segment in partition.segments():
        if segment.next_base_offset is not None and segment.next_base_offset - 1 <= copied_to:
            for f in segment.log.parent.glob(segment.log.name.removesuffix(".log") + ".*"):
                f.unlink()
    assert partition.segments()[0].base_offset > 0  # the first offsets are in the tier only


@pytest.fixture
def tiered(tmp_path, pg_url, metadata_store):
    """orders-0 and orders-1 copied to a file tier, every copied segment then deleted locally;
    the original partition dirs kept aside for the independent decoder."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, CONFIG)
    originals = tmp_path / "originals"
    shutil.copytree(log_dir, originals)
    remote = tmp_path / "remote"
    results = copy_each_partition(LogDir(log_dir), metadata_store, remote_storage_from_uri(remote.as_uri()))
    for result in results:
        assert result.copied, result
        delete_copied_segments(log_dir, result.topic_partition, max(md.end_offset for md in result.copied))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote.as_uri()}
    return env, originals


class Served:
    def __init__(self, process: subprocess.Popen, port: int, stderr: Path, env: dict):
        self.process, self.port, self.stderr, self.env = process, port, stderr, env

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.stderr.read_text()


def start_serve(env: dict, tmp_path: Path, *args: str) -> Served:
    """``kts serve ARGS`` (``--listen 127.0.0.1:0`` unless ARGS say where), once it listens."""
    stderr = tmp_path / "serve.stderr"
    listen = () if "--listen" in args or "--default-listen" in args else ("--listen", "127.0.0.1:0")
    args = tuple(a for a in args if a != "--default-listen")
    process = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "serve", *listen, *args],
                               env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        pytest.fail(f"kts serve did not start: {line!r} {stderr.read_text()[-3000:]}")
    port = int(line.split("listening on ")[1].split(",")[0].rsplit(":", 1)[1])
    return Served(process, port, stderr, env)


@pytest.fixture
def served(tiered, tmp_path):
    env, originals = tiered
    server = start_serve(env, tmp_path)
    try:
        yield server, originals
    finally:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)
            try:
                server.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.process.kill()


def consume_all(bootstrap: str, partition: int, isolation: str = "read_uncommitted", **config) -> tuple[list[tuple], int]:
    """Every record of the partition from its beginning to its end, and that end (ListOffsets latest)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation,
                             consumer_timeout_ms=20_000, **config)
    try:
        tp = TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        got = []
        deadline = time.monotonic() + 120
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]
        return got, end
    finally:
        consumer.close()


# --- raw frames ---------------------------------------------------------------------------------


class Connection:
    """One TCP connection speaking frames built by kafka-python's protocol classes."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.correlation_id = 0

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request(self, request, response_class):
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="test_serve")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        frame = self.read_frame()
        response = response_class.decode(frame, version=request.API_VERSION, header=True)
        assert response.header.correlation_id == self.correlation_id
        return response

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self._read(4))[0]
        return self._read(size)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def fetch_request(partition: int | tuple[int, ...], offset: int, max_wait_ms: int, max_bytes: int = 1 << 20):
    """A Fetch v11 of TOPIC's partition(s) at ``offset``, as a consumer sends it (no fetch session)."""
    partitions = (partition,) if isinstance(partition, int) else partition
    return FetchRequest[11](replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                            session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[
                                FetchRequest.FetchTopic.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=offset,
                                                                       log_start_offset=-1, partition_max_bytes=1 << 20)
                                for p in partitions])],
                            forgotten_topics_data=[], rack_id="")


def metadata_answers(conn: Connection) -> list[str]:
    response = conn.request(MetadataRequest[8](topics=None, allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False,
                                               include_cluster_authorized_operations=False), MetadataResponse)
    return sorted(t.name for t in response.topics)


# --- the tests ----------------------------------------------------------------------------------


def test_kafka_python_consumer_reads_every_tiered_record_from_offset_0_as_the_original_log_holds_it(served):
    server, originals = served
    for partition in range(PARTITIONS):
        got, end = consume_all(server.bootstrap, partition)
        expected = [r for r in original_records(originals / f"{TOPIC}-{partition}", read_committed=False) if r[0] < end]
        assert len(expected) > 500 and expected[0][0] == 0
        assert got == expected, f"partition {partition}: {len(got)} records read, {len(expected)} in the log below {end}"


def test_read_committed_consumer_gets_no_aborted_record_and_every_committed_one(served):
    server, originals = served
    for partition in range(PARTITIONS):
        got, stable_end = consume_all(server.bootstrap, partition, "read_committed")
        everything = original_records(originals / f"{TOPIC}-{partition}", read_committed=False)
        committed = [r for r in original_records(originals / f"{TOPIC}-{partition}", read_committed=True) if r[0] < stable_end]
        assert got == committed
        assert len(committed) < len([r for r in everything if r[0] < stable_end])  # some were aborted: the test can fail


def test_offsets_for_times_answers_the_first_offset_at_or_after_the_timestamp_and_a_consumer_seeks_there(served):
    server, originals = served
    records = original_records(originals / f"{TOPIC}-0", read_committed=False)
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False, consumer_timeout_ms=20_000)
    try:
        tp = TopicPartition(TOPIC, 0)
        end = consumer.end_offsets([tp])[tp]
        for target in (records[5][1], records[len(records) // 3][1] + 1, records[0][1] - 1):
            want = min(r[0] for r in records if r[1] >= target and r[0] < end)
            answer = consumer.offsets_for_times({tp: target})[tp]
            assert answer.offset == want
            assert answer.timestamp == next(r[1] for r in records if r[0] == want)
        assert consumer.offsets_for_times({tp: 2**62})[tp] is None  # after every record: Kafka's −1
        consumer.assign([tp])
        consumer.seek(tp, answer.offset)
        first = next(iter(consumer))
        assert first.offset == answer.offset
        assert consumer.beginning_offsets([tp])[tp] == 0
    finally:
        consumer.close()


def list_offsets(conn: Connection, version: int, timestamp: int, isolation: int = 0):
    R = ListOffsetsRequest
    request = R[version](replica_id=-1, isolation_level=isolation, topics=[R.ListOffsetsTopic(name=TOPIC, partitions=[
        R.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])], timeout_ms=1000)
    [[answer]] = [t.partitions for t in conn.request(request, ListOffsetsResponse).topics]
    return answer


def test_list_offsets_specials_answer_as_the_reader_does_and_only_at_the_versions_that_have_them(served, metadata_store):
    server, originals = served
    env = server.env
    reader = TieredLogReader(log_dirs=[Path(env["KTS_LOG_DIRS"])], store=metadata_store,
                             rsm=remote_storage_from_uri(env["KTS_REMOTE_URI"]))
    partition = reader.partition(TOPIC, 0)
    conn = Connection(server.port)
    try:
        for timestamp, spec, isolation in ((-2, "earliest", 0), (-1, "latest", 0), (-1, "latest", 1), (-3, "max-timestamp", 0),
                                           (-4, "earliest-local", 0), (-5, "latest-tiered", 0)):
            answer = list_offsets(conn, 9, timestamp, isolation)
            want = partition.offsets(spec, "read_committed" if isolation else "read_uncommitted")
            assert (answer.error_code, answer.offset, answer.leader_epoch) == (0, want.offset, want.leader_epoch), spec
        assert list_offsets(conn, 9, -4).offset > 0  # the first segments are in the tier only
        assert list_offsets(conn, 7, -4).error_code == 35 and list_offsets(conn, 8, -5).error_code == 35
        assert list_offsets(conn, 9, -9).error_code == 42  # INVALID_REQUEST: no such special
    finally:
        conn.close()


def test_a_produce_is_refused_with_the_authorization_error_and_the_connection_still_serves(served):
    server, _ = served
    conn = Connection(server.port)
    try:
        produce = ProduceRequest[8](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
            ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"")])])
        response = conn.request(produce, ProduceResponse)
        [[refused]] = [t.partition_responses for t in response.responses]
        assert (response.responses[0].name, refused.index, refused.error_code) == (TOPIC, 0, 29)  # TOPIC_AUTHORIZATION_FAILED
        assert metadata_answers(conn) == [TOPIC]
    finally:
        conn.close()
    assert "refused Produce" in server.log()


def test_an_api_versions_request_of_a_future_version_gets_the_v0_answer_with_error_35_and_the_ranges(served):
    server, _ = served
    conn = Connection(server.port)
    try:
        conn.correlation_id = 41
        # Header v1 by hand is what KIP-511 relies on: a client of a newer version writes it the same way.
        header = struct.pack(">hhih", 18, 99, 42, 4) + b"test"
        conn.send_frame(header + b"\x00\x00")
        frame = conn.read_frame()
        response = ApiVersionsResponse.decode(frame, version=0, header=True)
        assert response.header.correlation_id == 42 and response.error_code == 35
        ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert ranges[18] == (0, 4) and ranges[1][0] == 4 and ranges[2][0] <= 1 <= ranges[2][1]
        # The client retries with a version in the range, on the same connection.
        answer = conn.request(ApiVersionsRequest[3](client_software_name="test", client_software_version="1"), ApiVersionsResponse)
        assert answer.error_code == 0 and {k.api_key for k in answer.api_keys} == set(ranges)
    finally:
        conn.close()


@pytest.mark.parametrize("frame, said", [
    (struct.pack(">i", 1 << 30), "request frame of 1073741824 bytes"),  # oversized
    (struct.pack(">i", -5), "request frame of -5 bytes"),  # negative
    (struct.pack(">i", 20) + b"\x00\x01\x00", "bytes into a 20-byte request"),  # truncated, then the client leaves
    (struct.pack(">i", 6) + b"\x00\x01\x00\x04\xff\xff", "does not decode"),  # garbage after a Fetch header's start
    (struct.pack(">i", 10) + struct.pack(">hhih", 77, 0, 1, -1), "API key 77"),  # an API not served
], ids=["oversized", "negative-size", "truncated", "garbage", "api-not-served"])
def test_a_malformed_frame_closes_only_its_connection_with_one_log_line(served, frame, said):
    server, _ = served
    bad = Connection(server.port)
    good = Connection(server.port)
    try:
        assert metadata_answers(good) == [TOPIC]
        bad.sock.sendall(frame)
        if said == "bytes into a 20-byte request":
            bad.sock.shutdown(socket.SHUT_WR)
        assert bad.closed_by_server()
        assert metadata_answers(good) == [TOPIC]
    finally:
        bad.close()
        good.close()
    deadline = time.monotonic() + 5
    while said not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for line in server.log().splitlines() if said in line]
    assert len(lines) == 1, server.log()
    assert server.process.poll() is None


def test_a_fetch_at_the_high_watermark_waits_max_wait_ms_then_returns_empty(served):
    server, _ = served
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap)
    tp = TopicPartition(TOPIC, 0)
    end = consumer.end_offsets([tp])[tp]
    consumer.close()
    conn = Connection(server.port)
    try:
        def fetch(offset: int, max_wait_ms: int):
            started = time.monotonic()
            response = conn.request(fetch_request(0, offset, max_wait_ms), FetchResponse)
            return response.responses[0].partitions[0], time.monotonic() - started

        at_end, waited = fetch(end, 700)
        assert (at_end.error_code, at_end.records, at_end.high_watermark) == (0, b"", end) and waited >= 0.65
        beyond, _ = fetch(end + 10_000, 0)
        assert beyond.error_code == 1  # OFFSET_OUT_OF_RANGE
        first, waited = fetch(0, 5000)
        assert first.error_code == 0 and first.records and first.log_start_offset == 0 and waited < 4
    finally:
        conn.close()


def test_the_partitions_of_one_fetch_are_all_answered_within_max_bytes_but_never_without_a_first_batch(served):
    server, _ = served
    conn = Connection(server.port)
    try:
        both = conn.request(fetch_request((0, 1), 0, 0), FetchResponse).responses[0].partitions
        assert [(part.partition_index, part.error_code, bool(part.records)) for part in both] == [(0, 0, True), (1, 0, True)]
        # max_bytes 1: the first partition's first batch still goes out whole (KIP-74); the second waits its turn.
        tight = conn.request(fetch_request((0, 1), 0, 0, max_bytes=1), FetchResponse).responses[0].partitions
        first = MemoryRecords(tight[0].records).next_batch()
        assert first is not None and first.base_offset == 0 and tight[1].records == b"" and tight[1].error_code == 0
        assert len(tight[0].records) < len(both[0].records)
    finally:
        conn.close()


def test_the_fetch_quota_shows_as_throttle_time_ms_and_an_empty_partition_never_a_stall(tiered, tmp_path):
    env, _ = tiered
    # Hour-long quota windows: the second fetch still sees the first one's bytes on a slow machine.
    assert kts(env, "broker-config", "set", "remote.log.manager.fetch.max.bytes.per.second=1",
               "remote.log.manager.fetch.quota.window.size.seconds=3600").returncode == 0
    server = start_serve(env, tmp_path)
    conn = Connection(server.port)
    try:
        admitted = conn.request(fetch_request(0, 0, 0), FetchResponse)
        assert admitted.throttle_time_ms == 0 and admitted.responses[0].partitions[0].records
        started = time.monotonic()
        throttled = conn.request(fetch_request(0, 0, 5000), FetchResponse)
        [part] = throttled.responses[0].partitions
        assert throttled.throttle_time_ms > 1000 and (part.error_code, part.records) == (0, b"")
        assert time.monotonic() - started < 2  # answered at once, not after max_wait_ms
    finally:
        conn.close()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=20) == 0


def test_with_9092_taken_the_default_listen_is_a_free_loopback_port_and_says_so(tiered, tmp_path):
    env, _ = tiered
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 9092))
        holder.listen()
    except OSError:
        pass  # someone else holds it: taken all the same
    try:
        server = start_serve(env, tmp_path, "--default-listen", "--advertised", "localhost:0")
        try:
            assert server.port != 9092
            assert "127.0.0.1:9092 is taken" in server.log()
            conn = Connection(server.port)
            broker = conn.request(MetadataRequest[8](topics=None, allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False,
                                                     include_cluster_authorized_operations=False), MetadataResponse).brokers[0]
            conn.close()
            assert (broker.node_id, broker.host, broker.port) == (0, "localhost", server.port)
        finally:
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=20) == 0
    finally:
        holder.close()


def test_kts_services_lists_serve_and_sigterm_stops_it_within_seconds(served):
    server, _ = served
    listed = subprocess.run([sys.executable, "-m", "kts_assets.cli", "services", "--json"], env=server.env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    [entry] = [s for s in json.loads(listed.stdout) if s["kind"] == "serve"]
    assert (entry["state"], entry["pid"], entry["port"]) == ("running", server.process.pid, server.port)
    # --all finds it by its process, whichever KTS_HOME it serves.
    everywhere = subprocess.run([sys.executable, "-m", "kts_assets.cli", "services", "--all", "--under",
                                 str(Path(server.env["KTS_HOME"]).parent), "--json"],
                                env={**server.env, "KTS_HOME": str(Path(server.env["KTS_HOME"]).parent / "elsewhere")},
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    [found] = [s for s in json.loads(everywhere.stdout) if s["kind"] == "serve"]
    assert (found["pid"], found["port"], found["kts_home"], found["orphan"]) == (server.process.pid, server.port,
                                                                              server.env["KTS_HOME"], False)
    # A fetch is in flight (waiting 25 s at the end of the log) when the stop comes: the drain
    # answers it, empty, and the server exits within seconds.
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap)
    end = consumer.end_offsets([TopicPartition(TOPIC, 0)])[TopicPartition(TOPIC, 0)]
    consumer.close()
    conn = Connection(server.port)
    answered: list = []
    waiting = threading.Thread(target=lambda: answered.append(conn.request(fetch_request(0, end, 25_000), FetchResponse)))
    waiting.start()
    time.sleep(0.5)
    started = time.monotonic()
    stopped = subprocess.run([sys.executable, "-m", "kts_assets.cli", "services", "stop"], env=server.env, cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
    assert "serve" in stopped.stdout, stopped.stdout + stopped.stderr
    assert server.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 10
    waiting.join(timeout=10)
    conn.close()
    [response] = answered
    assert response.responses[0].partitions[0].records == b""
    assert not (Path(server.env["KTS_HOME"]) / "serve" / "server.json").exists()


@pytest.mark.spark  # kts sync on the session's Spark Connect server (tests/fixtures_spark.py)
def test_partitions_tiered_by_kts_sync_are_read_whole_by_a_consumer_once_their_local_segments_are_gone(tmp_path, pg_url, metadata_store):
    log_dir = tmp_path / "logs"
    simulate(log_dir, CONFIG)
    originals = tmp_path / "originals"
    shutil.copytree(log_dir, originals)
    env = sync_env(tmp_path, log_dir, pg_url, session_spark=True)
    synced = kts(env, "sync")
    assert synced.returncode == 0, synced.stderr[-3000:]
    for partition in range(PARTITIONS):
        tip = TopicIdPartition(metadata_store.topic_id(TOPIC), KafkaTopicPartition(TOPIC, partition))
        finished = metadata_store.list_remote_log_segments(tip, states=[RemoteLogSegmentState.COPY_SEGMENT_FINISHED])
        delete_copied_segments(log_dir, tip.topic_partition, max(md.end_offset for md in finished))
    server = start_serve(env, tmp_path)
    try:
        for partition in range(PARTITIONS):
            got, end = consume_all(server.bootstrap, partition)
            assert got == [r for r in original_records(originals / f"{TOPIC}-{partition}", read_committed=False) if r[0] < end]
            got, end = consume_all(server.bootstrap, partition, "read_committed")
            assert got == [r for r in original_records(originals / f"{TOPIC}-{partition}", read_committed=True) if r[0] < end]
    finally:
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=20) == 0
