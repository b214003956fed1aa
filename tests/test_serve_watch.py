"""`kts serve` is watchable: requests and errors per API, bytes served from each tier, throttle
time and malformed frames go into ``KTS_HOME/serve/stats.json`` every few seconds and at the stop,
and `kts serve --status` (and `kts services --json`) print them (issue 29, "Watchable")."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time

from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecords

from .conftest import REPO_ROOT
from .test_serve import Connection, fetch_request, list_offsets, served, tiered  # noqa: F401 - fixtures


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def status(env: dict) -> dict:
    result = cli(env, "serve", "--status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stats_when(env: dict, done, timeout_s: float = 10) -> dict:
    """`kts serve --status --json`'s stats once ``done(stats)`` holds (the file is rewritten every few seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = status(env)["stats"]
        if stats is not None and done(stats):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)


def bytes_below(records: bytes, offset: int) -> int:
    """The bytes of the batches in ``records`` that start below ``offset``."""
    batches = MemoryRecords(records)
    size = 0
    while (batch := batches.next_batch()) is not None:
        if batch.base_offset < offset:
            size += batch.size_in_bytes
    return size


def test_kts_serve_status_counts_requests_bytes_from_each_tier_and_errors_per_api_and_keeps_them_after_the_stop(served):
    server, _ = served
    conn = Connection(server.port)
    try:
        remote = conn.request(fetch_request(0, 0, 0), FetchResponse).responses[0].partitions[0]  # offset 0: tier only
        first_local = list_offsets(conn, 9, -4).offset  # earliest-local
        local = conn.request(fetch_request(0, first_local, 0), FetchResponse).responses[0].partitions[0]
        beyond = conn.request(fetch_request(0, 1 << 40, 0), FetchResponse).responses[0].partitions[0]
        assert remote.records and local.records and beyond.error_code == 1  # OFFSET_OUT_OF_RANGE: a Fetch error
        refused = conn.request(ProduceRequest[8](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
            ProduceRequest.TopicProduceData(name="orders", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"")])]), ProduceResponse)
        assert refused.responses[0].partition_responses[0].error_code == 29
    finally:
        conn.close()
    garbage = socket.create_connection(("127.0.0.1", server.port), timeout=15)
    garbage.sendall(struct.pack(">i", -5))
    assert garbage.recv(1) == b""
    garbage.close()

    stats = stats_when(server.env, lambda s: s["malformed_frames"] == 1 and s["requests"].get("Produce") == 1)
    assert stats["running"] is True
    assert stats["requests"] == {"Fetch": 3, "ListOffsets": 1, "Produce": 1}
    assert stats["errors"] == {"Fetch": 1, "Produce": 1}
    # The first fetch runs from the tier into the local log: each batch counts where it was read.
    tier_bytes = bytes_below(remote.records, first_local)
    assert 0 < tier_bytes and (stats["remote_bytes"], stats["local_bytes"]) == (tier_bytes, len(remote.records) - tier_bytes + len(local.records))
    assert stats["bytes_served"] == len(remote.records) + len(local.records) and stats["throttle_time_ms"] == 0

    listed = cli(server.env, "services", "--json")
    [entry] = [s for s in json.loads(listed.stdout) if s["kind"] == "serve"]
    assert entry["stats"]["requests"] == stats["requests"]
    text = cli(server.env, "serve", "--status")
    assert f"running (pid {server.process.pid})" in text.stdout and "remote tier" in text.stdout, text.stdout
    assert any(line.split() == ["Fetch", "3", "1"] for line in text.stdout.splitlines()), text.stdout

    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=20) == 0
    after = status(server.env)
    assert after["running"] is False and after["stats"]["running"] is False
    assert {k: after["stats"][k] for k in ("requests", "errors", "bytes_served", "remote_bytes")} == \
        {k: stats[k] for k in ("requests", "errors", "bytes_served", "remote_bytes")}
    assert "not running" in cli(server.env, "serve", "--status").stdout
