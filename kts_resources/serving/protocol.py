"""The Kafka protocol as `kts serve` speaks it: which APIs and versions it serves, and turning a
request frame into a decoded request (and a response into a frame).

Messages are kafka-python's (``kafka.protocol``, ≥ 3.0), generated from Kafka's own JSON schemas:
the same classes decode requests and encode responses, so no struct here is written by hand. What
the library leaves to a server: reading the request header before the API is known (the first
four fields are the same in every header version, so header v1 is read to learn the key and
version, then the message class decodes the whole frame with the header version its schema says),
and KIP-511's v0 answer to an ApiVersions request of a version it does not know.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass

from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_key import ApiKey
from kafka.protocol.admin import CreatePartitionsRequest, CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest
from kafka.protocol.admin import DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.consumer import (HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest,
                                     SyncGroupRequest)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

# Kafka's error codes (org.apache.kafka.common.protocol.Errors) that `kts serve` answers with.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_SERVER_ERROR = -1
TOPIC_AUTHORIZATION_FAILED = 29
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
KAFKA_STORAGE_ERROR = 56
UNKNOWN_TOPIC_ID = 100


@dataclass(frozen=True)
class Api:
    """An API `kts serve` answers: its request class and the versions it serves. ``writes``: a
    request that would change the log or the cluster, refused with the protocol's error."""

    request: type
    min_version: int
    max_version: int
    writes: bool = False

    @property
    def key(self) -> int:
        return self.request.API_KEY


# Fetch from v4 (isolation level, last stable offset, aborted transactions) to v12: v13 on names
# topics by id only. ListOffsets to v10 (v9 has −5, latest-tiered; v11's −6 is not served).
APIS: dict[int, Api] = {api.key: api for api in (
    Api(ApiVersionsRequest, 0, 4),
    Api(MetadataRequest, 0, 12),
    Api(ListOffsetsRequest, 1, 10),
    Api(FetchRequest, 4, 12),
    # SASL (serving/auth.py): handshake v1 only, whose tokens travel in SaslAuthenticate (KIP-152).
    Api(SaslHandshakeRequest, 1, 1),
    Api(SaslAuthenticateRequest, 0, 2),
    # Consumer groups (group_apis.py). OffsetCommit and OffsetFetch to v8: v9 on are for KIP-848's
    # consumer protocol, v10 names topics by id.
    Api(FindCoordinatorRequest, 0, 5), Api(JoinGroupRequest, 0, 9), Api(SyncGroupRequest, 0, 5),
    Api(HeartbeatRequest, 0, 4), Api(LeaveGroupRequest, 0, 5), Api(OffsetCommitRequest, 2, 8),
    Api(OffsetFetchRequest, 1, 8), Api(DescribeGroupsRequest, 0, 5), Api(ListGroupsRequest, 0, 5),
    # Listed so that clients send them and read the refusal, rather than fail to negotiate.
    Api(ProduceRequest, 3, 12, writes=True),
    Api(CreateTopicsRequest, 2, 7, writes=True),
    Api(DeleteTopicsRequest, 1, 6, writes=True),
    Api(DeleteRecordsRequest, 0, 2, writes=True),
    Api(CreatePartitionsRequest, 0, 3, writes=True),
    Api(InitProducerIdRequest, 0, 5, writes=True),
)}


class MalformedRequest(Exception):
    """Bytes that are no request: the connection is closed (one log line)."""


class UnsupportedRequest(Exception):
    """A request of an API key or version not served: ``header`` says which."""

    def __init__(self, header: RequestHeader):
        super().__init__(f"API key {header.request_api_key} ({api_name(header.request_api_key)}) "
                         f"version {header.request_api_version} is not served")
        self.header = header


def api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return "unknown"


def read_header(frame: bytes) -> RequestHeader:
    """The request header's key, version, correlation id and client id (header v1's fields, the
    first of every version)."""
    try:
        return RequestHeader.decode(io.BytesIO(frame), flexible=False)
    except (ValueError, struct.error, UnicodeDecodeError, IndexError, TypeError) as e:
        raise MalformedRequest(f"the request header does not decode: {e}") from None


def decode_request(frame: bytes):
    """The request in ``frame`` (its header in ``.header``). UnsupportedRequest for an API or
    version not served (an ApiVersions request of a newer version included: KIP-511), and
    MalformedRequest for bytes that do not decode."""
    header = read_header(frame)
    api = APIS.get(header.request_api_key)
    if api is None or not api.min_version <= header.request_api_version <= api.max_version:
        raise UnsupportedRequest(header)
    try:
        request = api.request.decode(frame, version=header.request_api_version, header=True)
    except (ValueError, struct.error, UnicodeDecodeError, IndexError, TypeError, OverflowError) as e:
        raise MalformedRequest(f"{api_name(api.key)} v{header.request_api_version} does not decode: {e}") from None
    return request


def supported_versions() -> list:
    return [ApiVersionsResponse.ApiVersion(api_key=api.key, min_version=api.min_version, max_version=api.max_version)
            for api in sorted(APIS.values(), key=lambda a: a.key)]


def api_versions_fallback(correlation_id: int) -> bytearray:
    """KIP-511: an ApiVersions request of a version not served gets a v0 answer with
    UNSUPPORTED_VERSION and the supported ranges, so the client retries with one of them."""
    response = ApiVersionsResponse[0](error_code=UNSUPPORTED_VERSION, api_keys=supported_versions())
    return frame_response(response, correlation_id)


def frame_response(response, correlation_id: int) -> bytearray:
    """``response`` with its header (the version its schema says), size-prefixed (the encoder's own
    buffer: a copy of a fetch's megabytes into bytes would be one more)."""
    response.with_header(correlation_id=correlation_id)
    return response.encode(header=True, framed=True)


# Records at least this large are spliced into a framed Fetch response rather than encoded into it.
SPLICE_MIN_BYTES = 64 * 1024
_MARKER_BYTES = 16


def frame_fetch_response(response, correlation_id: int) -> list:
    """A Fetch ``response`` framed as ``frame_response`` frames it, as pieces to write in order:
    the library encodes the message with each large records field stood in for by a random
    16-byte marker, and each marker (with its length prefix) is replaced by the records' own
    length prefix and the records themselves, as given (a view of the chunk they were read into).

    Encoding the records into the message copied every byte twice (into the encoder's buffer,
    then out of it), a quarter of a busy server's time. Records are opaque bytes to the protocol
    (a length and the bytes: COMPACT_RECORDS from v12, RECORDS before), so what is written is the
    library's encoding byte for byte (``tests/test_serve_fresh_look.py`` compares them)."""
    spliced: list[tuple[bytes, object]] = []  # in encoding order
    swapped: dict[int, tuple[object, bytes, object]] = {}  # id(partition data) → (it, marker, records)
    for topic in response.responses:
        for part in topic.partitions:
            if id(part) in swapped:  # the same object twice: its marker is encoded twice
                spliced.append(swapped[id(part)][1:])
                continue
            records = part.records
            if records is not None and len(records) >= SPLICE_MIN_BYTES:
                marker = os.urandom(_MARKER_BYTES)
                swapped[id(part)] = (part, marker, records)
                spliced.append((marker, records))
                part.records = marker
    try:
        encoded = frame_response(response, correlation_id)
    finally:
        for part, _marker, records in swapped.values():  # the response is the caller's again, as it was
            part.records = records
    if not spliced:
        return [encoded]
    compact = response.flexible_version_q(response.API_VERSION)
    marker_prefix = _records_length(_MARKER_BYTES, compact)
    pieces: list = []
    position, size = 0, len(encoded) - 4
    for marker, records in spliced:
        at = encoded.find(marker, position)
        start = at - len(marker_prefix)
        if at < 0 or encoded[start:at] != marker_prefix:
            raise AssertionError("a records marker is not where the encoding put it")
        prefix = _records_length(len(records), compact)
        pieces += [encoded[position:start], prefix, records]
        size += len(prefix) + len(records) - len(marker_prefix) - _MARKER_BYTES
        position = at + _MARKER_BYTES
    pieces.append(encoded[position:])
    struct.pack_into(">i", pieces[0], 0, size)
    return pieces


def _records_length(n: int, compact: bool) -> bytes:
    """A records field's length prefix: unsigned varint of n + 1 (compact), else INT32 n."""
    if not compact:
        return struct.pack(">i", n)
    n += 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
