"""Which partitions a ``kts sync`` pass runs: those where something changed since their last pass.

A number on screen is a promise: every step that changes a partition reports it again. A partition
where nothing changed has nothing to report again, and at a broker's size its runs are the whole
cost of a pass (~55 Dagster statements a partition for its events, checks and tags, beside ~50 of
the store's: bench/scale_bench.py). So a pass reads, for every partition at once, what its steps
would start from (``kts_resources.tiering.pass_fingerprint``: files, checkpoints, the store's rows,
configs, the index cache and inventory, the replica role) and leaves a partition out when all of:

- its fingerprint equals the one recorded after its last pass, which completed and passed every
  check (a failed one is never recorded, so it is taken again every pass until it passes);
- no run planned a materialisation of it since (a daemon run, a UI launch: the UI may show what
  that run found, which only a pass may replace);
- no segment of it can have come due under retention.ms or local.retention.ms since (``due_ms``);
- its finished segments are all in the remote tier, whole (the check ``remote_segments_in_bucket``
  makes, made here: the tier can change under kts without any of the above changing).

The fingerprints are kept in the instance's key-value store (``dagster_internals``), one value per
broker scope.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from kts_assets.asset_keys import LOCAL_SEGMENTS, REMOTE_LOG_INDEX, REMOTE_SEGMENTS, RETENTION_STATE
from kts_assets.dagster_internals import read_key_values, write_key_values
from kts_resources.tiering.pass_fingerprint import Fingerprint

STATE_KEY = f"kts/sync/partition_fingerprints/{REMOTE_SEGMENTS.to_user_string()}"
PIPELINE_ASSETS = (LOCAL_SEGMENTS, REMOTE_SEGMENTS, RETENTION_STATE, REMOTE_LOG_INDEX)
# Partitions whose tier objects are inspected at once (each mostly waits on the tier).
INSPECTORS = 4


def code_salt() -> str:
    """What kts code reported the partitions: a new meaning of the assets' metadata re-reports all."""
    from kts_assets.assets.copy import COPY_CODE_VERSION
    from kts_assets.assets.remote_index import REMOTE_INDEX_CODE_VERSION
    from kts_assets.assets.retention import RETENTION_CODE_VERSION
    from kts_assets.assets.segments import INVENTORY_CODE_VERSION

    return f"sync-skip 1; {INVENTORY_CODE_VERSION} {COPY_CODE_VERSION} {RETENTION_CODE_VERSION} {REMOTE_INDEX_CODE_VERSION}"


def last_planned(instance: dg.DagsterInstance, keys: Iterable[str]) -> dict[str, int]:
    """Per partition, the storage id of the newest materialisation any run planned of it (one
    query per pipeline asset, whatever the partition count)."""
    wanted = set(keys)
    newest: dict[str, int] = {}
    for asset_key in PIPELINE_ASSETS:
        for key, storage_id in instance.get_latest_storage_id_by_partition(
                asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, wanted).items():
            newest[key] = max(newest.get(key, 0), storage_id)
    return newest


def recorded(instance: dg.DagsterInstance) -> dict[str, list]:
    """partition key → [digest, due_ms, newest planned storage id] after its last clean pass."""
    value = read_key_values(instance, {STATE_KEY}).get(STATE_KEY)
    try:
        return {str(k): list(v) for k, v in json.loads(value).items()} if value else {}
    except (ValueError, AttributeError, TypeError):
        return {}  # unreadable: every partition is taken, and recorded afresh


def unchanged(keys: Iterable[str], now: Mapping[str, Fingerprint], planned: Mapping[str, int],
              before: Mapping[str, list], now_ms: int) -> list[str]:
    """The keys whose fingerprint and newest planned materialisation are as recorded and whose
    due time has not come."""
    out = []
    for key in keys:
        fingerprint, entry = now.get(key), before.get(key)
        if fingerprint is None or entry is None or len(entry) != 3:
            continue
        digest, due, planned_id = entry
        if digest == fingerprint.digest and planned_id == planned.get(key) and (due is None or due > now_ms):
            out.append(key)
    return out


def tier_intact(keys: Iterable[str], fingerprints: Mapping[str, Fingerprint], storage, store) -> set[str]:
    """Those of ``keys`` whose finished segments (as their fingerprints read them) have their
    objects all in the tier with their recorded sizes and checksums and their manifests there (as
    ``remote_segments_in_bucket`` judges: an object verified before at the version the tier lists
    is not read again)."""
    from kts_resources.maintenance.remote_integrity import RoutineLooks

    keys = list(keys)
    looks = RoutineLooks(store, storage)
    looks.read(md for key in keys for md in fingerprints[key].finished)

    def intact(key: str) -> bool:
        fingerprint = fingerprints[key]
        try:
            return looks.inspect(fingerprint.tip, list(fingerprint.finished)).intact
        except Exception:  # noqa: BLE001 - the pass's check says what; here it only means "take it"
            return False

    with ThreadPoolExecutor(max_workers=max(1, min(INSPECTORS, len(keys))), thread_name_prefix="kts-tier-inspect") as pool:
        whole = {key for key, ok in zip(keys, pool.map(intact, keys)) if ok}
    looks.write()
    return whole


def record(instance: dg.DagsterInstance, clean: Iterable[str], fingerprints: Mapping[str, Fingerprint],
           planned: Mapping[str, int], keep: Mapping[str, list]) -> None:
    """Record the fingerprints of the ``clean`` partitions (their pass completed and passed every
    check), beside ``keep`` (the entries of partitions left out, as they were)."""
    state = dict(keep)
    for key in clean:
        fingerprint = fingerprints.get(key)
        if fingerprint is not None and key in planned:
            state[key] = [fingerprint.digest, fingerprint.due_ms, planned[key]]
    write_key_values(instance, {STATE_KEY: json.dumps(state, separators=(",", ":"), sort_keys=True)})
