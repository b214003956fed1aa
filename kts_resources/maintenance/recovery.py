"""Rebuild the metadata store from the remote tier alone (``kts recover``).

The tier describes itself: every finished segment has a manifest beside its objects
(``remote_storage/manifest.py``). Recovery lists the tier once, reads every manifest, and records
what they describe — topics with their configs, partitions, COPY_SEGMENT_FINISHED segments with
their leader epochs, log start offsets — then rebuilds each partition's remote log index.

Rules it keeps:
- Nothing is guessed: a segment whose manifest is lost is rebuilt from its objects, which are a
  Kafka segment (offsets, leader epochs, max timestamp and every batch's CRC are in its .log; the
  partition, topic id and base offset in its key; the leader-epoch lineage, indexes and snapshot
  beside it), recorded as finished and its manifest written again, each with one line saying so.
  Only when every offset it holds is in no finished segment: objects whose offsets finished
  segments hold (a crashed copy's leftovers) are reported, never recorded; a .log that fails its
  scan, or a segment that cannot be described whole, is reported with why and kept. A manifest
  whose objects are not all listed (with their sizes) is reported, not recorded.
- A damaged manifest stops recovery before anything is written: one error naming the object.
- Never deletes or overwrites a remote object: it only lists and reads, and writes lost manifests
  and remote log index files under names the tier does not have yet — and, when the partition's
  index had to change, its pointer (``remote-log-index/current``), which then names them.
- Idempotent: segments already in the store (any state) are left as they are, each segment is
  recorded straight in COPY_SEGMENT_FINISHED (never STARTED, which a copy pass would clean up),
  and each batch is one transaction, so a rerun — also after a SIGKILL half-way — converges.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from kts_resources.kafka.crc import crc32c

from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.kafka.checkpoints import parse_leader_epoch_checkpoint
from kts_resources.kafka.errors import KafkaFormatError, error_line
from kts_resources.kafka.partition import TopicPartition
from kts_resources.tiering.lost_ranges import uncovered
from kts_resources.maintenance.remote_integrity import scan_log_object
from kts_resources.remote_log import IndexType, RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import RemoteStorageError, StoredObject, segment_custom_metadata
from kts_resources.remote_storage.keys import (
    LOG_START_OFFSET_NAME,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    MAX_TOPIC_IN_KEY,
    suffix_for_index,
)
from kts_resources.remote_storage.manifest import (
    REQUIRED_OBJECTS,
    ManifestError,
    SegmentManifest,
    decode_group_offsets,
    decode_log_start_offset,
    decode_manifest,
)

if TYPE_CHECKING:
    from kts_resources.metadata.store import RemoteLogMetadataStore
    from kts_resources.remote_storage.base import ObjectInfo, RemoteStorageManager

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
# Segments recorded per transaction: few round trips, and a kill loses at most one batch's work.
BATCH_SEGMENTS = 500
# Manifests read side by side (each is one small GET).
READ_WORKERS = 16
LISTING_PROGRESS_EVERY = 10_000
MANIFEST_PROGRESS_EVERY = 2_000
PARTITION_PROGRESS_EVERY = 100
# Partitions whose remote log index is rebuilt side by side.
INDEX_WORKERS = 4
SAMPLE = 5

Progress = Callable[[str], None]


class RecoveryError(Exception):
    """What stops a recovery before it writes anything (a damaged manifest, a manifest the store
    cannot take): one line, starting with the object's location."""


@dataclass
class TierSurvey:
    """The tier's listing, sorted out by what each object is."""

    objects: int = 0
    sizes: dict[str, int] = field(default_factory=dict)  # every segment object and manifest: key → size
    modified: dict[str, float] = field(default_factory=dict)  # segment object or manifest key → when it was written (epoch s)
    manifests: list[str] = field(default_factory=list)  # manifest keys
    segment_objects: dict[str, list[str]] = field(default_factory=dict)  # key stem → its objects' keys
    index_objects: int = 0  # remote log index files and pointers
    log_start_offsets: dict[str, str] = field(default_factory=dict)  # partition prefix → key of its log start offset record
    group_offsets: list[str] = field(default_factory=list)  # keys of consumer groups' committed offsets records
    other: list[str] = field(default_factory=list)  # keys of no kts layout


@dataclass
class RecoveryReport:
    """What one ``recover`` did; ``to_json`` is ``kts recover --json``."""

    objects_listed: int = 0
    manifests: int = 0
    topics: int = 0
    topics_created: int = 0
    partitions: int = 0
    segments_recovered: int = 0
    segments_rebuilt: int = 0  # of them, rebuilt from their objects (the manifest was lost)
    rebuilt: list[str] = field(default_factory=list)  # one line each: which segment was rebuilt from its objects
    lost_ranges_closed: list[str] = field(default_factory=list)  # one line each: an alarm the tier answered
    segments_present: int = 0
    log_start_offsets_set: int = 0
    objects_without_manifest: list[str] = field(default_factory=list)
    unmanifested_sample: list[str] = field(default_factory=list)  # one key (its .log if listed) per segment, a few
    segments_without_manifest: int = 0
    incomplete_segments: list[str] = field(default_factory=list)  # one line each: manifest location: what is missing
    skipped: list[str] = field(default_factory=list)  # one line each: what was not recovered and why
    other_objects: list[str] = field(default_factory=list)
    index_partitions: int = 0
    index_files_written: int = 0
    index_files_published: int = 0
    index_segments_read: int = 0
    index_errors: list[str] = field(default_factory=list)
    consumer_groups: int = 0  # groups whose committed offsets the tier held
    group_offsets_restored: int = 0  # of their partitions' offsets, those the store lacked and got
    # The partitions whose rows the recovery wrote or read back (their segments, or only their log
    # start offset): what reports them again shows them as the store has them now.
    partitions_recovered: list[TopicPartition] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing that needs a person: every manifest recorded and every index built."""
        return not (self.incomplete_segments or self.skipped or self.index_errors)

    def to_json(self) -> dict:
        return {
            "objects_listed": self.objects_listed,
            "manifests": self.manifests,
            "topics": self.topics,
            "topics_created": self.topics_created,
            "partitions": self.partitions,
            "segments_recovered": self.segments_recovered,
            "segments_rebuilt": self.segments_rebuilt,
            "rebuilt": self.rebuilt,
            "lost_ranges_closed": self.lost_ranges_closed,
            "segments_already_present": self.segments_present,
            "log_start_offsets_set": self.log_start_offsets_set,
            "objects_without_manifest": len(self.objects_without_manifest),
            "segments_without_manifest": self.segments_without_manifest,
            "objects_without_manifest_sample": self.unmanifested_sample,
            "incomplete_segments": self.incomplete_segments,
            "skipped": self.skipped,
            "unrecognised_objects": len(self.other_objects),
            "unrecognised_objects_sample": self.other_objects[:SAMPLE],
            "index_partitions": self.index_partitions,
            "index_files_written": self.index_files_written,
            "index_files_published": self.index_files_published,
            "index_segments_read": self.index_segments_read,
            "index_errors": self.index_errors,
            "consumer_groups": self.consumer_groups,
            "group_offsets_restored": self.group_offsets_restored,
        }


# --- the listing ---------------------------------------------------------------------------------


def survey_tier(rsm: "RemoteStorageManager", progress: Progress | None = None) -> TierSurvey:
    """List the whole tier once and sort every object out: manifests, segment objects (by the
    segment's key stem), remote log index files (by partition), and anything else."""
    survey = TierSurvey()
    root = rsm.keys.root
    for info in rsm.list_objects():
        survey.objects += 1
        if progress is not None and survey.objects % LISTING_PROGRESS_EVERY == 0:
            progress(f"listed {survey.objects} objects")
        _classify(survey, rsm, root, info)
    return survey


def _classify(survey: TierSurvey, rsm: "RemoteStorageManager", root: str, info: "ObjectInfo") -> None:
    parsed = rsm.keys.parse(info.key)
    if parsed is None:
        if rsm.keys.parse_remote_index_key(info.key) is not None:
            survey.index_objects += 1
        elif info.key.endswith(f"/{LOG_START_OFFSET_NAME}"):
            survey.log_start_offsets[info.key[: -len(LOG_START_OFFSET_NAME)]] = info.key
        elif rsm.keys.is_group_offsets_key(info.key):
            survey.group_offsets.append(info.key)
        else:
            survey.other.append(info.key)
        return
    survey.sizes[info.key] = info.size
    if info.last_modified is not None:
        survey.modified[info.key] = info.last_modified
    if parsed.suffix == MANIFEST_SUFFIX:
        survey.manifests.append(info.key)
    else:
        stem = info.key[: -len(parsed.suffix) - 1]
        survey.segment_objects.setdefault(stem, []).append(info.key)


# --- manifests -----------------------------------------------------------------------------------


def read_manifests(rsm: "RemoteStorageManager", keys: Sequence[str], *, workers: int = READ_WORKERS,
                   progress: Progress | None = None) -> list[tuple[str, SegmentManifest]]:
    """(key, manifest) for every manifest key, read side by side. RecoveryError naming the first
    damaged one (and how many more there are) when any is damaged: nothing may be recovered from
    a tier whose own description is in doubt."""

    def read(key: str) -> tuple[str, SegmentManifest | None, str | None]:
        where = rsm.location(key)
        try:
            data = rsm.fetch_object(key)
            manifest = decode_manifest(data, where=where)
            _check_matches_key(rsm, key, manifest, where)
            # The store records the manifest too (as the copy does), so no copy pass writes it again.
            recorded = segment_custom_metadata({MANIFEST_SUFFIX: StoredObject(key, len(data), crc32c(data))})
            md = replace(manifest.metadata, custom_metadata={**manifest.metadata.custom_metadata, **recorded})
            return key, replace(manifest, metadata=md), None
        except ManifestError as e:
            return key, None, str(e)

    out: list[tuple[str, SegmentManifest]] = []
    damaged: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kts-recover-read") as pool:
        for n, (key, manifest, error) in enumerate(pool.map(read, keys), start=1):
            if progress is not None and n % MANIFEST_PROGRESS_EVERY == 0:
                progress(f"read {n} of {len(keys)} manifests")
            if error is not None:
                damaged.append(error)
            else:
                out.append((key, manifest))
    if damaged:
        more = f" (and {len(damaged) - 1} more damaged manifests)" if len(damaged) > 1 else ""
        raise RecoveryError(f"{sorted(damaged)[0]}{more}; nothing was recovered: move the damaged object aside and run kts recover again")
    return out


def _check_matches_key(rsm: "RemoteStorageManager", key: str, manifest: SegmentManifest, where: str) -> None:
    """A manifest describes the segment its own key names (a copied or misplaced manifest is damaged)."""
    parsed = rsm.keys.parse(key)
    md = manifest.metadata
    tip = md.topic_id_partition
    named = (parsed.topic, parsed.topic_id, parsed.partition, parsed.start_offset, parsed.segment_id)
    described = (tip.topic[:MAX_TOPIC_IN_KEY], tip.topic_id, tip.partition, md.start_offset, md.segment_id.id)
    if named != described:
        raise ManifestError(f"{where}: damaged manifest: it describes segment {md.segment_id.id} at offset {md.start_offset} "
                            f"of {tip.topic_partition}, not the segment its key names")


def _missing_objects(manifest: SegmentManifest, survey: TierSurvey) -> list[str]:
    """What of the segment's objects the listing lacks (or has with another size)."""
    problems = []
    for suffix, obj in sorted(manifest.objects.items()):
        size = survey.sizes.get(obj.key)
        if size is None:
            problems.append(f"{suffix} object {obj.key} is missing")
        elif size != obj.size:
            problems.append(f"{suffix} object {obj.key} has {size} bytes, not {obj.size}")
    return problems


# --- recovery ------------------------------------------------------------------------------------


def recover(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", home: Path | None, *,
            progress: Progress | None = None, workers: int = READ_WORKERS) -> RecoveryReport:
    """Rebuild the store's rows from the tier's listing and manifests (into an empty store, or
    one missing rows), then each partition's remote log index under ``home`` (None: skip)."""
    from kts_resources.metadata.store import StaleTopicIdError

    say = progress or (lambda _line: None)
    report = RecoveryReport()
    survey = survey_tier(rsm, progress)
    report.objects_listed = survey.objects
    report.other_objects = sorted(survey.other)
    if survey.objects >= LISTING_PROGRESS_EVERY:  # a short listing needs no progress lines
        say(f"listed {survey.objects} objects: {len(survey.manifests)} manifests")
    manifests = read_manifests(rsm, survey.manifests, workers=workers, progress=progress)
    report.manifests = len(manifests)

    described: set[str] = set()
    complete: list[tuple[str, SegmentManifest]] = []
    for key, manifest in manifests:
        described.add(key[: -len(MANIFEST_SUFFIX) - 1])
        described.update(obj.key[: obj.key.rfind(".")] for obj in manifest.objects.values())
        problems = _missing_objects(manifest, survey)
        if problems:
            report.incomplete_segments.append(f"{rsm.location(key)}: not recovered: {'; '.join(problems)}")
        else:
            complete.append((key, manifest))
    orphaned = sorted(stem for stem in survey.segment_objects if stem not in described)

    # topic name → topic id → partition → manifests; incarnations of a name oldest first, so the
    # newest ends up current and the older ones' partitions are marked for deletion, as they were.
    by_topic: dict[str, dict[uuid.UUID, dict[int, list[tuple[str, SegmentManifest]]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for key, manifest in complete:
        tip = manifest.topic_id_partition
        by_topic[tip.topic][tip.topic_id][tip.partition].append((key, manifest))
    report.topics = sum(len(ids) for ids in by_topic.values())
    deleted_below = read_log_start_offsets(rsm, survey)
    recovered_tips: list[TopicIdPartition] = []
    for name in sorted(by_topic):
        incarnations = by_topic[name]
        newest = {tid: max((m for ms in parts.values() for m in ms), key=lambda km: km[1].metadata.event_timestamp_ms)
                  for tid, parts in incarnations.items()}
        for topic_id in sorted(incarnations, key=lambda tid: (newest[tid][1].metadata.event_timestamp_ms, str(tid))):
            latest_key, latest = newest[topic_id]
            current = store.topic_id(name)
            if current != topic_id:
                try:
                    store.ensure_topic(name, topic_id, latest.topic_configs)
                except StaleTopicIdError as e:
                    # An earlier incarnation of a re-created topic: nothing new can join it. Its
                    # segments already in the store (a rerun) are fine; any others are reported.
                    ids = [m.metadata.segment_id for ms in incarnations[topic_id].values() for _k, m in ms]
                    absent = [sid for sid in ids if store.segment(sid) is None]
                    report.segments_present += len(ids) - len(absent)
                    if absent:
                        report.skipped.append(f"{len(absent)} segments of {name} (topic id {topic_id}) not recovered: {e}")
                    continue
                except ValueError as e:  # a config the store refuses, an id another topic has
                    raise RecoveryError(f"{rsm.location(latest_key)}: topic {name!r}: {e}; nothing more was recovered") from None
                report.topics_created += 1
            for partition in sorted(incarnations[topic_id]):
                tip = TopicIdPartition(topic_id, TopicPartition(name, partition))
                _recover_partition(store, tip, incarnations[topic_id][partition], report, deleted_below.get(tip, 0))
                _recover_lineage(store, rsm, tip, incarnations[topic_id][partition], report)
                recovered_tips.append(tip)
                if len(recovered_tips) % PARTITION_PROGRESS_EVERY == 0:
                    say(f"{len(recovered_tips)} partitions, {report.segments_recovered} segments recovered so far")
    _recover_log_start_only(store, deleted_below, set(recovered_tips), report)
    leftovers = _rebuild_without_manifest(store, rsm, survey, orphaned, report, recovered_tips)
    report.objects_without_manifest = sorted(k for stem in leftovers for k in survey.segment_objects[stem])
    report.segments_without_manifest = len(leftovers)
    report.unmanifested_sample = [f"{stem}.log" if f"{stem}.log" in survey.sizes else sorted(survey.segment_objects[stem])[0]
                                  for stem in leftovers[:SAMPLE]]
    report.partitions = len(recovered_tips)
    report.partitions_recovered = sorted({tip.topic_partition for tip in [*recovered_tips, *deleted_below]}, key=str)
    report.lost_ranges_closed = _close_lost_ranges_the_tier_holds(store, recovered_tips)
    _restore_group_offsets(store, rsm, survey, report)

    if home is not None:
        rebuild_indexes(store, rsm, home, recovered_tips, report, progress=progress)
    return report


def _close_lost_ranges_the_tier_holds(store: "RemoteLogMetadataStore", tips: Sequence[TopicIdPartition]) -> list[str]:
    """Open lost ranges every offset of which a finished segment now holds: a pass that ran while
    the store lacked those segments' rows (before this recovery) saw a hole that was never one.
    Each is acknowledged by ``kts recover``, saying why, and named in one line."""
    closed = []
    for tip in tips:
        open_ranges = store.lost_ranges(tip)
        if not open_ranges:
            continue
        held = [(md.start_offset, md.end_offset)
                for md in store.list_remote_log_segments(tip, states={FINISHED})]
        for lost in open_ranges:
            if uncovered(lost.start_offset, lost.end_offset, held):
                continue
            store.acknowledge_lost_range(tip, lost.start_offset, lost.end_offset, by="kts recover",
                                         reason="every offset is in a finished remote segment recovered from the tier")
            closed.append(f"{tip.topic_partition}: lost range {lost.start_offset}..{lost.end_offset} closed: "
                          "its offsets are in the remote tier (segments recovered into the store)")
    return closed


def read_log_start_offsets(rsm: "RemoteStorageManager", survey: TierSurvey) -> dict[TopicIdPartition, int]:
    """Every log start offset kts recorded in the tier (its retention and DeleteRecords move it,
    and write it there before any object goes), by partition. A damaged record, or one naming
    another partition than its key, is a RecoveryError (nothing written yet)."""
    out: dict[TopicIdPartition, int] = {}
    for prefix, key in sorted(survey.log_start_offsets.items()):
        where = rsm.location(key)
        try:
            named, offset = decode_log_start_offset(rsm.fetch_object(key), where=where)
        except ManifestError as e:
            raise RecoveryError(f"{e}; nothing was recovered: move the damaged object aside and run kts recover again") from None
        if rsm.keys.partition_prefix(named) != prefix:
            raise RecoveryError(f"{where}: damaged log start offset record: it names {named.topic_partition} (topic id "
                                f"{named.topic_id}), not the partition its key names; nothing was recovered")
        out[named] = offset
    return out


def _restore_group_offsets(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", survey: TierSurvey,
                           report: RecoveryReport) -> None:
    """Consumer groups' committed offsets (`kts serve` mirrors them into the tier), each partition's
    where the store has none. A damaged record is reported and its group left out: the segments
    do not depend on it."""
    from kts_resources.metadata.group_offsets import CommittedOffset, GroupOffsets

    offsets = GroupOffsets(store.engine)
    for key in sorted(survey.group_offsets):
        where = rsm.location(key)
        try:
            group_id, committed = decode_group_offsets(rsm.fetch_object(key), where=where)
            if rsm.keys.group_offsets_key(group_id) != key:
                raise ManifestError(f"{where}: damaged consumer group offsets record: it names group {group_id!r}, "
                                    f"not the group its key names")
        except ManifestError as e:
            report.skipped.append(f"{e}; that group's committed offsets were not restored")
            continue
        report.consumer_groups += 1
        report.group_offsets_restored += offsets.restore(group_id, [CommittedOffset(*o) for o in committed])


def _recover_log_start_only(store: "RemoteLogMetadataStore", log_starts: dict[TopicIdPartition, int],
                            recovered: set[TopicIdPartition], report: RecoveryReport) -> None:
    """Partitions whose every remote segment retention or DeleteRecords deleted: only their log
    start offset is left in the tier, and it must come back, or the offsets below it that a
    broker still holds locally would read again. An earlier incarnation of a re-created topic
    (its name now another id) is passed over: none of it is readable."""
    from kts_resources.metadata.store import StaleTopicIdError

    for tip, offset in sorted(log_starts.items(), key=lambda item: (str(item[0].topic_partition), str(item[0].topic_id))):
        if tip in recovered:
            continue
        if store.topic_id(tip.topic) != tip.topic_id:
            try:
                store.ensure_topic(tip.topic, tip.topic_id)
            except StaleTopicIdError:
                continue
            report.topics_created += 1
        with store.partition_lock(tip):
            state = store.partition_state(tip)
            if state.delete_state is not None:
                continue
            if store.update_log_start_offset(tip, offset) != state.log_start_offset:
                report.log_start_offsets_set += 1
            store.observe_first_offset(tip, offset)  # nothing below it is kts's to have copied


def _recover_partition(store: "RemoteLogMetadataStore", tip: TopicIdPartition,
                       manifests: list[tuple[str, SegmentManifest]], report: RecoveryReport, deleted_below: int = 0) -> None:
    """The partition's segments (in the order they finished), its log start offset (the highest
    its manifests or a DeleteRecords record in the tier say) and the first offset kts watched,
    under the partition lock so that no copy or expiry runs meanwhile."""
    state = store.partition_state(tip).delete_state
    if state is not None:  # being deleted: nothing joins it; what it has already is fine
        absent = [m for _k, m in manifests if store.segment(m.metadata.segment_id) is None]
        report.segments_present += len(manifests) - len(absent)
        if absent:
            report.skipped.append(f"{len(absent)} segments of {tip.topic_partition} (topic id {tip.topic_id}) not recovered: "
                                  f"the partition is {state.name}")
        return
    ordered = sorted((m for _k, m in manifests),
                     key=lambda m: (m.metadata.event_timestamp_ms, m.metadata.start_offset, str(m.metadata.segment_id.id)))
    with store.partition_lock(tip):
        added = 0
        for i in range(0, len(ordered), BATCH_SEGMENTS):
            added += store.recover_remote_log_segments(tip, [m.metadata for m in ordered[i:i + BATCH_SEGMENTS]])
        report.segments_recovered += added
        report.segments_present += len(ordered) - added
        log_start = max(deleted_below, *(m.log_start_offset for m in ordered))
        before = store.partition_state(tip).log_start_offset
        if store.update_log_start_offset(tip, log_start) != before:
            report.log_start_offsets_set += 1
        # kts watched the partition from its first copied segment on (the data-loss rule's floor).
        store.observe_first_offset(tip, min(m.metadata.start_offset for m in ordered))


def _recover_lineage(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", tip: TopicIdPartition,
                     manifests: list[tuple[str, SegmentManifest]], report: RecoveryReport) -> None:
    """The partition's leader-epoch lineage, as far as the tier holds it: the leader-epoch object
    of its newest segment (highest epoch, then highest end offset) is the lineage of the replica
    that copied it, up to that segment's end. Newer epochs are recorded again by the next copy pass."""
    if not manifests:
        return
    newest = max((m.metadata for _k, m in manifests),
                 key=lambda md: (max(md.segment_leader_epochs, default=-1), md.end_offset, str(md.segment_id.id)))
    stored = store.segment(newest.segment_id)
    if stored is None or stored.state is not RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
        return
    try:
        lineage = parse_leader_epoch_checkpoint(rsm.fetch_index(stored, IndexType.LEADER_EPOCH))
    except (RemoteStorageError, KafkaFormatError) as e:
        report.skipped.append(f"{tip.topic_partition}: leader-epoch lineage not recovered: {e}")
        return
    store.record_lineage(tip, lineage)


# --- segments whose manifest is lost -------------------------------------------------------------


def _rebuild_without_manifest(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", survey: TierSurvey,
                              stems: Sequence[str], report: RecoveryReport, tips: list[TopicIdPartition]) -> list[str]:
    """Each segment with objects but no manifest (by key stem, in offset order) rebuilt from its
    objects where it holds offsets no finished segment holds; returns the stems left as they are
    because they hold no record another segment does not (a crashed copy's leftovers)."""
    leftovers = []
    for stem in stems:
        outcome, line, tip = _rebuild_segment(store, rsm, survey, stem)
        if outcome == "leftover":
            leftovers.append(stem)
        elif outcome == "present":
            report.segments_present += 1
        elif outcome == "skipped":
            report.skipped.append(line)
        else:
            report.segments_recovered += 1
            report.segments_rebuilt += 1
            report.rebuilt.append(line)
            if tip not in tips:
                tips.append(tip)
    return leftovers


def _rebuild_segment(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", survey: TierSurvey,
                     stem: str) -> tuple[str, str | None, TopicIdPartition | None]:
    """(outcome, line, partition): "rebuilt", "leftover" (no record only it holds), "present" (the
    store has it), or "skipped" (kept, and the line says why it cannot be described)."""
    by_suffix = {rsm.keys.parse(key).suffix: key for key in survey.segment_objects[stem]}
    log_key = by_suffix.get(LOG_SUFFIX)
    if log_key is None:
        return "leftover", None, None  # indexes or a snapshot alone hold no record
    parsed = rsm.keys.parse(log_key)
    if store.segment(parsed.segment_id) is not None:
        return "present", None, None
    where = rsm.location(log_key)
    kept = "the segment has no manifest and was not rebuilt; its objects are kept"
    name = _topic_name(store, parsed)
    if name is None:
        return "skipped", f"{where}: topic id {parsed.topic_id} is not in the store and its name may be cut short in the key; {kept}", None
    tip = TopicIdPartition(parsed.topic_id, TopicPartition(name, parsed.partition))
    try:
        found = scan_log_object(rsm, log_key)
    except RemoteStorageError as e:
        return "skipped", f"{e}; {kept}", None
    if found.problem is not None:
        return "skipped", f"{found.problem_line(where)}; {kept}", None
    if found.last_offset is None:
        return "leftover", None, None  # no batch: no record
    start, end = parsed.start_offset, found.last_offset
    if found.first_offset < start:
        return "skipped", f"{where}: its first batch is at offset {found.first_offset}, below the base offset {start} its key names; {kept}", None
    finished = store.list_remote_log_segments(tip, states={FINISHED})
    holes = uncovered(start, end, [(md.start_offset, md.end_offset) for md in finished])
    if not holes:
        return "leftover", None, None  # every offset is in finished segments: a crashed copy's leftovers
    if holes != [(start, end)]:
        return "skipped", (f"{where}: segment {start}..{end} overlaps finished segments (offsets "
                           f"{', '.join(f'{a}..{b}' for a, b in holes)} are in none of them); {kept}"), None
    missing = REQUIRED_OBJECTS - by_suffix.keys()
    if missing:
        return "skipped", f"{where}: segment {start}..{end} lacks its {', '.join(sorted(missing))} object(s); {kept}", None
    try:
        objects, lineage = _segment_objects(rsm, by_suffix, found)
        line = _record_rebuilt(store, rsm, survey, tip, parsed.segment_id, start, end, found, objects, lineage, finished)
    except (RemoteStorageError, ValueError) as e:  # _NotRebuilt too
        return "skipped", f"{where}: segment {start}..{end}: {e}; {kept}", None
    return "rebuilt", f"{where}: {line}", tip


class _NotRebuilt(ValueError):
    """Why a segment described from its objects cannot join the store."""


def _topic_name(store: "RemoteLogMetadataStore", parsed) -> str | None:
    """The topic's name: the store's for this topic id, else the key's unless it may be cut short."""
    for name, topic_id in store.topics().items():
        if topic_id == parsed.topic_id:
            return name
    return parsed.topic if len(parsed.topic) < MAX_TOPIC_IN_KEY else None


def _segment_objects(rsm: "RemoteStorageManager", by_suffix: dict[str, str], found) -> tuple[dict[str, StoredObject], list]:
    """suffix → the object as the tier has it (key, size, CRC-32C), and the leader-epoch lineage
    its checkpoint object holds ([] when it does not parse: the batches' epochs stand in)."""
    objects = {LOG_SUFFIX: StoredObject(found.key, found.size, found.crc32c)}
    lineage: list = []
    for suffix, key in by_suffix.items():
        if suffix == LOG_SUFFIX:
            continue
        data = rsm.fetch_object(key)
        objects[suffix] = StoredObject(key, len(data), crc32c(data))
        if suffix == suffix_for_index(IndexType.LEADER_EPOCH):
            try:
                lineage = parse_leader_epoch_checkpoint(data, path=rsm.location(key))
            except KafkaFormatError:
                lineage = []
    return objects, lineage


def _record_rebuilt(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", survey: TierSurvey, tip: TopicIdPartition,
                    segment_uuid: uuid.UUID, start: int, end: int, found, objects: dict[str, StoredObject], lineage: list,
                    finished: Sequence[RemoteLogSegmentMetadata]) -> str:
    """Describe the segment as its copy did, write its manifest, record it finished; the line to
    report. _NotRebuilt when its topic or partition cannot take it."""
    from kts_resources.tiering.copier import manifest_context_for, segment_leader_epochs, write_manifest
    from kts_resources.metadata.store import StaleTopicIdError

    written_ms = int(survey.modified.get(found.key, 0) * 1000)
    before = [md for md in finished if md.start_offset < start]
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, segment_uuid), start_offset=start, end_offset=end,
        # Without timestamps (magic 0) the object's write time stands in, as the file's did for the copy.
        max_timestamp_ms=found.max_timestamp if found.max_timestamp >= 0 else written_ms,
        broker_id=(before[-1] if before else finished[0]).broker_id if finished else 0,
        event_timestamp_ms=written_ms, segment_size_in_bytes=found.size,
        segment_leader_epochs=segment_leader_epochs(lineage, found.epochs, start, end),
        state=FINISHED, custom_metadata=segment_custom_metadata(objects))
    current = store.topic_id(tip.topic)
    created = ""
    if current is None:
        try:
            store.ensure_topic(tip.topic, tip.topic_id)
        except (StaleTopicIdError, ValueError) as e:
            raise _NotRebuilt(f"topic {tip.topic!r}: {e}") from None
        created = f"; topic {tip.topic} recorded without config overrides (the tier held none for it)"
    elif current != tip.topic_id:
        raise _NotRebuilt(f"topic {tip.topic!r} is topic id {current} in the store, not {tip.topic_id}")
    state = store.partition_state(tip).delete_state
    if state is not None:
        raise _NotRebuilt(f"the partition is {state.name}")
    with store.partition_lock(tip):
        manifest = write_manifest(rsm, metadata, objects, manifest_context_for(store, tip))
        recorded = replace(metadata, custom_metadata={**metadata.custom_metadata, **manifest})
        store.recover_remote_log_segments(tip, [recorded])
        store.observe_first_offset(tip, start)
    return (f"segment {start}..{end} of {tip.topic_partition} rebuilt from the segment object (its manifest was "
            f"missing): recorded as finished and its manifest written again{created}")


# --- the remote log index ------------------------------------------------------------------------


@dataclass(frozen=True)
class _IndexOutcome:
    error: str | None = None
    written: int = 0
    published: int = 0
    read: int = 0


def rebuild_indexes(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", home: Path, tips: Sequence[TopicIdPartition],
                    report: RecoveryReport, *, progress: Progress | None = None,
                    workers: int = INDEX_WORKERS) -> None:
    """Each partition's remote log index, ``workers`` partitions side by side (reading segments
    and writing the cache wait on I/O, not on the GIL)."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kts-recover-index") as pool:
        outcomes = pool.map(lambda tip: _rebuild_index(store, rsm, home, tip), tips)
        for n, (tip, outcome) in enumerate(zip(tips, outcomes), start=1):
            if outcome is None:
                continue
            if outcome.error is not None:
                report.index_errors.append(f"{tip.topic_partition}: remote log index not rebuilt: {outcome.error}")
            else:
                report.index_partitions += 1
                report.index_files_written += outcome.written
                report.index_files_published += outcome.published
                report.index_segments_read += outcome.read
            if progress is not None and n % PARTITION_PROGRESS_EVERY == 0:
                progress(f"remote log index of {n} of {len(tips)} partitions rebuilt")


def _rebuild_index(store: "RemoteLogMetadataStore", rsm: "RemoteStorageManager", home: Path, tip: TopicIdPartition) -> _IndexOutcome | None:
    """Bring the partition's remote log index, in the tier and under ``home``, up to its finished
    segments (``remote_index_tier.update_partition_index``, under the partition lock): the tier's
    current file sets fetched (or the flat layout of earlier versions, when no pointer names any),
    each segment's entries taken from them where they cover it whole, read from its .log object
    otherwise; only what changed published, under new keys. None: nothing finished to index."""
    if not store.list_remote_log_segments(tip, states={FINISHED}):
        return None
    read = 0

    def entries_for(md: RemoteLogSegmentMetadata) -> list[ri.RemoteLogIndexEntry]:
        nonlocal read
        read += 1
        return index_cache.read_segment_entries(rsm, md)

    try:
        update = index_tier.update_partition_index(store, rsm, index_cache.cache_directory(home, tip), tip, entries_for)
    except Exception as e:  # noqa: BLE001 — one partition's index is its own; the store rows stand
        return _IndexOutcome(error=error_line(e))
    return _IndexOutcome(written=len(update.build.written), published=update.uploaded, read=read)
