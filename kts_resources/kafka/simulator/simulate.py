"""Deterministic broker-like workloads written into a Kafka log dir (what ``kts simulate`` runs).

:func:`simulate` drives a :class:`~.broker_log.BrokerLogDir` with a producer workload: topics ×
partitions, a byte budget, a message rate on a simulated clock, all five codecs, keys / null keys /
tombstones / headers, idempotent producers with epochs and sequences, transactional producers
whose batches interleave and end in COMMIT or ABORT markers, leader-epoch changes, out-of-order
CreateTime batches, some LogAppendTime batches, and optional broker-side retention afterwards.

Determinism: the same log dir contents, seed and options write byte-identical files. Nothing
reads the wall clock; the simulated clock starts at ``start_time_ms`` (or just after the newest
timestamp already in the log dir, so a second run appends later data), and the random stream is
derived from the seed and the log end offsets found, so a second run writes new batches.

Speed: records are not encoded per batch. A few batch templates per codec are built (and
compressed) once with :func:`~.records.build_batch`; each produced batch is a template re-stamped
with its timestamps, producer id, epoch, sequence and transactional flag, which touches only the
61-byte header and its CRC.

High watermark and recovery point — chosen so copy eligibility is predictable:

- every run closes all its transactions, then appends ``high_watermark_lag_batches`` plain
  (non-transactional) batches to each partition; the high watermark is the base offset of the
  first of those, but never below the active segment's base offset. So with the default of 1 the
  newest batch is above the high watermark (a fetch up to the HW stops short of it), no
  transaction marker lies at or above the HW (the last stable offset equals the HW), and
  ``log start ≤ HW ≤ log end``;
- the recovery point is the active segment's base offset (the broker flushes on roll).

Hence min(high watermark, recovery point) = the active segment's base offset: every closed
segment has next base offset ≤ that bound and is copy-eligible; the active segment never is. A
test that needs a closed segment held back by the high watermark sets it lower itself with
:meth:`~.broker_log.PartitionLog.update_high_watermark` and rewrites the checkpoints with
:meth:`~.broker_log.BrokerLogDir.checkpoint`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable


from .broker_log import (
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SEGMENT_MS,
    PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS,
    AppendResult,
    BrokerLogDir,
    LogConfig,
    PartitionLog,
    next_sequence,
)
from ..codecs import CODEC_NAMES, codec_id
from ..indexes import DEFAULT_INDEX_INTERVAL_BYTES, DEFAULT_SEGMENT_INDEX_BYTES
from ..partition import TopicPartition, topic_name_problem
from ..records import ATTR_TRANSACTIONAL, NO_PRODUCER_ID, NewRecord, build_batch, build_control_batch, restamp_batch

KiB = 1024
MiB = 1024 * KiB

DEFAULT_TOPICS = ("orders", "page.views", "user-events")
DEFAULT_START_TIME_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z: a fixed epoch, never the wall clock

# Producer ids: transactional ids keep theirs across runs (one per transactional.id);
# idempotent producers get fresh ids above everything already in the log dir.
TRANSACTIONAL_PRODUCER_ID_BASE = 1000
IDEMPOTENT_PRODUCER_ID_BASE = 100_000

ProgressCallback = Callable[[int, int], None]


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate. Field names map to CLI options (``total_bytes`` → ``--total-bytes``);
    sizes are bytes, times milliseconds, ratios 0..1 (per batch unless said otherwise)."""

    seed: int = 0
    topics: tuple[str, ...] = DEFAULT_TOPICS
    partitions: int = 2  # per topic
    total_bytes: int = 16 * MiB  # .log bytes to append in this run, over all partitions
    messages_per_second: float = 1000.0  # over the whole log dir: drives the simulated clock
    record_size: int = 512  # mean value size; values vary from half to one and a half times it
    batch_size: int = 16 * KiB  # producer batch.size: uncompressed record bytes per batch, at most
    codecs: tuple[str, ...] = CODEC_NAMES  # mixed per batch
    # Topic configs (Kafka's defaults).
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES
    retention_ms: int = -1  # applied after appending when >= 0
    retention_bytes: int = -1  # applied after appending when >= 0
    # Producers.
    idempotent_producers: int = 3
    transactional_producers: int = 2
    transactional_ratio: float = 0.2  # share of data batches written inside transactions
    abort_ratio: float = 0.3  # share of transactions that end in ABORT
    non_idempotent_ratio: float = 0.05  # share of non-transactional batches with no producer id
    # Shape of the data.
    log_append_time_ratio: float = 0.05
    out_of_order_ratio: float = 0.03  # CreateTime up to two minutes behind the clock
    timestamps: str = "steady"  # a TIMESTAMP_PROFILES name: how CreateTime relates to the clock
    leader_epoch_change_ratio: float = 0.002  # per batch, per partition
    null_key_ratio: float = 0.1  # per record
    tombstone_ratio: float = 0.02  # per keyed record
    header_ratio: float = 0.3  # per record
    # Where the run ends and starts.
    high_watermark_lag_batches: int = 1  # see the module docstring
    start_time_ms: int = DEFAULT_START_TIME_MS
    node_id: int = 0
    templates_per_codec: int = 8  # distinct batch bodies per codec

    def __post_init__(self) -> None:
        # Accept "a,b" and lists from a CLI, keep tuples (hashable, frozen).
        for name in ("topics", "codecs"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            object.__setattr__(self, name, tuple(value))
        self.validate()

    def validate(self) -> None:
        """ValueError with one readable sentence for the first bad option."""
        if not self.topics:
            raise ValueError("topics: at least one topic is needed")
        for f in fields(self):
            if (problem := option_limit_problem(f.name, getattr(self, f.name))) is not None:
                raise ValueError(problem)
        if len(self.topics) * self.partitions > MAX_TOPIC_PARTITIONS:
            raise ValueError(f"topics × partitions must be at most {MAX_TOPIC_PARTITIONS}, not {len(self.topics) * self.partitions}")
        for topic in self.topics:
            problem = topic_name_problem(topic)
            if problem is not None:
                raise ValueError(f"topics: {problem}")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics: a topic is listed twice")
        if not self.codecs:
            raise ValueError("codecs: at least one codec is needed")
        for name in self.codecs:
            codec_id(name)
        for name in ("partitions", "record_size", "batch_size", "templates_per_codec"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("total_bytes", "idempotent_producers", "transactional_producers", "high_watermark_lag_batches",
                     "start_time_ms", "node_id"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.transactional_producers > IDEMPOTENT_PRODUCER_ID_BASE - TRANSACTIONAL_PRODUCER_ID_BASE:
            raise ValueError(f"transactional_producers must be at most {IDEMPOTENT_PRODUCER_ID_BASE - TRANSACTIONAL_PRODUCER_ID_BASE}")
        if self.timestamps not in TIMESTAMP_PROFILES:
            raise ValueError(f"timestamps: {self.timestamps!r} is not one of {', '.join(TIMESTAMP_PROFILES)}")
        if not self.messages_per_second > 0:
            raise ValueError(f"messages_per_second must be positive, not {self.messages_per_second}")
        for f in fields(self):
            if f.name.endswith("_ratio") and not 0.0 <= getattr(self, f.name) <= 1.0:
                raise ValueError(f"{f.name} must be between 0 and 1, not {getattr(self, f.name)}")
        # One record of up to 1.5 × record_size (plus key, headers and batch header) must fit a batch.
        largest_record = 2 * self.record_size + 1024
        if self.segment_bytes < largest_record:
            raise ValueError(f"segment_bytes {self.segment_bytes} cannot hold one batch of one record (record_size {self.record_size})")
        if self.log_config().max_message_bytes < largest_record:
            raise ValueError(f"record_size {self.record_size} makes batches larger than max.message.bytes allows")
        for name in ("retention_ms", "retention_bytes"):
            if getattr(self, name) < -1:
                raise ValueError(f"{name} must be -1 (unlimited) or more, not {getattr(self, name)}")
        self.log_config()  # segment options

    def log_config(self) -> LogConfig:
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            index_interval_bytes=self.index_interval_bytes,
            segment_index_bytes=self.segment_index_bytes,
        )

    def topic_partitions(self) -> list[TopicPartition]:
        return sorted(TopicPartition(t, p) for t in self.topics for p in range(self.partitions))


_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_HOUR_MS = 3_600_000

# How producers stamp CreateTime against the simulated clock, for retention scenarios (KIP-33):
# each profile gives (probability, lowest, highest offset from the clock in ms) per batch, on top of
# out_of_order_ratio's small lags.
TIMESTAMP_PROFILES: dict[str, tuple[float, int, int]] = {
    "steady": (0.0, 0, 0),
    "old": (1.0, -30 * 24 * _HOUR_MS, -30 * 24 * _HOUR_MS),  # backfilled data: a month old on arrival
    "future": (0.05, 60_000, 24 * _HOUR_MS),  # clock-skewed producers, up to a day ahead
    "shuffled": (0.3, -6 * _HOUR_MS, -1_000),  # late data, up to six hours behind
}

# Upper (and lower) bounds of the numeric options, checked before any work starts: a simulation
# is a test fixture, so each bound is far past any useful run yet keeps a typo (99999999999
# partitions) from running until it is killed. Kafka's own int/long configs bound the rest.
OPTION_LIMITS: dict[str, tuple[float, float]] = {
    "seed": (-_INT64_MAX - 1, _INT64_MAX),
    "partitions": (1, 10_000),  # per topic; a broker is advised to hold a few thousand in all
    "total_bytes": (0, 2**40),  # 1 TiB per run
    "messages_per_second": (1e-3, 1e9),
    "record_size": (1, 64 * MiB),
    "batch_size": (1, _INT32_MAX),
    "segment_bytes": (1, _INT32_MAX),
    "segment_ms": (1, _INT64_MAX),
    "index_interval_bytes": (0, _INT32_MAX),
    "segment_index_bytes": (2 * 12, _INT32_MAX),
    "retention_ms": (-1, _INT64_MAX),
    "retention_bytes": (-1, _INT64_MAX),
    "idempotent_producers": (0, 10_000),
    "transactional_producers": (0, 10_000),
    "high_watermark_lag_batches": (0, 1_000_000),
    "start_time_ms": (0, 2**53),  # a millisecond clock a float still holds exactly
    "node_id": (0, _INT32_MAX),
    "templates_per_codec": (1, 1_000),
}
MAX_TOPIC_PARTITIONS = 100_000  # topics × partitions in one log dir


def option_limit_problem(name: str, value: float) -> str | None:
    """Why ``value`` is out of bounds for option ``name`` (None when it is within them)."""
    limits = OPTION_LIMITS.get(name)
    if limits is None:
        return None
    lo, hi = limits
    if not lo <= value <= hi:
        return f"{name} must be {lo:g}..{hi:g}, not {value:g}" if isinstance(value, float) else f"{name} must be {lo}..{hi}, not {value}"
    return None


@dataclass(frozen=True)
class PartitionSummary:
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    recovery_point: int
    log_end_offset: int
    segments: int
    bytes_written: int
    segments_rolled: int
    segments_deleted: int

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SimulationSummary:
    """What one run wrote; ``bytes_written`` can pass ``total_bytes`` by the last batches."""

    log_dir: str
    bytes_written: int
    batches_written: int
    records_written: int
    segments_rolled: int
    segments_deleted: int
    transactions_committed: int
    transactions_aborted: int
    leader_epoch_changes: int
    start_time_ms: int
    end_time_ms: int
    partitions: tuple[PartitionSummary, ...] = field(default=())

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "partitions"}
        out["partitions"] = [p.to_json() for p in self.partitions]
        return out


# --- batch templates ----------------------------------------------------------------------------


_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu order cart checkout payment "
    "refund shipment invoice customer account session click view search product category price"
).split()
_ACTIONS = ("view", "click", "add_to_cart", "purchase", "refund", "login", "logout", "search")


class BatchTemplate:
    """A producer batch built once; :meth:`stamp` makes a new batch from it by rewriting header
    fields inside the CRC (the compressed records are reused as they are)."""

    __slots__ = ("data", "record_count", "max_delta")

    def __init__(self, data: bytes, record_count: int, max_delta: int):
        self.data = data
        self.record_count = record_count
        self.max_delta = max_delta  # max timestamp − base timestamp

    def stamp(self, base_timestamp: int, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool) -> bytes:
        return restamp_batch(
            self.data,
            add_attributes=ATTR_TRANSACTIONAL if transactional else 0,
            base_timestamp=base_timestamp,
            max_timestamp=base_timestamp + self.max_delta,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )


class RecordFactory:
    """Keys, values and headers that look like application events (compressible, varied)."""

    def __init__(self, config: SimulationConfig, rng: random.Random):
        self.config = config
        self.rng = rng

    def record(self, timestamp: int) -> NewRecord:
        rng, c = self.rng, self.config
        key = None if rng.random() < c.null_key_ratio else f"user-{rng.randrange(50_000):05d}".encode()
        if key is not None and rng.random() < c.tombstone_ratio:
            value = None
        else:
            value = self.value(max(1, int(c.record_size * rng.uniform(0.5, 1.5))))
        headers: list[tuple[str, bytes | None]] = []
        if rng.random() < c.header_ratio:
            headers.append(("trace-id", rng.getrandbits(64).to_bytes(8, "big").hex().encode()))
            headers.append(("content-type", b"application/json"))
            if rng.random() < 0.2:
                headers.append(("retry", None))
        return NewRecord(timestamp, key, value, headers)

    def value(self, size: int) -> bytes:
        rng = self.rng
        head = (
            f'{{"id":{rng.randrange(10**9)},"action":"{rng.choice(_ACTIONS)}",'
            f'"amount":{rng.randrange(100000) / 100:.2f},"ref":"{rng.getrandbits(48):012x}","note":"'
        )
        words = []
        length = len(head) + 2
        while length < size:
            word = rng.choice(_WORDS)
            words.append(word)
            length += len(word) + 1
        text = head + " ".join(words) + '"}'
        return text.encode()[:size] if len(text) > size else text.encode()


class TemplatePool:
    """``templates_per_codec`` batch templates for each configured codec.

    No template is larger than the broker takes (segment.bytes and max.message.bytes): like a
    producer filling a batch, one that would be is cut short by its last records.
    """

    def __init__(self, config: SimulationConfig, rng: random.Random):
        self.rng = rng
        self.codec_ids = [codec_id(name) for name in config.codecs]
        factory = RecordFactory(config, rng)
        interval = 1000.0 / config.messages_per_second
        per_batch = max(1, config.batch_size // (config.record_size + 40))
        limit = min(config.segment_bytes, config.log_config().max_message_bytes)
        self.by_codec: dict[int, list[BatchTemplate]] = {}
        for codec in self.codec_ids:
            templates = []
            for _ in range(config.templates_per_codec):
                count = max(1, round(per_batch * rng.uniform(0.25, 1.0)))
                deltas = [round(i * interval) for i in range(count)]
                if count >= 3 and rng.random() < 0.25:
                    # A record sent later but stamped earlier: the max timestamp is not the last one.
                    j = rng.randrange(1, count - 1)
                    deltas[j], deltas[j + 1] = deltas[j + 1], deltas[j]
                records = [factory.record(d) for d in deltas]
                data = build_batch(records, base_offset=0, codec=codec)
                while len(data) > limit and len(records) > 1:
                    records = records[: max(1, len(records) * limit // len(data))] if len(records) > 2 else records[:1]
                    data = build_batch(records, base_offset=0, codec=codec)
                templates.append(BatchTemplate(data, len(records), max(r.timestamp for r in records)))
            self.by_codec[codec] = templates

    def pick(self) -> BatchTemplate:
        return self.rng.choice(self.by_codec[self.rng.choice(self.codec_ids)])


# --- producers ----------------------------------------------------------------------------------


@dataclass
class _Transaction:
    remaining_batches: int
    partitions: list[TopicPartition] = field(default_factory=list)


@dataclass
class _Producer:
    producer_id: int
    epoch: int
    transactional: bool
    coordinator_epoch: int = 0
    sequences: dict[TopicPartition, int] = field(default_factory=dict)
    txn: _Transaction | None = None

    def bump_epoch(self) -> None:
        # A new session (InitProducerId): the epoch moves on and every sequence restarts at 0.
        self.epoch += 1
        self.sequences.clear()


# --- the run ------------------------------------------------------------------------------------


def _derived_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode("utf-8")).digest()[:8], "big")


class _Simulation:
    """One run of the workload over one broker's log dir. The cluster run (``simulate_cluster.py``)
    overrides where batches go (:meth:`_append_to_leader`), how a producer's next sequence is
    found (:meth:`_next_sequence`), what happens after each step (:meth:`_maybe_change_leader`)
    and how the run ends (:meth:`_settle`, :meth:`_apply_retention`, :meth:`_close`, the summary)."""

    def __init__(self, log_dir: Path, config: SimulationConfig, progress: ProgressCallback | None):
        self.broker = BrokerLogDir(
            log_dir, config.log_config(), seed=config.seed, node_id=config.node_id, created_ms=config.start_time_ms,
        )
        self.tps = config.topic_partitions()
        self.logs: dict[TopicPartition, PartitionLog] = {tp: self.broker.partition(tp.topic, tp.partition) for tp in self.tps}
        self.epochs: dict[TopicPartition, int] = {}
        for tp, log in self.logs.items():
            latest_epoch = log.epochs.latest_epoch
            # A restarted broker is elected leader again: the epoch moves on.
            self.epochs[tp] = 0 if latest_epoch is None else latest_epoch + 1
        self._start_workload(config, progress, self.broker.logs)

    def _start_workload(self, config: SimulationConfig, progress: ProgressCallback | None,
                        every: dict[TopicPartition, PartitionLog], templates_config: SimulationConfig | None = None) -> None:
        """The clock, random stream, batch templates, producers and totals, continuing from what
        ``every`` (the partitions already written) holds."""
        self.config = config
        self.progress = progress
        latest = max((log.max_timestamp for log in every.values()), default=-1)
        self.start_ms = max(config.start_time_ms, latest + 1)
        self.clock = float(self.start_ms)
        self.interval = 1000.0 / config.messages_per_second
        # A second run on the same dir continues with different data, still reproducibly.
        self.rng = random.Random(_derived_seed("workload", config.seed, sorted((str(tp), log.log_end_offset) for tp, log in every.items())))
        self.templates = TemplatePool(templates_config or config, random.Random(_derived_seed("templates", config.seed)))
        self._init_producers(every)
        self.next_expiration_check = self.clock + PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS
        # Totals.
        self.bytes_written = 0
        self.batches = 0
        self.records = 0
        self.committed = 0
        self.aborted = 0
        self.epoch_changes = 0
        self.rolled: dict[TopicPartition, int] = {tp: 0 for tp in self.tps}
        self.written: dict[TopicPartition, int] = {tp: 0 for tp in self.tps}
        self.progress_step = max(config.total_bytes // 100, 64 * KiB)
        self.next_progress = self.progress_step

    def _init_producers(self, every: dict[TopicPartition, PartitionLog]) -> None:
        known: dict[int, int] = {}  # producer id → highest epoch seen in any partition
        for log in every.values():
            for entry in log.producer_state.entries():
                known[entry.producer_id] = max(known.get(entry.producer_id, -1), entry.producer_epoch)
        coordinator_epoch = max(
            (e.coordinator_epoch for log in every.values() for e in log.producer_state.entries()), default=0,
        )
        self.transactional = []
        for i in range(self.config.transactional_producers):
            pid = TRANSACTIONAL_PRODUCER_ID_BASE + i
            # The same transactional.id keeps its producer id; a new session bumps the epoch.
            epoch = known[pid] + 1 if pid in known else 0
            self.transactional.append(_Producer(pid, epoch, True, max(coordinator_epoch, 0)))
        self.next_producer_id = max([IDEMPOTENT_PRODUCER_ID_BASE - 1, *known]) + 1
        self.idempotent = [self._new_idempotent_producer() for _ in range(self.config.idempotent_producers)]

    def _new_idempotent_producer(self) -> _Producer:
        producer = _Producer(self.next_producer_id, 0, False)
        self.next_producer_id += 1
        return producer

    # -- appending --

    def _append_to_leader(self, tp: TopicPartition, batch: bytes, log_append_time: int | None) -> AppendResult:
        return self.logs[tp].append(batch, leader_epoch=self.epochs[tp], log_append_time=log_append_time)

    def _next_sequence(self, producer: _Producer, tp: TopicPartition) -> int:
        return producer.sequences.get(tp, 0)

    def _append(self, tp: TopicPartition, batch: bytes, log_append_time: int | None = None) -> AppendResult:
        result = self._append_to_leader(tp, batch, log_append_time)
        self.bytes_written += result.size
        self.written[tp] += result.size
        self.batches += 1
        self.rolled[tp] += result.rolled
        if self.progress is not None and self.bytes_written >= self.next_progress:
            self.progress(self.bytes_written, self.config.total_bytes)
            self.next_progress = self.bytes_written + self.progress_step
        return result

    def _write_data(self, tp: TopicPartition, producer: _Producer | None) -> AppendResult:
        rng, c = self.rng, self.config
        template = self.templates.pick()
        now = int(self.clock)
        if rng.random() < c.out_of_order_ratio:
            base_timestamp = max(0, now - rng.randint(1_000, 120_000))
        else:
            base_timestamp = now
        probability, low, high = TIMESTAMP_PROFILES[c.timestamps]
        if probability and rng.random() < probability:
            base_timestamp = max(0, base_timestamp + rng.randint(low, high))
        self.clock += template.record_count * self.interval
        if producer is None:
            batch = template.stamp(base_timestamp, NO_PRODUCER_ID, -1, -1, False)
        else:
            sequence = self._next_sequence(producer, tp)
            producer.sequences[tp] = next_sequence(sequence, template.record_count)
            batch = template.stamp(base_timestamp, producer.producer_id, producer.epoch, sequence, producer.transactional)
        log_append_time = int(self.clock) if rng.random() < c.log_append_time_ratio else None
        result = self._append(tp, batch, log_append_time)
        self.records += template.record_count
        return result

    def _end_transaction(self, producer: _Producer, commit: bool) -> None:
        txn = producer.txn
        assert txn is not None
        for tp in txn.partitions:
            marker = build_control_batch(
                base_offset=0, commit=commit, producer_id=producer.producer_id, producer_epoch=producer.epoch,
                coordinator_epoch=producer.coordinator_epoch, timestamp=int(self.clock),
            )
            self._append(tp, marker)
            self.records += 1
        producer.txn = None
        if commit:
            self.committed += 1
        else:
            self.aborted += 1

    def _transactional_step(self, producer: _Producer) -> TopicPartition:
        rng = self.rng
        if producer.txn is None:
            if rng.random() < 0.05:
                producer.bump_epoch()
            producer.txn = _Transaction(rng.randint(2, 8))
        txn = producer.txn
        if txn.partitions and rng.random() < 0.7:
            tp = rng.choice(txn.partitions)
        else:
            tp = rng.choice(self.tps)
            if tp not in txn.partitions:
                txn.partitions.append(tp)  # AddPartitionsToTxn: this partition gets a marker
        self._write_data(tp, producer)
        txn.remaining_batches -= 1
        if txn.remaining_batches == 0:
            self._end_transaction(producer, commit=rng.random() >= self.config.abort_ratio)
        return tp

    def _plain_step(self) -> TopicPartition:
        rng, c = self.rng, self.config
        tp = rng.choice(self.tps)
        if not self.idempotent or rng.random() < c.non_idempotent_ratio:
            self._write_data(tp, None)
            return tp
        i = rng.randrange(len(self.idempotent))
        if rng.random() < 0.001:
            # The producer restarted: an idempotent producer without transactional.id gets a new id.
            self.idempotent[i] = self._new_idempotent_producer()
        self._write_data(tp, self.idempotent[i])
        return tp

    def _maybe_change_leader(self, tp: TopicPartition) -> None:
        rng = self.rng
        if rng.random() < self.config.leader_epoch_change_ratio:
            # Leadership moved; now and then it moved away and back, skipping an epoch here.
            self.epochs[tp] += 2 if rng.random() < 0.25 else 1
            self.epoch_changes += 1

    def _maybe_expire_producers(self) -> None:
        if self.clock >= self.next_expiration_check:
            for log in self._every_log():
                log.remove_expired_producers(int(self.clock))
            self.next_expiration_check = self.clock + PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS

    def _every_log(self) -> Iterable[PartitionLog]:
        return self.broker.logs.values()

    # -- the run --

    def run(self) -> SimulationSummary:
        c, rng = self.config, self.rng
        while self.bytes_written < c.total_bytes:
            if self.transactional and rng.random() < c.transactional_ratio:
                tp = self._transactional_step(rng.choice(self.transactional))
            else:
                tp = self._plain_step()
            self._maybe_change_leader(tp)
            self._maybe_expire_producers()
        # Close every transaction, so no marker lands at or above the high watermark.
        for producer in self.transactional:
            if producer.txn is not None:
                self._end_transaction(producer, commit=rng.random() >= c.abort_ratio)
        self._settle()
        deleted: dict[TopicPartition, int] = {}
        if c.retention_ms >= 0 or c.retention_bytes >= 0:
            deleted = self._apply_retention(int(self.clock))
        self._close()
        if self.progress is not None:
            self.progress(self.bytes_written, c.total_bytes)
        return self._summary(deleted)

    def _settle(self) -> None:
        """End each partition with ``high_watermark_lag_batches`` batches above its high watermark."""
        for tp in self.tps:
            log = self.logs[tp]
            lag_start = log.log_end_offset
            self._lag_batches(tp)
            log.update_high_watermark(max(log.active_segment_base_offset, lag_start))

    def _lag_batches(self, tp: TopicPartition) -> None:
        for _ in range(self.config.high_watermark_lag_batches):
            self._write_data(tp, self.idempotent[self.rng.randrange(len(self.idempotent))] if self.idempotent else None)

    def _apply_retention(self, now: int) -> dict:
        c = self.config
        return {tp: len(log.delete_old_segments(now, retention_ms=c.retention_ms, retention_bytes=c.retention_bytes))
                for tp, log in self.broker.logs.items()}

    def _close(self) -> None:
        self.broker.checkpoint()
        self.broker.close()

    def _summary(self, deleted: dict[TopicPartition, int]) -> SimulationSummary:
        partitions = []
        for tp in self.tps:
            log = self.logs[tp]
            partitions.append(PartitionSummary(
                tp.topic, tp.partition, log.log_start_offset, log.high_watermark, log.recovery_point, log.log_end_offset,
                len(log.segments()), self.written[tp], self.rolled[tp], deleted.get(tp, 0),
            ))
        return SimulationSummary(
            log_dir=str(self.broker.path),
            bytes_written=self.bytes_written,
            batches_written=self.batches,
            records_written=self.records,
            segments_rolled=sum(self.rolled.values()),
            segments_deleted=sum(deleted.values()),
            transactions_committed=self.committed,
            transactions_aborted=self.aborted,
            leader_epoch_changes=self.epoch_changes,
            start_time_ms=self.start_ms,
            end_time_ms=int(self.clock),
            partitions=tuple(partitions),
        )


def simulate(
    log_dir: str | Path,
    config: SimulationConfig = SimulationConfig(),
    progress: ProgressCallback | None = None,
) -> SimulationSummary:
    """Append a simulated workload to ``log_dir`` (created if needed; an existing one is continued).

    ``progress(bytes_written, total_bytes)`` is called as the run goes and once at the end.
    """
    return _Simulation(Path(log_dir), config, progress).run()


__all__ = ["BatchTemplate", "PartitionSummary", "SimulationConfig", "SimulationSummary", "simulate"]
