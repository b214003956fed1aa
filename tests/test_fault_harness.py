"""The standing race-and-fault harness (issue 34): real ``kts`` processes, faults struck at a moment
picked by what kts does (tests/fault_harness.py), and after each fault the next normal pass, then
the same checks every time:

- a remote-only reader fetches every finished remote segment's first and last offset exactly as
  the simulated broker wrote them;
- no COPY_SEGMENT_STARTED / DELETE_SEGMENT_STARTED row is left;
- the tier's listing equals the store (every finished segment's objects, as its manifest names
  them; no object of any other segment id; nothing else but index files and log start records);
- every offset from the start of kts's watch to the local log start is remote or in an open lost
  range;
- the failed pass exits non-zero with its error in a few clear lines, never a traceback; the
  recovering pass exits 0.

Scenarios share one simulated log dir per family and start from copies of it (and, for the
commands that need a tier to work on, from a snapshot of one synced tier and its store). Kill -9
moments are random but seeded: ``KTS_FAULT_SEED`` picks another set (the default is fixed, so CI
runs the same strikes every time); a failure message names the strike.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.lost_ranges import LOST_CAUSE

from .fault_harness import (
    BrokerTruth,
    CliServer,
    Outcome,
    Postgres,
    Running,
    S3Server,
    Scenario,
    Tier,
    broker_deletes_oldest,
    can_mount,
    fill,
    kafka_uuid,
    partition_rows,
    stderr_problems,
    tmpfs,
    wait_for,
)

pytestmark = pytest.mark.spark  # kts sync on the session's Spark Connect server (tests/fixtures_spark.py)

SEED = int(os.environ.get("KTS_FAULT_SEED", "34"))
KiB, MiB = 1024, 1024 * 1024
# Small: two partitions of ~10 segments each; every closed segment is eligible (simulate's rule).
COPY_FAMILY = SimulationConfig(seed=SEED, topics=("orders",), partitions=2, total_bytes=1 * MiB, segment_bytes=48 * KiB)


class Harness:
    """The module's servers and families, and a factory of scenarios."""

    def __init__(self, root: Path):
        self.root = root
        self.postgres = Postgres(root / "pg")
        self.s3 = S3Server()
        self.s3.start()
        self.cli_server = CliServer(root / "cli")
        self.cli_server.start()
        self.families: dict[str, tuple[Path, BrokerTruth]] = {}
        self.baselines: dict[str, Scenario] = {}

    def close(self) -> None:
        try:
            self.cli_server.stop()
        finally:
            try:
                if self.s3.running:
                    self.s3.stop()
            finally:
                self.postgres.close()

    def family(self, name: str = "copy", config: SimulationConfig = COPY_FAMILY) -> tuple[Path, BrokerTruth]:
        """A simulated broker log dir (and its records) that scenarios share: read-only to them, as
        kts never writes a broker's own log dir; a scenario whose broker writes gets a copy."""
        if name not in self.families:
            log_dir = self.root / "families" / name
            simulate(log_dir, config)
            self.families[name] = (log_dir, BrokerTruth().read(log_dir))
        return self.families[name]

    def tiered(self, kind: str) -> Scenario:
        """The copy family synced once to a tier of ``kind``: what expiry, topic deletion, restore,
        recover and scrub scenarios start from (copies of its store, tier and KTS_HOME). The first
        one's sync also leaves the family's local segment inventory, which every later scenario on
        the shared log dir starts with (its syncs then scan nothing: Spark jobs are most of a
        small sync's time, and no scenario here is about the inventory)."""
        name = f"tiered-{kind}"
        if name not in self.baselines:
            baseline = self._scenario(name, kind, seed_inventory=kind != "filesystem")
            synced = baseline.sync()
            assert synced.status == 0, synced
            self.baselines[name] = baseline
        return self.baselines[name]

    def scenario(self, name: str, tier: str, *, private_log_dir: bool = False) -> Scenario:
        """A fresh scenario on the copy family: an empty store and tier; the family's log dir
        itself, or (``private_log_dir``: its broker writes on) a copy of it."""
        self.tiered("filesystem")  # the inventory it starts with
        return self._scenario(name, tier, private_log_dir=private_log_dir)

    def _scenario(self, name: str, tier: str, *, private_log_dir: bool = False, seed_inventory: bool = True) -> Scenario:
        log_dir, truth = self.family()
        root = self.root / "scenarios" / name
        root.mkdir(parents=True)
        if private_log_dir:
            log_dir = shutil.copytree(log_dir, root / "logs")
        elif seed_inventory:
            shutil.copytree(self.baselines["tiered-filesystem"].home / "inventory", root / "home" / "inventory")
        remote = self.tier(tier, root)
        return Scenario(name, root, self.postgres, self.postgres.new_database(), remote, log_dir, truth.copy(),
                        cli_server=self.cli_server)

    def from_tiered(self, name: str, kind: str, *, empty_store: bool = False) -> Scenario:
        """A scenario starting where ``tiered(kind)`` left off: its log dir (shared), tier and
        KTS_HOME, and its store (or, with ``empty_store``, a fresh one: the store lost)."""
        baseline = self.tiered(kind)
        root = self.root / "scenarios" / name
        shutil.copytree(baseline.home, root / "home")
        tier = self.tier(kind, root)
        baseline.tier.copy_to(tier)
        database = self.postgres.new_database(None if empty_store else baseline.database)
        return Scenario(name, root, self.postgres, database, tier, baseline.log_dir, baseline.truth.copy(),
                        cli_server=self.cli_server)

    def tier(self, kind: str, where: Path) -> Tier:
        if kind == "filesystem":
            return Tier("filesystem", root=where / "remote")
        tier = Tier("s3", s3=self.s3, bucket=f"harness-{uuid.uuid4().hex[:12]}")
        self.s3.client().create_bucket(Bucket=tier.bucket)
        return tier


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Iterator[Harness]:
    h = Harness(tmp_path_factory.mktemp("fault-harness"))
    try:
        yield h
    finally:
        h.close()


def strike(name: str) -> random.Random:
    """The seeded random stream of one scenario's strike."""
    return random.Random(f"{SEED}:{name}")


def kill_9_when(gate, running: Running, what: str) -> str:
    """kill -9 of ``running`` the moment ``gate`` holds it; ``what`` with the moment and the seed,
    to name the scenario in a failure."""
    try:
        moment = gate.wait(running)
        running.kill()
    finally:
        gate.release()
    killed = running.wait()
    what = f"{what} at {moment} (KTS_FAULT_SEED={SEED})"
    assert killed.status in (-9, 137), f"{what}\n{killed}"
    return what


def stop_when(gate, running: Running, server) -> Outcome:
    """``server`` (PostgreSQL, S3) stopped the moment ``gate`` holds ``running``, started again once
    ``running`` ended: its outcome."""
    try:
        gate.wait(running)
        server.stop()
    finally:
        gate.release()
    try:
        return running.wait()
    finally:
        server.start()


def sync_with_a_server_stopped(scenario: Scenario, gate, server, what: str, *, cause: str | None = None) -> Outcome:
    """A sync whose ``server`` (PostgreSQL, S3) stops the moment ``gate`` holds it: it fails in a
    line per partition (naming ``cause``), and the next sync, with the server back, converges."""
    failed = stop_when(gate, scenario.start("sync"), server)
    assert_recovered(scenario, scenario.sync(), what)
    assert_failed_in_a_line(failed, what, cause=cause)
    return failed


def assert_recovered(scenario: Scenario, outcome: Outcome, what: str, *, lost: bool = False) -> None:
    """The recovering pass exits 0 without a traceback — or, with ``lost``, exits 1 naming only the
    open lost ranges, as README says every pass does until they are acknowledged — and the
    scenario's world checks out."""
    assert not stderr_problems(outcome), f"{what}: the recovering pass\n{outcome}"
    if lost:
        lines = [line for line in outcome.stderr.splitlines() if line.strip() and not line.startswith(NOTICES)]
        assert outcome.status == 1 and lines and all(" lost range" in line or LOST_CAUSE in line or
                                                     line.startswith("kts: sync failed for") for line in lines), \
            f"{what}: the recovering pass should name only open lost ranges\n{outcome}"
    else:
        assert outcome.status == 0, f"{what}: the recovering pass\n{outcome}"
    problems = scenario.problems()
    assert not problems, f"{what}: after the recovering pass\n" + "\n".join(problems)


# Progress lines kts sync prints on stderr as it goes (not errors: those start "kts: ").
NOTICES = ("sync: ", "copy_job over", "kts recover:", "kts restore:", "kts scrub:", "sync: released", "released run")


def assert_failed_in_a_line(outcome: Outcome, what: str, *, partitions: int = 2,
                            cause: str | None = None) -> None:
    """A failed pass: non-zero, no traceback, its error in a few lines (at most one per partition
    and a summary; progress lines aside), each partition's line naming ``cause`` when given."""
    assert outcome.status != 0, f"{what}: the failed pass exited 0\n{outcome}"
    lines = [line for line in outcome.stderr.splitlines() if line.strip() and not line.startswith(NOTICES)]
    unexplained = cause is not None and any(cause.lower() not in line.lower() for line in lines
                                            if not line.startswith("kts: sync failed for"))
    if stderr_problems(outcome) or not lines or len(lines) > partitions + 1 or unexplained:
        raise AssertionError(f"{what}: the failed pass should say why in a line per failed partition, without a traceback\n{outcome}")


def assert_store_went_away_without_its_password(outcome: Outcome, harness: Harness) -> None:
    """The one line names the store by host, port and database (README), never with its password."""
    gone = [line for line in outcome.stderr.splitlines() if "went away" in line]
    assert gone and all(line.startswith("kts: metadata store at 127.0.0.1:") for line in gone), outcome
    assert harness.postgres.server.password not in outcome.stderr + outcome.stdout


# --- kill -9 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["filesystem", "s3"])
def test_kill_9_of_a_sync_at_a_seeded_moment_then_the_next_sync_converges(harness, tier):
    scenario = harness.scenario(f"kill-sync-{tier}", tier)
    rng = strike(scenario.name)
    if tier == "filesystem":
        # Inside the transaction of a copy's COPY_SEGMENT_STARTED (nothing of it committed) or of its
        # COPY_SEGMENT_FINISHED (every object uploaded, its manifest written, the row still STARTED).
        kind, state = rng.choice([("SEGMENT_ADDED", None), ("SEGMENT_STATE_CHANGED", "COPY_SEGMENT_FINISHED")])
        gate = scenario.gate().arm(kind, state, nth=rng.randint(1, 12))
    else:
        # While an object of a segment is being uploaded (the request held in the server).
        gate = harness.s3.gate("PUT", rf"^/{scenario.tier.bucket}/", nth=rng.randint(1, 40))
    running = scenario.start("sync")
    what = kill_9_when(gate, running, "kill -9")
    assert_recovered(scenario, scenario.sync(), what)


# --- two writers -----------------------------------------------------------------------------------


def test_two_syncs_at_once_on_the_same_partitions_both_succeed_and_leave_one_whole_tier(harness):
    """Two kts sharing one store and tier (two hosts: each its own KTS_HOME and Dagster instance, so
    no Dagster pool serialises their copy steps) sync the same partitions at once."""
    scenario = harness.scenario("two-writers", "filesystem")
    other = scenario.other_host()
    # The first writer is held inside its first copy (its partition lock taken); the second starts
    # and reaches that partition's lock; then both go on.
    gate = scenario.gate().arm("SEGMENT_ADDED", nth=1)
    first = scenario.start("sync")
    try:
        gate.wait(first)
        second = scenario.start("sync", env=other)
        wait_for(lambda: scenario.postgres.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2",
            scenario.database)[0][0], "the second writer waiting for the first one's partition lock", second)
    finally:
        gate.release()
    for outcome in (first.wait(), second.wait()):
        assert outcome.status == 0 and not stderr_problems(outcome), outcome
    assert_recovered(scenario, scenario.sync(), "two writers")


# --- the remote tier or the store stopped mid-copy ---------------------------------------------


def test_s3_stopped_mid_copy_fails_the_pass_in_a_few_lines_and_the_next_sync_converges(harness):
    scenario = harness.scenario("s3-stopped-mid-copy", "s3")
    gate = harness.s3.gate("PUT", rf"^/{scenario.tier.bucket}/.*\.log$", nth=3)
    sync_with_a_server_stopped(scenario, gate, harness.s3, "S3 stopped mid-copy")


def test_postgres_stopped_mid_copy_fails_the_pass_in_a_few_lines_and_the_next_sync_converges(harness):
    scenario = harness.scenario("pg-stopped-mid-copy", "filesystem")
    # Inside the transaction of the third copy's COPY_SEGMENT_FINISHED: its objects are uploaded.
    gate = scenario.gate().arm("SEGMENT_STATE_CHANGED", "COPY_SEGMENT_FINISHED", nth=3)
    failed = sync_with_a_server_stopped(scenario, gate, harness.postgres, "PostgreSQL stopped mid-copy", cause="went away")
    assert_store_went_away_without_its_password(failed, harness)


# --- the broker's own retention and checkpoints, mid-sync ---------------------------------------


@pytest.mark.parametrize("remove", [True, False], ids=["deleted", "renamed-to-deleted"])
def test_broker_retention_taking_the_segments_being_copied_leaves_a_lost_range_never_a_wrong_tier(harness, remove):
    scenario = harness.scenario(f"retention-mid-copy-{'deleted' if remove else 'renamed'}", "filesystem", private_log_dir=True)
    # Held as kts records COPY_SEGMENT_STARTED for orders-0's third segment; meanwhile the broker's
    # retention takes its four oldest segments: two copied, the one being copied, and the next.
    gate = scenario.gate().arm("SEGMENT_ADDED", nth=3, partition=0)
    running = scenario.start("sync")
    try:
        gate.wait(running)
        broker_deletes_oldest(scenario.log_dir, "orders", 0, 4, remove=remove)
    finally:
        gate.release()
    running.wait()  # the segment vanished under it: a lost range, or its copy after all
    assert_recovered(scenario, scenario.sync(), "broker retention mid-copy", lost=True)


def test_a_checkpoint_rewritten_mid_sync_by_a_broker_writing_on_is_taken_by_the_next_pass(harness):
    scenario = harness.scenario("checkpoints-mid-sync", "filesystem", private_log_dir=True)
    gate = scenario.gate().arm("SEGMENT_ADDED", nth=2, partition=1)
    running = scenario.start("sync")
    try:
        gate.wait(running)
        # The broker writes on: segments roll, the high watermark, recovery point and log start
        # checkpoints are rewritten (each atomically, as Kafka writes them).
        simulate(scenario.log_dir, SimulationConfig(**{**COPY_FAMILY.__dict__, "total_bytes": 256 * KiB, "start_time_ms": 0}))
        scenario.truth.read(scenario.log_dir)
    finally:
        gate.release()
    first = running.wait()
    assert first.status == 0 and not stderr_problems(first), first
    assert_recovered(scenario, scenario.sync(), "checkpoints rewritten mid-sync")


def test_the_broker_advancing_its_log_start_checkpoint_mid_sync_deletes_nothing_from_the_tier(harness):
    """Finding 1's race: the broker's retention removes local segments kts has copied and rewrites
    log-start-offset-checkpoint while a sync runs; every segment kts copied stays finished and
    readable (7-day retention, nothing is due)."""
    scenario = harness.scenario("log-start-checkpoint-mid-sync", "filesystem", private_log_dir=True)
    assert scenario.sync().status == 0
    copied = {s.segment_id for s in scenario.finished()}
    simulate(scenario.log_dir, SimulationConfig(**{**COPY_FAMILY.__dict__, "total_bytes": 128 * KiB, "start_time_ms": 0}))
    scenario.truth.read(scenario.log_dir)
    gate = scenario.gate().arm("SEGMENT_ADDED", nth=1, partition=0)
    running = scenario.start("sync")
    try:
        gate.wait(running)
        broker_deletes_oldest(scenario.log_dir, "orders", 0, 5)
        broker_deletes_oldest(scenario.log_dir, "orders", 1, 5)
    finally:
        gate.release()
    first = running.wait()
    assert not stderr_problems(first), first
    assert_recovered(scenario, scenario.sync(), "log start checkpoint advanced mid-sync")
    gone = copied - {s.segment_id for s in scenario.finished()}
    if gone:
        raise AssertionError(f"{len(gone)} of {len(copied)} copied segments were deleted from the tier after the broker's "
                           f"own retention advanced log-start-offset-checkpoint\n{first}")


# --- full disks ------------------------------------------------------------------------------------


needs_mount = pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")


@needs_mount
def test_a_full_tier_fails_the_copy_in_a_line_per_partition_and_the_next_sync_after_space_is_freed_converges(harness):
    scenario = harness.scenario("full-tier", "filesystem")
    # A tier with room for about half of the data: the copies fill it mid-way.
    with tmpfs(scenario.tier.root, "512k") as resize:
        failed = scenario.sync()
        resize("64m")
        assert_recovered(scenario, scenario.sync(), "a full tier")
    assert_failed_in_a_line(failed, "a full tier", cause="No space left on device")


@needs_mount
def test_a_full_kts_home_fails_the_sync_in_a_line_and_the_next_sync_after_space_is_freed_converges(harness):
    scenario = harness.scenario("full-kts-home", "filesystem")
    with tmpfs(scenario.home, "16m"):
        ballast = fill(scenario.home)
        failed = scenario.sync()
        ballast.unlink()
        assert_recovered(scenario, scenario.sync(), "a full KTS_HOME")
    assert_failed_in_a_line(failed, "a full KTS_HOME", cause="No space left on device")
    assert "Exceeded max_retries" not in failed.stderr and str(scenario.home) in failed.stderr, failed


@needs_mount
def test_a_fetch_from_the_tier_with_a_full_kts_home_still_answers(harness):
    scenario = harness.from_tiered("full-kts-home-fetch", "filesystem")
    segment = scenario.finished()[3]
    with tmpfs(scenario.home, "1m"):
        fill(scenario.home)
        fetched = scenario.kts("fetch", "orders", str(segment.partition), "--offset", str(segment.start_offset), "--json",
                               env={"KTS_LOG_DIRS": str(scenario.no_logs)})
    assert fetched.status == 0 and not stderr_problems(fetched), fetched
    records = json.loads(fetched.stdout)["records"]
    assert records and records[0] == scenario.truth.between(segment.tp, segment.start_offset, segment.start_offset)[0]


# --- expiry (the retention pass of a sync) ------------------------------------------------------------


def expiring(harness: Harness, name: str, kind: str) -> Scenario:
    """A synced scenario whose orders-0 log start offset was just moved past its six oldest
    segments (kts delete-records): the next sync's retention pass deletes them."""
    scenario = harness.from_tiered(name, kind)
    sixth = [s for s in scenario.finished() if s.partition == 0][6]
    moved = scenario.kts("delete-records", "orders", "0", "--before", str(sixth.start_offset))
    assert moved.status == 0, moved
    return scenario


def test_kill_9_of_an_expiry_pass_at_a_seeded_moment_then_the_next_sync_finishes_it(harness):
    scenario = expiring(harness, "kill-expiry", "filesystem")
    rng = strike(scenario.name)
    state = rng.choice(["DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"])
    gate = scenario.gate().arm("SEGMENT_STATE_CHANGED", state, nth=rng.randint(1, 6))
    running = scenario.start("sync")
    what = kill_9_when(gate, running, "kill -9 of an expiry pass")
    assert_recovered(scenario, scenario.sync(), what)


def test_postgres_stopped_mid_expiry_then_the_next_sync_finishes_it(harness):
    scenario = expiring(harness, "pg-stopped-mid-expiry", "filesystem")
    gate = scenario.gate().arm("SEGMENT_STATE_CHANGED", "DELETE_SEGMENT_FINISHED", nth=2)
    failed = sync_with_a_server_stopped(scenario, gate, harness.postgres, "PostgreSQL stopped mid-expiry", cause="went away")
    assert_store_went_away_without_its_password(failed, harness)


def test_s3_stopped_mid_expiry_then_the_next_sync_finishes_it(harness):
    scenario = expiring(harness, "s3-stopped-mid-expiry", "s3")
    gate = harness.s3.gate("POST", rf"^/{scenario.tier.bucket}/?$", nth=2, query="delete")
    sync_with_a_server_stopped(scenario, gate, harness.s3, "S3 stopped mid-expiry")


def due(before: list) -> set[uuid.UUID]:
    """The six segments ``expiring`` made due: orders-0's oldest."""
    return {s.segment_id for s in sorted((s for s in before if s.partition == 0), key=lambda s: s.start_offset)[:6]}


def assert_only_the_due_segments_deleted(scenario: Scenario, before: list, what: str) -> None:
    """The six segments ``expiring`` made due are gone from the store; every other one is as it was."""
    assert {s.segment_id for s in scenario.finished()} == {s.segment_id for s in before} - due(before), \
        f"{what}: the recovering pass should have deleted exactly the six due segments"


@pytest.mark.parametrize(("transaction", "tier", "left_in"), [
    ("DELETE_SEGMENT_STARTED", "filesystem", "COPY_SEGMENT_FINISHED"),
    ("DELETE_SEGMENT_FINISHED", "filesystem", "DELETE_SEGMENT_STARTED"),
    ("DELETE_SEGMENT_FINISHED", "s3", "DELETE_SEGMENT_STARTED"),
], ids=["in-started-filesystem", "in-finished-filesystem", "in-finished-s3"])
def test_kill_9_inside_a_batch_s_transaction_then_the_next_sync_deletes_every_due_segment_and_no_other(harness, transaction, tier, left_in):
    """The six due segments expire in one batch: killed inside the transaction that would start
    their delete (no object touched yet) or finish it (every object already gone), all six are left
    in the state before it, none half-way, and the next pass ends it."""
    scenario = expiring(harness, f"kill-in-{transaction.lower()}-{tier}", tier)
    before = scenario.finished()
    gate = scenario.gate().arm("SEGMENT_STATE_CHANGED", transaction, nth=strike(scenario.name).randint(1, 6))
    what = kill_9_when(gate, scenario.start("sync"), f"kill -9 inside a batch's {transaction} transaction")
    assert {s.state for s in scenario.segments() if s.segment_id in due(before)} == {left_in}, what
    assert_recovered(scenario, scenario.sync(), what)
    assert_only_the_due_segments_deleted(scenario, before, what)


@pytest.mark.parametrize("request_nth", [2, 3], ids=["manifests", "objects"])
def test_kill_9_mid_deleteobjects_then_the_next_sync_deletes_every_due_segment_and_no_other(harness, request_nth):
    """Held in the batch's DeleteObjects request of its manifests or of its other objects and killed
    there (the sync's first DeleteObjects is the preflight's probe; then the batch's two)."""
    scenario = expiring(harness, f"kill-mid-deleteobjects-{request_nth}", "s3")
    before = scenario.finished()
    gate = harness.s3.gate("POST", rf"^/{scenario.tier.bucket}/?$", nth=request_nth, query="delete")
    what = kill_9_when(gate, scenario.start("sync"), "kill -9 mid-DeleteObjects")
    assert {s.state for s in scenario.segments() if s.segment_id in due(before)} == {"DELETE_SEGMENT_STARTED"}, what
    assert_recovered(scenario, scenario.sync(), what)
    assert_only_the_due_segments_deleted(scenario, before, what)


# --- topic deletion ------------------------------------------------------------------------------------


def test_kill_9_of_a_topic_delete_at_a_seeded_moment_then_a_rerun_finishes_it(harness):
    scenario = harness.from_tiered("kill-topic-delete", "filesystem")
    rng = strike(scenario.name)
    state = rng.choice(["DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"])
    gate = scenario.gate().arm("SEGMENT_STATE_CHANGED", state, nth=rng.randint(1, 16))
    running = scenario.start("topic", "delete", "orders")
    what = kill_9_when(gate, running, "kill -9 of kts topic delete")
    assert_recovered(scenario, scenario.kts("topic", "delete", "orders"), what)
    assert scenario.tier.objects() == {}, f"{what}: the topic's objects are left in the tier"
    assert {row["delete_state"] for row in partition_rows(scenario.postgres, scenario.database).values()} == \
        {"DELETE_PARTITION_FINISHED"}


# --- restore -------------------------------------------------------------------------------------------


def assert_restored(scenario: Scenario, to: Path, what: str) -> None:
    """The restored partition dir holds the broker's segment files, byte for byte, and no leftover."""
    restored = to / "orders-0"
    original = scenario.log_dir / "orders-0"
    names = sorted(p.name for p in restored.iterdir())
    segments = [n for n in names if n.endswith(".log")]
    assert segments, f"{what}: nothing restored ({names})"
    for name in names:
        if name.endswith((".log", ".index", ".timeindex")):
            assert (restored / name).read_bytes() == (original / name).read_bytes(), f"{what}: {name} differs"
        else:
            assert name.endswith((".snapshot", ".txnindex", "leader-epoch-checkpoint", "partition.metadata")), \
                f"{what}: {name} left in the restored partition dir"
    closed = sorted(p.name for p in original.glob("*.log"))[:-1]  # every closed segment was copied
    assert segments == closed, f"{what}: restored {segments}, copied {closed}"


def fault_when(gate, running: Running, fault, name: str) -> tuple[Outcome, str]:
    """``fault(running)`` struck the moment ``gate`` holds ``running`` (it returns how to heal);
    healed once ``running`` ended: its outcome, and the scenario's name with the moment and seed."""
    try:
        moment = gate.wait(running)
        heal = fault(running)
    finally:
        gate.release()
    outcome = running.wait()
    heal()
    return outcome, f"{name} at {moment} (KTS_FAULT_SEED={SEED})"


def restore_then_rerun(harness: Harness, name: str, fault) -> None:
    scenario = harness.from_tiered(name, "s3")
    to = scenario.root / "restored"
    gate = harness.s3.gate("GET", rf"^/{scenario.tier.bucket}/.*\.log$", nth=strike(name).randint(2, 12))
    running = scenario.start("restore", "orders", "0", "--to", str(to))
    first, what = fault_when(gate, running, fault, name)
    assert not stderr_problems(first), f"{what}\n{first}"
    if first.status != 0:  # a finished restore is not run again: README, it refuses a dir holding segments
        rerun = scenario.kts("restore", "orders", "0", "--to", str(to))
        assert rerun.status == 0 and not stderr_problems(rerun), f"{what}: the rerun\n{rerun}"
    assert_restored(scenario, to, what)
    assert not scenario.problems()
    if first.status not in (0, -9, 137):
        assert_failed_in_a_line(first, what, partitions=1)


def test_kill_9_of_a_restore_at_a_seeded_moment_then_a_rerun_finishes_it(harness):
    def kill(running):
        running.kill()
        return lambda: None

    restore_then_rerun(harness, "kill-restore", kill)


def test_postgres_stopped_mid_restore_then_a_rerun_finishes_it(harness):
    def stop(running):
        harness.postgres.stop()
        return harness.postgres.start

    restore_then_rerun(harness, "pg-stopped-mid-restore", stop)


def test_s3_stopped_mid_restore_then_a_rerun_finishes_it(harness):
    def stop(running):
        harness.s3.stop()
        return harness.s3.start

    restore_then_rerun(harness, "s3-stopped-mid-restore", stop)


# --- recover ---------------------------------------------------------------------------------------------


def recover_then_rerun(harness: Harness, name: str, kind: str, arm, fault) -> None:
    scenario = harness.from_tiered(name, kind, empty_store=True)
    baseline = {(s.segment_id, s.start_offset, s.end_offset) for s in harness.tiered(kind).finished()}
    gate = arm(scenario)
    running = scenario.start("recover")
    first, what = fault_when(gate, running, fault, name)
    assert_recovered(scenario, scenario.kts("recover"), what)
    assert {(s.segment_id, s.start_offset, s.end_offset) for s in scenario.finished()} == baseline, \
        f"{what}: the store recovered other segments than the tier holds"
    if first.status not in (0, -9, 137):
        assert_failed_in_a_line(first, what, partitions=1)


def test_kill_9_of_a_recover_at_a_seeded_moment_then_a_rerun_finishes_it(harness):
    def kill(running):
        running.kill()
        return lambda: None

    nth = strike("kill-recover").randint(1, 20)
    recover_then_rerun(harness, "kill-recover", "filesystem",
                       lambda scenario: scenario.gate().arm("SEGMENT_RECOVERED", nth=nth), kill)


def test_postgres_stopped_mid_recover_then_a_rerun_finishes_it(harness):
    def stop(running):
        harness.postgres.stop()
        return harness.postgres.start

    recover_then_rerun(harness, "pg-stopped-mid-recover", "filesystem",
                       lambda scenario: scenario.gate().arm("SEGMENT_RECOVERED", nth=12), stop)


def test_s3_stopped_mid_recover_then_a_rerun_finishes_it(harness):
    def stop(running):
        harness.s3.stop()
        return harness.s3.start

    recover_then_rerun(harness, "s3-stopped-mid-recover", "s3",
                       lambda scenario: harness.s3.gate("GET", rf"^/{scenario.tier.bucket}/.*\.manifest$", nth=5), stop)


# --- scrub ---------------------------------------------------------------------------------------------


def test_kill_9_of_a_scrub_at_a_seeded_moment_then_a_rerun_finishes_it(harness):
    scenario = harness.from_tiered("kill-scrub", "s3")
    client, bucket, prefix = harness.s3.client(), scenario.tier.bucket, scenario.tier.prefix
    # Orphans: objects of segment ids the store never knew (an upload whose STARTED row is gone).
    for segment in scenario.finished()[:3]:
        source = next(k for k in scenario.tier.objects() if kafka_uuid(segment.segment_id) in k and k.endswith(".log"))
        orphan = source.replace(kafka_uuid(segment.segment_id), kafka_uuid(uuid.uuid4()))
        client.copy_object(Bucket=bucket, Key=f"{prefix}/{orphan}", CopySource={"Bucket": bucket, "Key": f"{prefix}/{source}"})
    rng = strike(scenario.name)
    if rng.random() < 0.5:
        gate = harness.s3.gate("POST", rf"^/{bucket}/?$", nth=1, query="delete")
    else:
        gate = harness.s3.gate("GET", rf"^/{bucket}/?$", nth=rng.randint(1, 2), query="list-type")
    running = scenario.start("scrub", "--grace", "0")
    what = kill_9_when(gate, running, "kill -9 of kts scrub")
    assert_recovered(scenario, scenario.kts("scrub", "--grace", "0"), what)
