"""`kts serve` read by Kafka consumers (issue 29): one consumer against the reader's own replay, 4
consumers against 1 over 8 partitions, remote requests per MiB against `kts fetch`, and the
server's peak RSS while 50 consumers read.

    .venv/bin/python bench/serve_bench.py [--mib 1024] [--multi-mib 256] [--s3-mib 64] [--consumers 50] [--quick] [--json PATH]

Simulated partitions (64 KiB producer batches of 1 KiB records, codecs none/lz4/zstd, 8 MiB
segments) are copied to a directory tier, their remote log indexes built and every closed segment
removed locally, so nearly everything is read from the tier.

- one confluent-kafka (librdkafka) consumer reads the ``--mib`` partition from offset 0 to its end
  through `kts serve` (a process of its own), against ``PartitionReader.replay`` of the same
  partition in this process (goal ≥ 0.5). Four measurements say what bounds the consumer: a raw
  Fetch loop over one connection (the same 1 MiB per partition librdkafka asks for, the records
  not decoded, though kafka-python decodes each response and walks its batch headers) is the
  server with a light client; the consumer process's CPU time over its wall time says whether the
  client was busy all along, and replay's time over that CPU time is the consumer's ceiling (its
  own decoding alone, never waiting); and the same consumer asking 8 MiB a fetch
  (``max.partition.fetch.bytes``) shows what one request's fixed cost weighs. The consumer ends at
  its partition's EOF, which librdkafka raises on a fetch at the high watermark: one
  ``fetch.wait.max.ms`` (500 ms) wait, as against a broker;
- 8 partitions (``--multi-mib`` in all) read by 4 consumer processes (2 partitions each) against
  1 consumer process reading all 8 (goal ≥ 1.6 on 2 cores), each time from a fresh start of the
  consumers, the server kept. The consumers start reading together (a barrier once each has made
  its consumer, so the later processes' start-up is not counted against the first's reading), and
  the throughput is to the last record each receives; the time to the end-of-partition, one more
  ``fetch.wait.max.ms`` at the high watermark that 1 consumer and 4 pay alike, is shown beside it;
- remote requests per MiB fetched, counted on the S3 client's HTTP layer (botocore's
  ``before-send``, against moto's S3 server), one consumer through a `kts serve` server in this
  process against the sequential 1 MiB fetch loop of `kts fetch` with its remote log index cached
  (goal ≤ 1.1);
- the peak RSS (VmHWM) of a fresh `kts serve` while ``--consumers`` consumers (threads of this
  process) each read ``--consumer-mib`` of one of the 8 partitions (goal ≤ 512 MiB).

Prints a table on stdout, progress on stderr, and writes JSON (default bench/results/serve.json).
The ratios are of one run; the machine's load is recorded beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, bench_database, copy_pass, format_rows, git_state, progress, write_json

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.reading.chunk_cache import ChunkCache
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState

MiB = 1024 * 1024
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
ONE, MULTI, S3_TOPIC = "serve-one", "serve-multi", "serve-s3"
PARTITION_EOF = -191  # librdkafka's _PARTITION_EOF
CONSUME_TIMEOUT_S = 0.1


# --- the tiered partitions ------------------------------------------------------------------------


def tier_topic(logs: Path, home: Path, store: RemoteLogMetadataStore, storage, topic: str, partitions: int, mib: int) -> None:
    """``topic`` simulated into ``logs``, copied, its remote log indexes built under ``home``, and
    every segment the tier holds removed locally."""
    simulate(logs, SimulationConfig(seed=29, topics=(topic,), partitions=partitions, total_bytes=mib * MiB,
                                    segment_bytes=8 * MiB, batch_size=64 * 1024, record_size=1024,
                                    transactional_producers=0, codecs=("none", "lz4", "zstd")))
    copy_pass(LogDir(logs), store, storage)
    for tip in [t for t in store.partitions() if t.topic == topic]:
        index_tier.update_partition_index(store, storage, index_cache.cache_directory(home, tip), tip,
                                          lambda md: index_cache.read_segment_entries(storage, md))
        for md in store.list_remote_log_segments(tip, states={FINISHED}):
            for f in (logs / f"{topic}-{tip.partition}").glob(f"{md.start_offset:020d}.*"):
                f.unlink()


# --- consumers ------------------------------------------------------------------------------------


def consume(bootstrap: str, topic: str, partitions: list[int], max_bytes: int | None = None, start=None, **config) -> dict:
    """A confluent-kafka consumer reading ``partitions`` from their beginning to their ends (or
    ``max_bytes`` of values each): messages, value bytes, wall and CPU seconds, wall-clock start and end.
    ``start``: a barrier the consumer waits at once made, so consumers in several processes read
    from the same moment (not one while the next process is still starting)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "serve-bench", "enable.auto.commit": False,
                         "enable.partition.eof": True, **config})
    if start is not None:
        start.wait()
    cpu, start = time.process_time(), time.time()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    done: set[int] = set()
    read = {p: 0 for p in partitions}
    messages, last = 0, None
    while len(done) < len(partitions):
        # A short timeout: consume() returns a partial batch only when it runs out, so a second's
        # timeout held the last records (and the EOF) up to a second past their arrival.
        for m in consumer.consume(10_000, CONSUME_TIMEOUT_S):
            if m.error():
                if m.error().code() == PARTITION_EOF:
                    done.add(m.partition())
                    continue
                raise RuntimeError(m.error())
            messages += 1
            last = time.time()
            read[m.partition()] += len(m.value() or b"")
            if max_bytes is not None and read[m.partition()] >= max_bytes and m.partition() not in done:
                done.add(m.partition())
                consumer.pause([TopicPartition(topic, m.partition())])
    end = time.time()
    consumer.close()
    return {"messages": messages, "bytes": sum(read.values()), "wall_s": end - start, "start": start, "end": end,
            "last_record": last if last is not None else end, "cpu_s": time.process_time() - cpu}


def consume_in_processes(bootstrap: str, topic: str, groups: list[list[int]], **config) -> dict:
    """One consumer process per group of partitions, all at once: wall time from the first start to the last end."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(len(groups)) as pool:
        start = manager.Barrier(len(groups))
        results = pool.starmap(consume_with, [(bootstrap, topic, group, config, start) for group in groups])
    start = min(r["start"] for r in results)
    return {"messages": sum(r["messages"] for r in results), "bytes": sum(r["bytes"] for r in results),
            "wall_s": max(r["end"] for r in results) - start,
            # Until the last record arrived: the end-of-partition answer after it waits fetch.wait.max.ms
            # at the high watermark (librdkafka's 500 ms, as a broker holds it), the same for 1 consumer or 4.
            "records_s": max(r["last_record"] for r in results) - start, "each": results}


def consume_with(bootstrap: str, topic: str, partitions: list[int], config: dict, start) -> dict:
    return consume(bootstrap, topic, partitions, start=start, **config)


def raw_fetch_loop(port: int, topic: str, end: int, partition_max_bytes: int = MiB) -> dict:
    """The server alone: Fetch v11 requests one after the other over one connection, each for the
    next 1 MiB of the partition, the records taken as bytes (not decoded)."""
    import socket
    import struct

    from kafka.protocol.consumer import FetchRequest, FetchResponse
    from kafka.record import MemoryRecords

    sock = socket.create_connection(("127.0.0.1", port))
    offset, size, started, correlation = 0, 0, time.perf_counter(), 0
    try:
        while offset < end:
            correlation += 1
            request = FetchRequest[11](replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=50 * MiB, isolation_level=0,
                                       session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                                           FetchRequest.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1,
                                                                                  fetch_offset=offset, log_start_offset=-1,
                                                                                  partition_max_bytes=partition_max_bytes)])],
                                       forgotten_topics_data=[], rack_id="")
            request.with_header(correlation_id=correlation, client_id="serve-bench")
            sock.sendall(bytes(request.encode(header=True, framed=True)))
            frame = _read(sock, struct.unpack(">i", _read(sock, 4))[0])
            records = FetchResponse.decode(frame, version=11, header=True).responses[0].partitions[0].records
            size += len(records)
            # The next offset: the last batch's last offset + 1 (its header only, not its records).
            batches, last = MemoryRecords(records), None
            while (batch := batches.next_batch()) is not None:
                last = batch
            offset = last.base_offset + last.last_offset_delta + 1
    finally:
        sock.close()
    return {"bytes": size, "wall_s": time.perf_counter() - started}


def _read(sock, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 4 * MiB))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


# --- kts serve --------------------------------------------------------------------------------------


class ServeProcess:
    def __init__(self, env: dict, stderr: Path):
        self.process = subprocess.Popen([sys.executable, "-m", "kts_assets.cli", "serve", "--listen", "127.0.0.1:0"], env=env,
                                         cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise SystemExit(f"kts serve did not start: {line!r}\n{stderr.read_text()[-3000:]}")
        self.port = int(line.split("listening on ")[1].split(",")[0].rsplit(":", 1)[1])
        self.bootstrap = f"127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        """The server's CPU seconds so far (user + system)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


# --- remote requests per MiB at an S3 endpoint -----------------------------------------------------


def requests_per_mib(tmp: Path, url: str, mib: int) -> dict:
    import boto3
    from moto.server import ThreadedMotoServer

    from kts_resources.remote_storage.factory import s3_client
    from kts_resources.remote_storage.s3 import S3RemoteStorage
    from kts_resources.serving.server import KafkaReadServer

    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    store = RemoteLogMetadataStore.from_url(url)
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="serve")
        client = s3_client(endpoint)
        sent: list[str] = []
        client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.method))
        storage = S3RemoteStorage(client, "serve", "tiered")
        logs, home = tmp / "s3-logs", tmp / "s3-home"
        tier_topic(logs, home, store, storage, S3_TOPIC, 1, mib)

        def reader(cache: str) -> TieredLogReader:
            return TieredLogReader(log_dirs=[logs], store=store, rsm=storage, home=home, chunk_cache=ChunkCache(tmp / cache))

        # `kts fetch`: 1 MiB fetches one after the other, the remote log index cached.
        part = reader("fetch-cache").partition(S3_TOPIC, 0)
        sent.clear()
        position, fetched = part.log_start_offset, 0
        while position < part.high_watermark:
            result = part.fetch(position, MiB)
            fetched += sum(b.size for b in result.batches)
            position = result.next_offset
        fetch_requests = len(sent)

        # The same partition through kts serve (in this process: the requests are counted here).
        server = KafkaReadServer(reader("serve-cache"), "127.0.0.1", 0)
        outcome: dict = {}

        def listening(host: str, port: int, _advertised) -> None:
            loop = asyncio.get_running_loop()

            def read() -> None:
                try:
                    outcome.update(consume(f"{host}:{port}", S3_TOPIC, [0]))
                finally:
                    loop.call_soon_threadsafe(server.stop)

            sent.clear()
            threading.Thread(target=read, daemon=True).start()

        asyncio.run(server.run(listening))
        served_requests = len(sent)
        served_bytes = server.side.stats.bytes_served
        return {"fetch_requests": fetch_requests, "fetch_mib": fetched / MiB, "fetch_per_mib": fetch_requests / (fetched / MiB),
                "serve_requests": served_requests, "serve_mib": served_bytes / MiB,
                "serve_per_mib": served_requests / (served_bytes / MiB), "consumer": outcome}
    finally:
        store.close()
        moto.stop()


# --- main ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="the one consumer's partition (default 1024)")
    parser.add_argument("--multi-mib", type=int, default=256, help="the 8 partitions, in all (default 256)")
    parser.add_argument("--s3-mib", type=int, default=64, help="the partition on moto's S3 (default 64)")
    parser.add_argument("--consumers", type=int, default=50, help="consumers at once for the RSS (default 50)")
    parser.add_argument("--consumer-mib", type=int, default=16, help="what each of them reads (default 16)")
    parser.add_argument("--quick", action="store_true", help="32, 32 and 16 MiB, 10 consumers of 2 MiB: a smoke run")
    add_json_argument(parser, "serve")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.multi_mib, args.s3_mib, args.consumers, args.consumer_mib = 32, 32, 16, 10, 2
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kts-serve-bench-") as tmpdir, bench_database(Path(tmpdir)) as (url, db):
        tmp = Path(tmpdir)
        progress(f"counting remote requests per MiB at an S3 endpoint ({args.s3_mib} MiB)")
        requests = requests_per_mib(tmp, url, args.s3_mib)
        store = RemoteLogMetadataStore.from_url(url)
        remote = tmp / "remote"
        storage = remote_storage_from_uri(remote.as_uri())
        logs, home = tmp / "logs", tmp / "home"
        progress(f"tiering {args.mib} MiB in one partition and {args.multi_mib} MiB in 8")
        tier_topic(logs, home, store, storage, ONE, 1, args.mib)
        tier_topic(logs, home, store, storage, MULTI, 8, args.multi_mib)
        env = {**os.environ, "KTS_DATABASE_URL": url, "KTS_LOG_DIRS": str(logs), "KTS_HOME": str(home),
               "KTS_REMOTE_URI": remote.as_uri()}

        progress("replaying the partition (PartitionReader.replay)")
        reader = TieredLogReader(log_dirs=[logs], store=store, rsm=storage, home=home, chunk_cache=ChunkCache(tmp / "replay-cache"))
        part = reader.partition(ONE, 0)
        t = time.perf_counter()
        replay_bytes = sum(b.size for b in part.replay(part.log_start_offset))
        replay_s = time.perf_counter() - t
        end = part.high_watermark

        server = ServeProcess(env, tmp / "serve.stderr")
        try:
            progress("one consumer through kts serve")
            one = consume_in_processes(server.bootstrap, ONE, [[0]])
            progress("one consumer asking 8 MiB a fetch (max.partition.fetch.bytes) instead of librdkafka's 1 MiB")
            big = consume_in_processes(server.bootstrap, ONE, [[0]], **{"max.partition.fetch.bytes": 8 * MiB})
            progress("the raw Fetch loop through kts serve")
            raw = raw_fetch_loop(server.port, ONE, end)
            progress("8 partitions: 1 consumer, then 4")
            before = server.cpu_s()
            single = consume_in_processes(server.bootstrap, MULTI, [list(range(8))])
            between = server.cpu_s()
            four = consume_in_processes(server.bootstrap, MULTI, [[0, 1], [2, 3], [4, 5], [6, 7]])
            single["server_cpu_s"], four["server_cpu_s"] = between - before, server.cpu_s() - between
        finally:
            server.stop()

        progress(f"peak RSS of a fresh kts serve while {args.consumers} consumers read {args.consumer_mib} MiB each")
        server = ServeProcess(env, tmp / "serve-rss.stderr")
        try:
            rss_before = server.peak_rss_mib()
            results: list[dict] = []
            threads = [threading.Thread(target=lambda i=i: results.append(consume(
                server.bootstrap, MULTI, [i % 8], args.consumer_mib * MiB, **{"queued.max.messages.kbytes": 4096})))
                for i in range(args.consumers)]
            t = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rss_wall = time.perf_counter() - t
            rss = server.peak_rss_mib()
        finally:
            server.stop()
        store.close()
        reader.close()
        assert len(results) == args.consumers

    replay_mb_s = replay_bytes / MiB / replay_s
    one_mb_s = one["bytes"] / MiB / one["wall_s"]
    record_bytes_share = one["bytes"] / replay_bytes  # values only, of the batches' bytes: MB/s on the same footing
    ratios = {
        "consumer_over_replay": (one["wall_s"] and replay_s / one["wall_s"]),
        "raw_fetch_over_replay": replay_s / raw["wall_s"],
        "consumer_8mib_fetches_over_replay": replay_s / big["wall_s"],
        "consumer_cpu_over_wall": one["each"][0]["cpu_s"] / one["each"][0]["wall_s"],
        # The most the consumer could reach were it never waiting for the server: its own work alone.
        "replay_over_consumer_cpu": replay_s / one["each"][0]["cpu_s"],
        "four_over_one": single["records_s"] / four["records_s"],
        "four_over_one_to_eof": single["wall_s"] / four["wall_s"],
        # The most 4 could reach on this machine's cores, were nothing ever waiting: 1 consumer's
        # time over the CPU time the 4 and the server spent, spread over every core.
        "four_over_one_cpu_ceiling": single["records_s"] / (
            (four["server_cpu_s"] + sum(e["cpu_s"] for e in four["each"])) / (os.cpu_count() or 1)),
        "requests_serve_over_fetch": requests["serve_per_mib"] / requests["fetch_per_mib"],
    }
    rows = [("measure", "value"),
            (f"one consumer / replay, same partition ({replay_bytes / MiB:.0f} MiB), time ratio (goal ≥ 0.5)",
             f"{ratios['consumer_over_replay']:.2f}"),
            ("  raw Fetch loop (server alone, records not decoded) / replay", f"{ratios['raw_fetch_over_replay']:.2f}"),
            ("  the consumer asking 8 MiB a fetch instead of 1 / replay", f"{ratios['consumer_8mib_fetches_over_replay']:.2f}"),
            ("  consumer process CPU / wall (1.0: the client was busy all along)", f"{ratios['consumer_cpu_over_wall']:.2f}"),
            ("  replay / the consumer's CPU time (its ceiling: the client's own work, never waiting)",
             f"{ratios['replay_over_consumer_cpu']:.2f}"),
            ("8 partitions: 4 consumers / 1, throughput to the last record (goal ≥ 1.6)", f"{ratios['four_over_one']:.2f}"),
            ("  the same to every partition's end-of-partition (+ fetch.wait.max.ms at the high watermark)",
             f"{ratios['four_over_one_to_eof']:.2f}"),
            ("  its ceiling: 1 consumer's time / (the 4 consumers' and the server's CPU time / cores)",
             f"{ratios['four_over_one_cpu_ceiling']:.2f}"),
            ("remote requests per MiB: kts serve / kts fetch (goal ≤ 1.1)",
             f"{ratios['requests_serve_over_fetch']:.2f} ({requests['serve_per_mib']:.3f} / {requests['fetch_per_mib']:.3f})"),
            (f"peak RSS of kts serve, {args.consumers} consumers (goal ≤ 512 MiB)", f"{rss:.0f} MiB"),
            ]
    print("\n".join(format_rows(rows, right={1})))
    load_after = os.getloadavg()
    print(f"replay {replay_mb_s:.0f} MB/s; consumer {one['wall_s']:.1f} s ({one['messages']} messages, values "
          f"{one_mb_s:.0f} MB/s = {record_bytes_share:.2f} of the batch bytes); raw Fetch {raw['bytes'] / MiB / raw['wall_s']:.0f} MB/s; "
          f"8 partitions {single['records_s']:.1f} s with 1 consumer, {four['records_s']:.1f} s with 4 "
          f"({single['wall_s']:.1f} and {four['wall_s']:.1f} s to the end-of-partition; server CPU {single['server_cpu_s']:.2f} "
          f"and {four['server_cpu_s']:.2f} s, consumers' {sum(e['cpu_s'] for e in single['each']):.2f} and "
          f"{sum(e['cpu_s'] for e in four['each']):.2f} s); "
          f"RSS {rss_before:.0f} MiB at start, {rss_wall:.1f} s of reading; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after, {os.cpu_count()} CPUs; {time.monotonic() - started:.0f} s")
    write_json(args.json, {"params": vars(args) | {"json": str(args.json)}, "ratios": ratios,
                           "replay": {"bytes": replay_bytes, "s": replay_s}, "one_consumer": one, "one_consumer_8mib_fetches": big, "raw_fetch": raw,
                           "multi": {"one": single, "four": four}, "requests": requests,
                           "rss": {"peak_mib": rss, "at_start_mib": rss_before, "consumers": args.consumers, "wall_s": rss_wall},
                           "load_average": {"before": load_before, "after": load_after}, "database": db, "git": git_state()})


if __name__ == "__main__":
    main()
