"""`kts serve`, safe to expose (issue 29): TLS, SASL/SCRAM-SHA-256 against the users `kts users`
keeps hashed in the metadata store, the connection cap and the fetch memory budget.

The log is a small local partition (the tiers are test_serve.py's concern: authentication sits in
front of the same read path). Clients are real: kafka-python and confluent-kafka over SASL_SSL
with a self-signed certificate made here; raw frames (kafka-python's protocol classes) for what a
client library hides, such as the connection closing after a refused login."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.metadata.credentials import user_name_problem
from kts_resources.serving.budget import MIN_GRANT, ByteBudget

from .test_serve import TOPIC, consume_all, original_records, start_serve
from .test_sync_outcome import kts

PASSWORD = "s3cret-pässword"
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kts serve test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    directory = tmp_path_factory.mktemp("tls")
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def local_log(tmp_path, pg_url, metadata_store):
    """orders-0, a few hundred records in the local log only; the environment pointing kts at it."""
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=5, topics=(TOPIC,), partitions=1, total_bytes=48 * 1024, segment_bytes=16 * 1024,
                                       codecs=("none", "lz4"), transactional_producers=0))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    return env, log_dir


def add_user(env: dict, name: str, password: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*kts_argv(), "users", "add", name, *args], env=env, input=password + "\n",
                          capture_output=True, text=True, timeout=120)


def kts_argv() -> list[str]:
    import sys
    return [sys.executable, "-m", "kts_assets.cli"]


def stop(server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()


@pytest.fixture
def secured(local_log, tmp_path, certificate):
    """`kts serve --sasl SCRAM-SHA-256` over TLS, with the user alice."""
    env, log_dir = local_log
    assert add_user(env, "alice", PASSWORD).returncode == 0
    cert, key = certificate
    server = start_serve(env, tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--sasl", "SCRAM-SHA-256")
    try:
        yield server, log_dir, cert
    finally:
        stop(server)


# --- kts users ---------------------------------------------------------------------------------------


def scram_rows(pg_url: str) -> list[dict]:
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(sa.text("SELECT * FROM scram_credentials ORDER BY user_name")).mappings()]
    finally:
        engine.dispose()


def test_kts_users_keeps_a_salted_scram_credential_never_the_password_and_lists_and_deletes_users(local_log, pg_url):
    env, _ = local_log

    added = add_user(env, "alice", PASSWORD)
    assert added.returncode == 0, added.stderr
    assert "alice: added (SCRAM-SHA-256, 4096 iterations)" in added.stdout
    first = scram_rows(pg_url)[0]
    assert add_user(env, "bob", "another", "--iterations", "8192").returncode == 0
    changed = add_user(env, "alice", "a new one")
    assert changed.returncode == 0 and "alice: password changed" in changed.stdout

    listed = kts(env, "users", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(u["user"], u["mechanism"], u["iterations"]) for u in json.loads(listed.stdout)] == [
        ("alice", "SCRAM-SHA-256", 4096), ("bob", "SCRAM-SHA-256", 8192)]
    rows = scram_rows(pg_url)
    assert rows[0]["salt"] != first["salt"] and rows[0]["stored_key"] != first["stored_key"]  # a new salt each time
    for row in rows:
        assert len(row["salt"]) == 32 and len(row["stored_key"]) == 32 and len(row["server_key"]) == 32
        stored = b"".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for v in row.values())
        assert b"a new one" not in stored and b"another" not in stored

    deleted = kts(env, "users", "delete", "bob")
    assert deleted.returncode == 0 and "bob: deleted" in deleted.stdout
    assert [row["user_name"] for row in scram_rows(pg_url)] == ["alice"]
    again = kts(env, "users", "delete", "bob")
    assert again.returncode == 1 and again.stderr.strip() == "kts: no user 'bob'"


@pytest.mark.parametrize("args, password, line", [
    (("carol",), "", "an empty password"),
    (("carol", "--iterations", "1000"), "pw", "--iterations 1000: SCRAM-SHA-256 takes 4096 to 16384"),
])
def test_kts_users_add_refuses_bad_input_with_one_line_and_adds_nothing(local_log, pg_url, args, password, line):
    env, _ = local_log
    result = subprocess.run([*kts_argv(), "users", "add", *args], env=env, input=password + "\n",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and line in result.stderr, result.stderr
    assert scram_rows(pg_url) == []


def test_a_user_name_with_blanks_around_it_or_control_characters_is_refused():
    assert user_name_problem("alice") is None and user_name_problem("ünï code, with=signs") is None
    assert "cannot be empty" in user_name_problem("")
    assert all("blanks around it or control characters" in user_name_problem(n) for n in (" alice", "alice\n", "a\x00b"))


# --- TLS + SCRAM with real clients ---------------------------------------------------------------------


def kafka_python_sasl(cert: Path, password: str) -> dict:
    return dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                sasl_plain_password=password, ssl_cafile=str(cert))


def confluent_sasl(server, cert: Path, password: str) -> dict:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice", "sasl.password": password, "ssl.ca.location": str(cert), "group.id": "kts-secure-test",
            "enable.auto.commit": False, "enable.partition.eof": True}


def test_over_tls_a_wrong_scram_password_is_refused_with_the_authentication_error_and_the_right_one_consumes(secured):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    server, log_dir, cert = secured
    want = original_records(log_dir / f"{TOPIC}-0", read_committed=False)
    assert len(want) > 50

    # kafka-python: its SCRAM client over raw frames (its KafkaConsumer, refused, retries its
    # bootstrap until a timeout), then its consumer with the right password.
    for password, error in (("wrong", SASL_AUTHENTICATION_FAILED), (PASSWORD, 0)):
        conn = TlsConnection(server.port, cert)
        assert kafka_python_scram_login(conn, "alice", password) == error
        if error:
            assert conn.closed()  # as Kafka's broker: the refusal, then the connection ends
        else:
            served = conn.request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False), MetadataResponse)
            assert [t.name for t in served.topics] == [TOPIC]
    got, end = consume_all(server.bootstrap, 0, **kafka_python_sasl(cert, PASSWORD))
    want = [r for r in want if r[0] < end]  # up to the high watermark
    assert got == want

    # confluent-kafka (librdkafka)
    errors = []
    refused = Consumer({**confluent_sasl(server, cert, "wrong"), "error_cb": errors.append})
    try:
        deadline = time.monotonic() + 30
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
            refused.poll(0.2)
    finally:
        refused.close()
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    consumer = Consumer(confluent_sasl(server, cert, PASSWORD))
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        got, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                break
            got.append((message.offset(), message.timestamp()[1], message.key(), message.value(),
                        [(k, v) for k, v in (message.headers() or [])]))
    finally:
        consumer.close()
    assert got == want

    log = server.log()
    assert "authenticated as alice (SASL/SCRAM-SHA-256)" in log
    assert "SASL/SCRAM-SHA-256 authentication failed: invalid credentials for user 'alice'" in log


class TlsConnection:
    """Raw frames over TLS (kafka-python's protocol classes), for what a client library hides."""

    def __init__(self, port: int, cert: Path):
        context = ssl.create_default_context(cafile=str(cert))
        self.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=15), server_hostname="127.0.0.1")
        self.correlation_id = 0

    def send(self, request) -> None:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="test_serve_secure")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))

    def request(self, request, response_class):
        self.send(request)
        size = struct.unpack(">i", self._read(4))[0]
        return response_class.decode(self._read(size), version=request.API_VERSION, header=True)

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the server closed the connection"
            data += chunk
        return data


def kafka_python_scram_login(conn: TlsConnection, user: str, password: str) -> int:
    """SaslHandshake, then kafka-python's own SCRAM-SHA-256 client through SaslAuthenticate: the
    first error code the server answers (0: logged in, the server's signature checked)."""
    from kafka.net.sasl.scram import ScramClient

    assert conn.request(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"), SaslHandshakeResponse).error_code == 0
    client = ScramClient(user, password, "SCRAM-SHA-256")
    first = conn.request(SaslAuthenticateRequest[2](auth_bytes=client.first_message()), SaslAuthenticateResponse)
    if first.error_code:
        return first.error_code
    client.process_server_first_message(first.auth_bytes)
    final = conn.request(SaslAuthenticateRequest[2](auth_bytes=client.final_message()), SaslAuthenticateResponse)
    if final.error_code:
        return final.error_code
    client.process_server_final_message(final.auth_bytes)  # raises unless the server proved its key
    return 0


def scram_client_first(user: str, nonce: str) -> bytes:
    return f"n,,n={user},r={nonce}".encode()


def test_with_sasl_nothing_but_api_versions_and_sasl_is_served_before_authentication(secured):
    server, _, cert = secured
    conn = TlsConnection(server.port, cert)
    versions = conn.request(ApiVersionsRequest[3](client_software_name="raw", client_software_version="1"), ApiVersionsResponse)
    served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert served[17] == (1, 1) and served[36] == (0, 2)
    conn.send(MetadataRequest[9](topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    assert conn.closed()
    assert "API key 3 before SASL authentication: closing the connection" in server.log()

    # An unoffered mechanism: the enabled ones, then the connection closes.
    conn = TlsConnection(server.port, cert)
    handshake = conn.request(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
    assert handshake.error_code == UNSUPPORTED_SASL_MECHANISM and handshake.mechanisms == ["SCRAM-SHA-256"]
    assert conn.closed()

    # An unknown user is led through the exchange like a known one, and refused at the proof;
    # the refusal is SaslAuthenticate's SASL_AUTHENTICATION_FAILED, then the connection closes.
    conn = TlsConnection(server.port, cert)
    assert conn.request(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"), SaslHandshakeResponse).error_code == 0
    first = conn.request(SaslAuthenticateRequest[2](auth_bytes=scram_client_first("mallory", "abc")), SaslAuthenticateResponse)
    assert first.error_code == 0 and first.auth_bytes.startswith(b"r=abc") and b",i=4096" in first.auth_bytes
    nonce = first.auth_bytes.decode().split(",")[0][2:]
    final = conn.request(SaslAuthenticateRequest[2](auth_bytes=f"c=biws,r={nonce},p=AAAA".encode()), SaslAuthenticateResponse)
    assert final.error_code == SASL_AUTHENTICATION_FAILED and "invalid credentials" in final.error_message
    assert conn.closed()


def test_tls_options_are_checked_at_start_with_one_line(local_log, tmp_path, certificate):
    env, _ = local_log
    cert, _key = certificate
    alone = kts(env, "serve", "--listen", "127.0.0.1:0", "--tls-cert", str(cert))
    assert alone.returncode == 2 and "--tls-cert and --tls-key go together" in alone.stderr
    missing = kts(env, "serve", "--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(tmp_path / "nope.key"))
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert f"TLS key {tmp_path / 'nope.key'}: no such file" in missing.stderr


# --- bounded: connections and fetch memory ---------------------------------------------------------------


def api_versions_over(sock: socket.socket) -> bool:
    """Whether ``sock`` answers an ApiVersions request (False: the server closed it)."""
    request = ApiVersionsRequest[0]()
    request.with_header(correlation_id=1, client_id="cap")
    try:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        return len(sock.recv(4)) == 4
    except ConnectionError:
        return False


def test_connections_beyond_the_cap_are_closed_as_they_arrive_with_a_log_line_and_the_others_served(local_log, tmp_path):
    env, _ = local_log
    server = start_serve(env, tmp_path, "--max-connections", "2")
    try:
        first, second = (socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2))
        assert api_versions_over(first) and api_versions_over(second)
        third = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        assert not api_versions_over(third)
        assert "2 connections already (the most served at once): closing the new one" in server.log()
        first.close()
        deadline = time.monotonic() + 10
        while True:  # the server sees the close shortly after
            fourth = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if api_versions_over(fourth) or time.monotonic() > deadline:
                break
            fourth.close()
            time.sleep(0.05)
        assert api_versions_over(second) and api_versions_over(fourth)
        for s in (second, third, fourth):
            s.close()
    finally:
        stop(server)


def test_the_fetch_budget_grants_no_more_than_its_limit_shares_it_and_a_release_lets_the_next_in():
    async def scenario():
        budget = ByteBudget(8 * MIN_GRANT)
        big = await budget.reserve(2**31 - 1)  # a fetch.max.bytes of 2 GiB
        assert big == 8 * MIN_GRANT  # alone, the whole budget, never more
        waiting = asyncio.ensure_future(budget.reserve(2**31 - 1))
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing free: it waits its turn
        held = budget.charge(big, 3 * MIN_GRANT)  # the response came out smaller than its grant
        second = await asyncio.wait_for(waiting, 1)
        assert second == 4 * MIN_GRANT  # one other holder: half the budget at most
        budget.release(held)
        third = await budget.reserve(2**31 - 1)
        assert third == 4 * MIN_GRANT and budget.used == budget.limit
        over = asyncio.ensure_future(budget.reserve(100))
        await asyncio.sleep(0)
        assert not over.done()  # even a small fetch waits while the budget is spent
        budget.release(second)
        assert await asyncio.wait_for(over, 1) == 100
        budget.release(third)
        budget.release(100)
        assert budget.used == 0 and budget.holders == 0
        small = await budget.reserve(2 * MIN_GRANT)
        shared = await budget.reserve(2**31 - 1)  # one holder besides it: half the budget at most
        assert shared == 8 * MIN_GRANT // 2
        budget.release(small)
        budget.release(shared)

    asyncio.run(scenario())


def test_a_client_that_stops_reading_is_cut_off_and_frees_the_fetch_memory_for_a_consumer_beside_it(tmp_path, pg_url, metadata_store):
    log_dir = tmp_path / "logs"
    simulate(log_dir, SimulationConfig(seed=7, topics=(TOPIC,), partitions=1, total_bytes=12 * 1024 * 1024, codecs=("none",),
                                       transactional_producers=0, segment_bytes=4 * 1024 * 1024))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(log_dir), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    server = start_serve(env, tmp_path, "--fetch-budget-mib", "8")
    try:
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        F = FetchRequest[12]
        fetch = F(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=2**31 - 1, isolation_level=0, session_id=0, session_epoch=-1,
                  topics=[F.FetchTopic(topic=TOPIC, partitions=[F.FetchTopic.FetchPartition(
                      partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                      partition_max_bytes=2**31 - 1)])], forgotten_topics_data=[], rack_id="")
        fetch.with_header(correlation_id=1, client_id="stalled")
        # The whole budget, for a response larger than the sockets' buffers take; then it never reads.
        stalled.sendall(bytes(fetch.encode(header=True, framed=True)))
        time.sleep(0.5)  # its fetch read and answered first, so it holds the budget

        got, end = consume_all(server.bootstrap, 0)
        assert len(got) > 1000 and got[-1][0] == end - 1
        # Cut while the consumer's fetch waited for the memory it held: after 2 s, not the 10 s of
        # a stall that keeps no one waiting.
        assert "the client took none of its response's last" in server.log() and "for 2 s: closing the connection" in server.log()
        stalled.close()
    finally:
        stop(server)
