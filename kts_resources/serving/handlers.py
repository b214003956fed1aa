"""What `kts serve` answers to each API, as one node (id 0) leading every partition kts knows.

Fetch and ListOffsets go through the one read path, ``TieredLogReader`` (the code behind ``kts
fetch`` and ``kts offsets``): the local log while an offset is still local, else the remote log
index and one ranged read, every batch CRC-checked; the records are the batches exactly as stored.
The reader blocks (files, the tier, the metadata store), so each partition's read runs in the
server's thread pool and the partitions of one request are read side by side. A remote read the
KIP-956 fetch quota refuses is an empty partition and the quota's throttle time in
``throttle_time_ms``, never a stall.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from kafka.protocol.admin import CreatePartitionsResponse, CreateTopicsResponse, DeleteRecordsResponse, DeleteTopicsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from kts_resources.metadata.group_offsets import GroupOffsets
from kts_resources.serving.offsets_mirror import OffsetsMirror
from kts_resources.reading.reader import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    LocalSegmentDamagedError,
    OffsetOutOfRangeError,
    ReadError,
    RemoteDataCorruptError,
    TieredLogReader,
    UnknownPartitionError,
)
from kts_resources.remote_storage.base import RemoteStorageError
from kts_resources.serving import protocol as p
from kts_resources.serving.catalog import ZERO_UUID, read_catalog
from kts_resources.serving.group_apis import GROUP_API_KEYS, GroupSide
from kts_resources.serving.open_partitions import OpenPartitions
from kts_resources.serving.read_ahead import ReadAhead
from kts_resources.serving.stats import ServeStats

log = logging.getLogger(__name__)

NODE_ID = 0
CLUSTER_ID = "kts"
# The broker's own fetch.max.bytes default (55 MiB): a request's max_bytes is capped to it,
# whatever the client asks (fetch.max.bytes of 2 GiB must not become a 2 GiB response).
FETCH_MAX_BYTES_CAP = 55 * 1024 * 1024
# A fetch that finds nothing waits for data at most max_wait_ms, capped here, looking again this often.
MAX_WAIT_CAP_MS = 30_000
POLL_INTERVAL_S = 0.1
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
# ListOffsets' special timestamps, the spec the reader takes and the version that brought each.
SPECIAL_TIMESTAMPS = {-1: ("latest", 0), -2: ("earliest", 0), -3: ("max-timestamp", 7),
                      -4: ("earliest-local", 8), -5: ("latest-tiered", 9)}
REFUSED = "kts serve is read-only"


@dataclass
class PartitionFetch:
    """One partition's part of a fetch response."""

    error_code: int = p.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes | memoryview = b""
    aborted: list | None = None
    throttle_time_ms: int = 0
    remote_bytes: int = 0


class ReadSide:
    """The handlers of the APIs `kts serve` serves (protocol.APIS), over ``reader``."""

    def __init__(self, reader: TieredLogReader, pool: Executor, *, advertised: tuple[str, int],
                 draining: asyncio.Event) -> None:
        self.reader, self.pool = reader, pool
        self.host, self.port = advertised
        self.draining = draining
        self.stats = ServeStats()
        offsets = GroupOffsets(reader.store.engine) if reader.store is not None else None
        mirror = OffsetsMirror(offsets, reader.rsm) if offsets is not None and reader.rsm is not None else None
        self.groups = GroupSide(offsets, pool, advertised=advertised, draining=draining, mirror=mirror)
        self.open_partitions = OpenPartitions()
        self.read_ahead = ReadAhead(pool)

    async def answer(self, request):
        """The response object to ``request``; None for a request that gets none (acks=0)."""
        name = p.api_name(request.API_KEY)
        self.stats.request(name)
        api = p.APIS[request.API_KEY]
        if api.writes:
            log.info("refused %s v%d from %s: %s", name, request.API_VERSION, request.header.client_id, REFUSED)
            self.stats.error(name)
            return refusal(request)
        if request.API_KEY in GROUP_API_KEYS:
            return await self.groups.answer(request)
        handler = {18: self.api_versions, 3: self.metadata, 2: self.list_offsets, 1: self.fetch}[request.API_KEY]
        return await handler(request)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # --- ApiVersions, Metadata ---

    async def api_versions(self, request):
        return ApiVersionsResponse(version=request.API_VERSION, error_code=p.NONE, api_keys=p.supported_versions(),
                                   throttle_time_ms=0)

    async def metadata(self, request):
        catalog = await self._blocking(read_catalog, self.reader.log_dirs, self.reader.store)
        by_id = {topic.topic_id: topic for topic in catalog.values() if topic.topic_id != ZERO_UUID}
        R = MetadataResponse
        version = request.API_VERSION
        if request.topics is None or (version == 0 and not request.topics):
            wanted = [(name, None) for name in sorted(catalog)]
        else:
            wanted = [(t.name, getattr(t, "topic_id", None)) for t in request.topics]
        topics = []
        for name, topic_id in wanted:
            topic = catalog.get(name) if name is not None else by_id.get(topic_id)
            if topic is None:
                error = p.UNKNOWN_TOPIC_OR_PARTITION if name is not None else p.UNKNOWN_TOPIC_ID
                topics.append(R.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id or ZERO_UUID,
                                                      is_internal=False, partitions=[]))
                continue
            partitions = [R.MetadataResponseTopic.MetadataResponsePartition(
                error_code=p.NONE, partition_index=index, leader_id=NODE_ID,
                # No leader epoch: a client then skips epoch validation (OffsetForLeaderEpoch, not served).
                leader_epoch=-1, replica_nodes=[NODE_ID], isr_nodes=[NODE_ID], offline_replicas=[])
                for index in sorted(topic.partitions)]
            topics.append(R.MetadataResponseTopic(error_code=p.NONE, name=topic.name, topic_id=topic.topic_id,
                                                  is_internal=topic.name in INTERNAL_TOPICS, partitions=partitions))
        return R(version=version, throttle_time_ms=0,
                 brokers=[R.MetadataResponseBroker(node_id=NODE_ID, host=self.host, port=self.port, rack=None)],
                 cluster_id=CLUSTER_ID, controller_id=NODE_ID, topics=topics)

    # --- ListOffsets ---

    async def list_offsets(self, request):
        version = request.API_VERSION
        isolation = READ_COMMITTED if getattr(request, "isolation_level", 0) == 1 else READ_UNCOMMITTED
        jobs = [(t.name, part.partition_index, part.timestamp) for t in request.topics for part in t.partitions]
        answers = await asyncio.gather(*(self._blocking(self._list_offset, name, index, ts, isolation, version)
                                         for name, index, ts in jobs))
        R = ListOffsetsResponse
        topics: dict[str, list] = {}
        self.stats.error("ListOffsets", sum(1 for error, *_ in answers if error))
        for (name, index, _ts), (error, timestamp, offset, epoch) in zip(jobs, answers):
            topics.setdefault(name, []).append(R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=index, error_code=error, timestamp=timestamp, offset=offset, leader_epoch=epoch))
        return R(version=version, throttle_time_ms=0,
                 topics=[R.ListOffsetsTopicResponse(name=name, partitions=parts) for name, parts in topics.items()])

    def _list_offset(self, topic: str, partition: int, timestamp: int, isolation: str, version: int) -> tuple[int, int, int, int]:
        """(error code, timestamp, offset, leader epoch) of one partition's ListOffsets."""
        if timestamp < 0:
            special = SPECIAL_TIMESTAMPS.get(timestamp)
            if special is None:
                return p.INVALID_REQUEST, -1, -1, -1
            spec, since = special
            if version < since:
                return p.UNSUPPORTED_VERSION, -1, -1, -1
        else:
            spec = timestamp
        try:
            answer = self.reader.offsets(topic, partition, spec, isolation)
        except (UnknownPartitionError, ReadError) as e:
            if not isinstance(e, UnknownPartitionError):
                log.warning("ListOffsets %s-%d %s: %s", topic, partition, spec, e)
            return (p.UNKNOWN_TOPIC_OR_PARTITION if isinstance(e, UnknownPartitionError) else p.UNKNOWN_SERVER_ERROR), -1, -1, -1
        except (RemoteStorageError, OSError) as e:
            log.warning("ListOffsets %s-%d %s: %s", topic, partition, spec, e)
            return p.KAFKA_STORAGE_ERROR, -1, -1, -1
        found_timestamp = answer.timestamp if spec == "max-timestamp" or isinstance(spec, int) else -1
        return p.NONE, found_timestamp, answer.offset, answer.leader_epoch

    # --- Fetch ---

    async def fetch(self, request):
        """Every partition read side by side; a fetch that finds fewer than min_bytes waits for more
        up to max_wait_ms (looking again every POLL_INTERVAL_S), as a broker's delayed fetch does."""
        isolation = READ_COMMITTED if request.isolation_level == 1 else READ_UNCOMMITTED
        total = max(0, min(request.max_bytes, FETCH_MAX_BYTES_CAP))
        jobs = [(t.topic, part.partition, part.fetch_offset, max(0, min(part.partition_max_bytes, total)))
                for t in request.topics for part in t.partitions]
        deadline = time.monotonic() + min(max(request.max_wait_ms, 0), MAX_WAIT_CAP_MS) / 1000
        while True:
            outcomes = await asyncio.gather(*(self._partition_fetch(*job, isolation) for job in jobs))
            size = sum(len(o.records) for o in outcomes)
            left = deadline - time.monotonic()
            if (size >= max(request.min_bytes, 1) or any(o.error_code or o.throttle_time_ms for o in outcomes)
                    or left <= 0 or self.draining.is_set()):
                break
            try:
                await asyncio.wait_for(self.draining.wait(), timeout=min(POLL_INTERVAL_S, left))
            except asyncio.TimeoutError:
                pass
        return self._fetch_response(request, jobs, outcomes, total)

    def _fetch_response(self, request, jobs, outcomes: list[PartitionFetch], total: int):
        R = FetchResponse
        PD = R.FetchableTopicResponse.PartitionData
        topics: dict[str, list] = {}
        used = 0
        for (topic, index, _offset, _max), o in zip(jobs, outcomes):
            records = o.records
            # Within the response's max_bytes, except the first partition with data: a batch larger
            # than every limit still goes out whole, so a consumer always makes progress (KIP-74).
            if records and used and used + len(records) > total:
                records = b""
            used += len(records)
            self.stats.bytes_served += len(records)
            self.stats.remote_bytes += o.remote_bytes if records else 0
            aborted = None if o.aborted is None else [
                R.FetchableTopicResponse.PartitionData.AbortedTransaction(producer_id=t.producer_id, first_offset=t.first_offset)
                for t in o.aborted]
            topics.setdefault(topic, []).append(PD(
                partition_index=index, error_code=o.error_code, high_watermark=o.high_watermark,
                last_stable_offset=o.last_stable_offset, log_start_offset=o.log_start_offset,
                aborted_transactions=aborted, preferred_read_replica=-1, records=records))
        throttle = max((o.throttle_time_ms for o in outcomes), default=0)
        self.stats.throttle_time_ms += throttle
        self.stats.error("Fetch", sum(1 for o in outcomes if o.error_code))
        # session_id 0: no fetch session (KIP-227); the client sends full fetches.
        return R(version=request.API_VERSION, throttle_time_ms=throttle, error_code=p.NONE, session_id=0,
                 responses=[R.FetchableTopicResponse(topic=topic, partitions=parts) for topic, parts in topics.items()])

    async def _partition_fetch(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: str) -> PartitionFetch:
        """One partition's part of a fetch. A fetch whose records are read ahead is answered here on
        the loop once the read is done (awaited, not waited for in a pool thread): the hop to a pool
        thread and back cost more than the rest of such a fetch on a loaded machine."""
        kept = self.open_partitions.reader_for(topic, partition, offset)
        if kept is not None and max_bytes > 0 and kept.last_stable_offset_known:
            ahead = self.read_ahead.waiting(topic, partition, kept, offset, max_bytes, isolation)
            if ahead is not None:
                if not ahead.done():
                    await asyncio.wait([asyncio.wrap_future(ahead)])  # cancelled elsewhere: the checks below say so
                if not ahead.cancelled() and ahead.exception() is None and not ahead.result().throttled:
                    out = self._fetch_from(kept, topic, partition, offset, max_bytes, isolation, retry=True, on_loop=True)
                    if out is not None:
                        return out
        return await self._blocking(self._fetch_partition, topic, partition, offset, max_bytes, isolation)

    def _fetch_partition(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: str) -> PartitionFetch:
        """The partition's reader kept from an earlier fetch when it still holds ``offset``
        (open_partitions.py), else a fresh one, kept for the next fetch."""
        kept = self.open_partitions.reader_for(topic, partition, offset)
        if kept is not None:
            out = self._fetch_from(kept, topic, partition, offset, max_bytes, isolation, retry=True)
            if out is not None:
                return out
            self.open_partitions.forget(topic, partition)  # its view may be what failed: a fresh look
        try:
            reader = self.reader.partition(topic, partition, previous=self.open_partitions.last(topic, partition))
        except ReadError:  # unknown, or a name no topic can have
            return PartitionFetch(p.UNKNOWN_TOPIC_OR_PARTITION)
        except (RemoteStorageError, OSError) as e:
            log.warning("Fetch %s-%d: %s", topic, partition, e)
            return PartitionFetch(p.KAFKA_STORAGE_ERROR)
        self.open_partitions.keep(topic, partition, reader)
        return self._fetch_from(reader, topic, partition, offset, max_bytes, isolation)

    def _renew(self, topic: str, partition: int) -> None:
        """A fresh reader for the partition, kept for its next fetches (open_partitions.py)."""
        try:
            reader = self.reader.partition(topic, partition, previous=self.open_partitions.last(topic, partition))
            reader.last_stable_offset  # noqa: B018 — read here, not by a fetch on the loop
        except (ReadError, RemoteStorageError, OSError):
            self.open_partitions.forget(topic, partition)  # the next fetch opens it and says why
            return
        self.open_partitions.keep(topic, partition, reader)

    def _fetch_from(self, reader, topic: str, partition: int, offset: int, max_bytes: int, isolation: str,
                    retry: bool = False, on_loop: bool = False) -> PartitionFetch | None:
        """One partition's fetch on ``reader``; with ``retry``, None instead of an error (unlogged).
        ``on_loop``: only from a read ahead that is done (the loop never reads), else None."""
        if self.open_partitions.due(topic, partition):
            try:
                self.pool.submit(self._renew, topic, partition)
            except RuntimeError:  # the pool is shut down: the server is stopping
                self.open_partitions.forget(topic, partition)
        out = PartitionFetch(high_watermark=reader.high_watermark, log_start_offset=reader.log_start_offset)
        try:
            out.last_stable_offset = reader.last_stable_offset
            if max_bytes <= 0:
                return out
            result = self.read_ahead.take(topic, partition, reader, offset, max_bytes, isolation, wait=not on_loop)
            if result is None:
                if on_loop:
                    return None
                result = reader.fetch(offset, max_bytes, isolation)
        except (ReadError, RemoteStorageError, OSError) as e:
            if retry:
                return None
            out.error_code = fetch_error_code(e)
            if out.error_code != p.OFFSET_OUT_OF_RANGE:
                log.warning("Fetch %s-%d at %d: %s", topic, partition, offset, e)
            return out
        if result.throttled:
            quota = self.reader.fetch_quota
            out.throttle_time_ms = max(1, quota.throttle_time_ms()) if quota is not None else 1
        out.records = records_of(result.batches)
        out.remote_bytes = sum(b.size for b in result.batches if b.remote)
        if isolation == READ_COMMITTED:
            out.aborted = result.aborted
        if out.remote_bytes and result.next_offset < reader.fetch_limit(isolation):
            # A consumer reading the remote tier in order asks for the next chunk next (read_ahead.py).
            self.read_ahead.start(topic, partition, reader, result.next_offset, max_bytes, isolation)
        return out


def records_of(batches) -> bytes | memoryview:
    """The batches' bytes as one records field: a view of their chunk when they lie end to end in
    one (a remote fetch's always do), else a copy joining them; the response's encoding copies them once more."""
    if not batches:
        return b""
    first, last = batches[0], batches[-1]
    buffer = first.buffer
    if all(b.buffer is buffer for b in batches) and last.position + last.size - first.position == sum(b.size for b in batches):
        return memoryview(buffer)[first.position:last.position + last.size]
    return b"".join(memoryview(b.buffer)[b.position:b.position + b.size] for b in batches)


def fetch_error_code(e: Exception) -> int:
    """The protocol's error for a partition fetch that raised ``e``."""
    if isinstance(e, OffsetOutOfRangeError):
        return p.OFFSET_OUT_OF_RANGE
    if isinstance(e, (RemoteDataCorruptError, LocalSegmentDamagedError, RemoteStorageError, OSError)):
        return p.KAFKA_STORAGE_ERROR
    return p.UNKNOWN_SERVER_ERROR


def refusal(request):
    """The protocol's refusal of a write: TOPIC_AUTHORIZATION_FAILED for each topic or partition it
    names, CLUSTER_AUTHORIZATION_FAILED for a producer id; None for a Produce with acks=0 (no response)."""
    version = request.API_VERSION
    denied = p.TOPIC_AUTHORIZATION_FAILED
    if request.API_KEY == 0:  # Produce
        if request.acks == 0:
            return None
        R = ProduceResponse
        PR = R.TopicProduceResponse.PartitionProduceResponse
        return R(version=version, throttle_time_ms=0, responses=[
            R.TopicProduceResponse(name=t.name, topic_id=getattr(t, "topic_id", ZERO_UUID) or ZERO_UUID, partition_responses=[
                PR(index=part.index, error_code=denied, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                   record_errors=[], error_message=REFUSED) for part in t.partition_data]) for t in request.topic_data])
    if request.API_KEY == 19:  # CreateTopics
        R = CreateTopicsResponse
        return R(version=version, throttle_time_ms=0, topics=[
            R.CreatableTopicResult(name=t.name, topic_id=ZERO_UUID, error_code=denied, error_message=REFUSED,
                                   topic_config_error_code=0, num_partitions=-1, replication_factor=-1, configs=None)
            for t in request.topics])
    if request.API_KEY == 20:  # DeleteTopics
        R = DeleteTopicsResponse
        named = [(t.name, t.topic_id) for t in request.topics] if version >= 6 else [(n, ZERO_UUID) for n in request.topic_names]
        return R(version=version, throttle_time_ms=0, responses=[
            R.DeletableTopicResult(name=name, topic_id=topic_id, error_code=denied, error_message=REFUSED) for name, topic_id in named])
    if request.API_KEY == 21:  # DeleteRecords
        R = DeleteRecordsResponse
        return R(version=version, throttle_time_ms=0, topics=[
            R.DeleteRecordsTopicResult(name=t.name, partitions=[
                R.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(partition_index=part.partition_index, low_watermark=-1,
                                                                        error_code=denied) for part in t.partitions])
            for t in request.topics])
    if request.API_KEY == 37:  # CreatePartitions
        R = CreatePartitionsResponse
        return R(version=version, throttle_time_ms=0, results=[
            R.CreatePartitionsTopicResult(name=t.name, error_code=denied, error_message=REFUSED) for t in request.topics])
    if request.API_KEY == 22:  # InitProducerId
        return InitProducerIdResponse(version=version, throttle_time_ms=0, error_code=p.CLUSTER_AUTHORIZATION_FAILED,
                                      producer_id=-1, producer_epoch=-1)
    raise AssertionError(f"no refusal for API key {request.API_KEY}")
