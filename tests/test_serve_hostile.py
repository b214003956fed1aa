"""`kts serve` under hostile input (issue 29, acceptance "Hostile input"): hypothesis throws
malformed and truncated frames, random API keys and versions and absurd sizes at a running server
while a good consumer keeps consuming. Every hostile connection gets the protocol's answer or is
closed with a log line naming it (never dropped silently), the good consumer reads every record
each time round, and the server is still up at the end."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from kts_resources.serving import protocol

from .test_serve import TOPIC, consume_all, original_records, served, tiered  # noqa: F401 - fixtures

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def header(key: int, version: int, correlation_id: int, client_id: bytes = b"hostile") -> bytes:
    """Request header v1 (key, version, correlation id, client id): the start of every request."""
    return struct.pack(">hhih", key, version, correlation_id, len(client_id)) + client_id


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@st.composite
def absurd_fetch(draw) -> bytes:
    """A well-formed Fetch (v4–v12) whose sizes and offsets are anything the fields can hold.
    max_wait_ms stays small: the wait itself is capped and tested in test_serve.py, and a fuzz
    example must not sit in it."""
    version = draw(st.integers(4, 12))
    partitions = [FetchRequest.FetchTopic.FetchPartition(
        partition=draw(INT32), current_leader_epoch=-1, fetch_offset=draw(INT64), log_start_offset=-1,
        partition_max_bytes=draw(INT32)) for _ in range(draw(st.integers(0, 4)))]
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=draw(st.integers(-1000, 50)), min_bytes=draw(INT32), max_bytes=draw(INT32),
        isolation_level=draw(st.integers(0, 1)), session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=draw(st.sampled_from([TOPIC, "", "nope", "a" * 249])), partitions=partitions)],
        forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=draw(INT32), client_id="hostile")
    return bytes(request.encode(header=True, framed=True))


@st.composite
def absurd_list_offsets(draw) -> bytes:
    version = draw(st.integers(1, 10))
    request = ListOffsetsRequest[version](replica_id=-1, isolation_level=draw(st.integers(0, 1)), timeout_ms=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=draw(st.sampled_from([TOPIC, "nope"])), partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=draw(INT32), current_leader_epoch=-1,
                                                                     timestamp=draw(INT64))
            for _ in range(draw(st.integers(0, 3)))])])
    request.with_header(correlation_id=draw(INT32), client_id="hostile")
    return bytes(request.encode(header=True, framed=True))


def metadata_frame(correlation_id: int) -> bytes:
    request = MetadataRequest[8](topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False,
                                 include_cluster_authorized_operations=False)
    request.with_header(correlation_id=correlation_id, client_id="hostile")
    return bytes(request.encode(header=True, framed=True))


HOSTILE = st.one_of(
    # garbage, correctly framed
    st.binary(max_size=80).map(framed),
    # a random API key and version, then garbage
    st.builds(lambda k, v, c, body: framed(header(k, v, c) + body), INT16, INT16, INT32, st.binary(max_size=40)),
    # an absurd size, then a few bytes
    st.builds(lambda size, body: struct.pack(">i", size) + body, INT32, st.binary(max_size=16)),
    # a good request cut short (the size says more than follows)
    st.builds(lambda c, cut: metadata_frame(c)[:cut], INT32, st.integers(1, 20)),
    # a good request whose size is wrong
    st.builds(lambda c, size: struct.pack(">i", size) + metadata_frame(c)[4:], INT32, st.integers(0, 64)),
    # well-formed, with absurd sizes and offsets inside
    absurd_fetch(), absurd_list_offsets(),
)


def correlation_ids(frames: bytes, *, at: int) -> list[int]:
    """The correlation ids of the whole frames in ``frames``, each ``at`` bytes into its frame
    (4 in a response, after the size; 8 in a request, after the size, key and version)."""
    ids = []
    while len(frames) >= at + 4:
        size = struct.unpack(">i", frames[:4])[0]
        if size < at or size > len(frames) - 4:
            break
        ids.append(struct.unpack(">i", frames[at:at + 4])[0])
        frames = frames[4 + size:]
    return ids


def throw(port: int, frame: bytes) -> tuple[str, bytes]:
    """Send ``frame``, end the sending side, read all the server says: (our address, its answer)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        ours = "%s:%d" % sock.getsockname()[:2]
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return ours, answer
    except ConnectionResetError:
        return ours, b""
    finally:
        sock.close()


def unanswered_by_design(frame: bytes) -> bool:
    """A Produce with acks=0 gets no response (the protocol's own rule, refused or not)."""
    try:
        request = protocol.decode_request(frame[4:])
    except (protocol.MalformedRequest, protocol.UnsupportedRequest):
        return False
    return request.API_KEY == 0 and request.acks == 0


def logged(server, who: str, timeout_s: float = 5) -> bool:
    """The server logged a line about the connection from ``who`` (its lines start "HOST:PORT: " or "HOST:PORT (client")."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = server.log()
        if f"{who}: " in text or f"{who} (client" in text:
            return True
        time.sleep(0.02)
    return False


# The good consumer's thread uses the random module (kafka-python picks a node at random) while
# hypothesis generates examples, which hypothesis takes for a strategy using it: not the case here.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_hostile_frames_get_the_protocols_answer_or_a_logged_close_while_a_good_consumer_reads_everything(served):
    server, originals = served
    want = original_records(originals / f"{TOPIC}-1", read_committed=False)
    stop = threading.Event()
    rounds: list[bool] = []
    failures: list[BaseException] = []

    def good_consumer() -> None:
        try:
            while not stop.is_set() or not rounds:
                got, end = consume_all(server.bootstrap, 1)
                rounds.append(got == [r for r in want if r[0] < end] and len(got) > 500)
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    consuming = threading.Thread(target=good_consumer)
    consuming.start()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(HOSTILE)
    def hostile(frame: bytes) -> None:
        ours, answer = throw(server.port, frame)
        answered, sent = correlation_ids(answer, at=4), correlation_ids(frame, at=8)
        # Whatever the server answered is a response to a request it was sent, in order.
        assert answered == sent[:len(answered)]
        if (not answered or len(answered) < len(sent)) and not unanswered_by_design(frame):
            # Not every request was answered: the server ended the connection, and said so.
            assert logged(server, ours), f"{frame[:64]!r} from {ours}: closed without a log line"

    try:
        hostile()
    finally:
        stop.set()
        consuming.join(timeout=120)
    assert not failures, failures
    assert rounds and all(rounds), rounds
    assert server.process.poll() is None
