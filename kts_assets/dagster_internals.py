"""The one module of the pipeline that uses Dagster's private API (``dagster._core``), and why
each use has no public road in Dagster 1.13. (The instance's event log storage,
``kts_resources.dagster_event_log``, subclasses Dagster's PostgreSQL one and says why there.)

* :func:`materialization_target` — an ``AssetCheckEvaluation`` for one partition of a ranged run
  must name the materialisation it checked (without it the UI counts the evaluation as stale and
  shows no status for the partition). ``dg.AssetCheckEvaluation`` takes it as
  ``target_materialization_data``, but its type, ``AssetCheckEvaluationTargetMaterializationData``,
  is not exported at the top level; Dagster fills it in itself only for a single-partition run.
* :func:`plan_materialization_again` — a partition whose copy or retention pass failed must show
  failed in the UI's partitions view. Dagster's open-source event logs do not store
  ``ASSET_FAILED_TO_MATERIALIZE`` events (``can_store_asset_failure_events`` is False), and no public
  API lets a step over a partition range materialise only some of its partitions: the output of a
  ranged step materialises every one. The view counts a partition failed when its latest event is
  a materialisation *planned* by a run that failed (``partition_status_cache``); so, after the
  materialisation, the step records that planned event again for the failed partitions, which
  ``AssetMaterializationPlannedData`` and ``DagsterEvent`` (both under ``dagster._core.events``) build.
* :func:`update_sensor_cursor` — `kts sync` moves the roll sensor's stored cursor for what it
  copied, outside any sensor tick. The public cursor API (``context.update_cursor``) exists only
  inside an evaluation; the other roads (``dagster sensor cursor --set``, GraphQL's
  ``setSensorCursor``) need a loaded workspace or a running webserver and replace the whole
  cursor. The instance's ``*_instigator_state`` methods are public, but the state, selector and
  origin types they take are all under ``dagster._core``.
* :func:`add_partition_metadata` — a ranged step reports each partition's numbers with
  ``context.add_asset_metadata(partition_key=…)``, whose check that the key is in the run's range
  reads every dynamic partition from the instance again, per call: at 4,000 partitions a pass paid
  ~16,000 reads of 4,000 keys (bench/scale_bench.py), quadratic in the partition count. The same
  check against the step's own keys, read once, then the step's metadata accumulator (what
  ``add_asset_metadata`` adds to, ``StepExecutionContext._metadata_accumulator``) takes the metadata.
* :func:`read_key_values` / :func:`write_key_values` — a sensor's per-partition state (thousands of
  entries) lives in the instance's key-value store, its cursor only names it: a cursor is shown
  whole on the sensor's page. The instance has no public key-value API; its run storage's
  ``get_cursor_values`` / ``set_cursor_values`` are the ones Dagster's own daemons use.

Pinned with the dagster release in pyproject.toml; tests/test_roll_sensor.py and tests/test_checks.py
fail if these types move.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from kts_assets.broker_scope import DEFINITIONS_MODULE

if TYPE_CHECKING:
    from dagster._core.remote_origin import RemoteInstigatorOrigin

# The type ``dg.AssetCheckEvaluation``'s ``target_materialization_data`` takes.
MaterializationTarget = AssetCheckEvaluationTargetMaterializationData

# The module every code location of kts loads (workspace.yaml, `kts ui`, `kts code-server`).


def materialization_target(record: dg.EventLogRecord) -> MaterializationTarget:
    """What ``dg.AssetCheckEvaluation(target_materialization_data=...)`` takes for the
    materialisation ``record``: the one the evaluation is about."""
    return MaterializationTarget(storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp)


def plan_materialization_again(context: dg.AssetExecutionContext, asset_key: dg.AssetKey,
                               partition_keys: Iterable[str]) -> None:
    """Record in the run's event log that the run plans to materialise these partitions of
    ``asset_key``, after it materialised them: each then shows failed once the run fails, and
    materialised again when a later run materialises it."""
    from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, DagsterEventType

    step_key = context.op_execution_context.get_step_execution_context().step.key
    for key in partition_keys:
        context.instance.report_dagster_event(DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value,
            job_name=context.job_def.name,
            message=f"{asset_key.to_user_string()} {key} failed in this run: shown failed once the run ends",
            event_specific_data=AssetMaterializationPlannedData(asset_key, partition=key),
            step_key=step_key,
        ), context.run.run_id, logging.DEBUG)


# The partition keys of each running step, read once per step (see add_partition_metadata).
_STEP_PARTITION_KEYS: weakref.WeakKeyDictionary[object, frozenset[str]] = weakref.WeakKeyDictionary()


def add_partition_metadata(context: dg.AssetExecutionContext, metadata: Mapping[str, Any], *,
                           asset_key: dg.AssetKey | None, partition_key: str) -> None:
    """What ``context.add_asset_metadata(metadata, asset_key=asset_key, partition_key=partition_key)``
    does, with its checks, reading the step's partition keys once per step instead of every dynamic
    partition once per call. ``asset_key`` None: the step's only asset."""
    step = context.op_execution_context.get_step_execution_context()
    keys = _STEP_PARTITION_KEYS.get(step)
    if keys is None:
        keys = _STEP_PARTITION_KEYS[step] = frozenset(context.partition_keys)
    if partition_key not in keys:
        raise dg.DagsterInvariantViolationError(f"metadata for partition {partition_key!r}, which this step does not materialise")
    if asset_key is None:
        if len(context.assets_def.keys) != 1:
            raise dg.DagsterInvariantViolationError("metadata without an asset key in a step of several assets")
        asset_key = context.assets_def.key
    if asset_key not in context.assets_def.keys:
        raise dg.DagsterInvariantViolationError(f"metadata for {asset_key.to_user_string()}, which this step does not materialise")
    step._metadata_accumulator = step._metadata_accumulator.with_additional_asset_metadata(  # noqa: SLF001 - see the module docstring
        asset_key=asset_key, partition_key=partition_key, metadata=metadata)


def update_sensor_cursor(instance: dg.DagsterInstance, sensor: dg.SensorDefinition, location_name: str,
                         change: Callable[[str | None], str | None]) -> int:
    """Replace the stored cursor of ``sensor`` (in the code location ``location_name``) with
    ``change(cursor)``, as the daemon would after a tick; returns how many stored states were
    written (none where ``change`` leaves the cursor as it was).

    The stored state is the one the daemon keeps, found by the sensor's selector (location,
    repository, sensor name). With none yet (the daemon never ran on this instance) one is added
    as the daemon itself would add it for a sensor running by default, ``change(None)`` its cursor."""
    # Imported here: the scheduler's state types cost ~150 ms that loading the definitions avoids.
    from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
    from dagster._core.definitions.selector import InstigatorSelector
    from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, InstigatorType, SensorInstigatorData

    selector_id = InstigatorSelector(location_name=location_name, repository_name=SINGLETON_REPOSITORY_NAME,
                                     name=sensor.name).get_id()
    states = [s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR) if s.selector_id == selector_id]
    if not states:
        instance.add_instigator_state(InstigatorState(
            _sensor_origin(sensor, location_name), InstigatorType.SENSOR, InstigatorStatus.DECLARED_IN_CODE,
            SensorInstigatorData(min_interval=sensor.minimum_interval_seconds, cursor=change(None),
                                 sensor_type=sensor.sensor_type)))
        return 1
    written = 0
    for state in states:
        data = state.instigator_data
        if not isinstance(data, SensorInstigatorData):
            continue
        cursor = change(data.cursor)
        if cursor != data.cursor:
            instance.update_instigator_state(state.with_data(data._replace(cursor=cursor)))
            written += 1
    return written


def _sensor_origin(sensor: dg.SensorDefinition, location_name: str) -> RemoteInstigatorOrigin:
    """The origin `dagster dev` gives the sensor when it loads workspace.yaml (a managed gRPC
    server on this interpreter running the definitions module); the daemon finds the state by its
    selector (location, repository and sensor name), which this origin carries — so a broker's
    location, served by `kts code-server` beside a cluster, finds it too."""
    from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
    from dagster._core.remote_origin import ManagedGrpcPythonEnvCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = ManagedGrpcPythonEnvCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name=DEFINITIONS_MODULE),
        location_name=location_name)
    return RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, SINGLETON_REPOSITORY_NAME), sensor.name)


def read_key_values(instance: dg.DagsterInstance, keys: set[str]) -> dict[str, str]:
    """Values of the instance's key-value store (the table Dagster's own daemons keep their
    cursors in). Sensors keep their per-partition state there and only its digest in the cursor
    (kts_assets.sensors.cursor): ``DagsterInstance`` has no public key-value API in 1.13, its run
    storage's ``get_cursor_values`` / ``set_cursor_values`` are what the daemons use."""
    return dict(instance.run_storage.get_cursor_values(keys))


def write_key_values(instance: dg.DagsterInstance, values: dict[str, str]) -> None:
    """Set keys of the instance's key-value store (see :func:`read_key_values`)."""
    instance.run_storage.set_cursor_values(values)
