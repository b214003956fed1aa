"""A copy run launched through Dagster's daemon (the path the roll sensor, the reconcile schedule and
a launch from the UI take) against ``kts sync`` doing the same work: goal ≤ 1.5× its wall time.

    .venv/bin/python bench/daemon_run_bench.py [--size 256MiB] [--segment-size 16MiB] [--partitions 4]
                                               [--repeats N] [--no-warmup] [--quick] [--json PATH]

Over one simulated log dir (``sync_bench.simulate_log_dir``), rounds interleave:

- "kts sync": ``python -m kts_assets.cli sync`` as a subprocess in a fresh world (database, remote
  tier, KTS_HOME, DAGSTER_HOME with the repo's dagster.yaml), wall time (the baseline; it runs
  copy_job in its own process, as a user runs it);
- "daemon-launched run": one ``dagster-daemon run`` stays up on its own world for the whole bench,
  as in a deployment (started untimed, the partitions registered as the discovery sensor registers
  them; each round empties the world's store, tier and KTS_HOME behind the same names).
  ``dagster job launch`` submits copy_job over the whole partition range, with the range tags the
  roll sensor's requests carry, to the instance's queued run coordinator, as the UI's launch button
  does; the daemon dequeues it and the default run launcher starts the run worker in a process of
  its own. Timed from the run's creation to its end (RunRecord create → end timestamps): the queue,
  the worker's start-up and code load, the Spark session and every step. The run's lifecycle
  events (enqueued, starting, started, resources up, finished) go into the JSON.

Both attach to a standing Spark Connect server started untimed: the syncs to one named by
``KTS_SPARK_REMOTE``, the daemon's run workers to their KTS_HOME's embedded server by kts's default
(neither variable set), which the bench checks they used rather than starting one of their own.
Correctness, untimed: both runs succeed and copy every eligible segment (the store holds exactly
them as COPY_SEGMENT_FINISHED; the first and last byte-identical). The machine may be shared, so the result is the ratio, from rounds that interleave the two (order
rotated each round); best and median rounds are reported. Prints a table, progress on stderr, JSON
to bench/results/daemon_run.json by default.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, format_rows, git_state, progress, write_json
from sync_bench import (
    MiB,
    Databases,
    eligible_segments,
    make_sync_env,
    median,
    run_sync,
    simulate_log_dir,
    verify,
    versions,
    warm,
)

from kts_assets.batching import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from kts_assets.cli.common import parse_size
from kts_assets.partitions import topic_partitions
from kts_resources.spark import connect_server as spark_connect
from kts_resources.kafka.logdir import LogDir

GOAL = 1.5  # daemon-launched run ÷ kts sync, wall time
RUN_TIMEOUT_S = 1800
DAEMON_READY_TIMEOUT_S = 180
DEFAULTS = {  # (full, --quick)
    "size": (256 * MiB, 16 * MiB),
    "segment_size": (16 * MiB, 2 * MiB),
    "partitions": (4, 2),
    "repeats": (3, 1),
}


class Daemon:
    """``dagster-daemon run`` on one world's instance, stopped (its whole process group) by ``stop``."""

    def __init__(self, environ: dict[str, str], log: Path):
        self.environ = environ
        self.log = log
        daemon = Path(sys.executable).with_name("dagster-daemon")
        with open(log, "wb") as out:
            self.process = subprocess.Popen([str(daemon), "run", "-w", str(REPO_ROOT / "workspace.yaml")], env=environ,
                                            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, instance) -> None:
        """Until the queued-run daemon has sent a heartbeat: then a submitted run is picked up."""
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"dagster-daemon exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            if "QUEUED_RUN_COORDINATOR" in instance.get_daemon_heartbeats():
                return
            time.sleep(0.5)
        raise SystemExit(f"dagster-daemon sent no heartbeat in {DAEMON_READY_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._stop_its_dagster_processes()

    def _stop_its_dagster_processes(self) -> None:
        """The code server the daemon starts for the workspace (and a run worker) lives in a session
        of its own: a daemon that ended before stopping it leaves it behind (one outlived a failed
        bench by 38 minutes, its heartbeat timeout notwithstanding). Found by this world's
        DAGSTER_HOME in its environment and a dagster command line, and ended."""
        import signal

        from kts_resources.servers.local_processes import alive, command_line, pids

        mark = f"DAGSTER_HOME={self.environ['DAGSTER_HOME']}".encode()
        left = []
        for pid in pids():
            try:
                environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if pid != os.getpid() and mark in environment and any("dagster" in arg for arg in command_line(pid)):
                left.append(pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while any(alive(pid) for pid in left) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = [pid for pid in left if alive(pid)]
            if not left:
                return


class StandingDaemon:
    """One world (database, tier, KTS_HOME, DAGSTER_HOME) with ``dagster-daemon run`` up on it for
    the whole bench, as in a deployment; each round resets the world's data (kts's store emptied in
    the same database, where the daemon's Dagster instance lives on; the tier and KTS_HOME's
    inventory and index cache emptied) and the daemon launches one copy run.

    Spark is kts's embedded default here: neither KTS_SPARK_REMOTE nor KTS_SPARK_MASTER, and the
    KTS_HOME's own Spark Connect server started beforehand, as a `kts sync` would have left it. Every
    run worker must attach to that server: its pid is checked after each run (issue 10: a run the
    daemon launches uses the standing server)."""

    def __init__(self, base: Path, dbs: Databases, root: Path, partition_keys: list[str]):
        self.dbs, self.partition_keys = dbs, partition_keys
        self.url = dbs.fresh()
        self.env = make_sync_env(base, self.url, root, {})
        self.spark_home = self.env.kts_home / "spark-connect"
        self.server_pid = spark_connect.ensure_running(self.spark_home).pid
        self.log = base / "daemon.log"
        self.instance = self.env.instance()
        # What the discovery sensor does before any copy run (kts sync does it itself, in its own time).
        self.instance.add_dynamic_partitions(topic_partitions.name, partition_keys)
        self.daemon = Daemon(self.env.environ(), self.log)
        self.daemon.wait_ready(self.instance)

    def reset(self) -> None:
        """A fresh store, tier and KTS_HOME behind the same names (the daemon's environment)."""
        self.dbs.empty_store(self.url)  # the daemon's instance lives in the same database
        shutil.rmtree(self.env.remote)
        # The daemon's sensors tick on this world meanwhile, and opening the tier creates its root.
        self.env.remote.mkdir(exist_ok=True)
        for d in self.env.kts_home.iterdir():
            if d != self.spark_home:  # the standing server stays; kts's data goes
                shutil.rmtree(d) if d.is_dir() else d.unlink()

    def run(self) -> dict:
        """One copy_job run over every partition, submitted to the queue (``dagster job launch``,
        as the UI's launch button does) and launched by the daemon: its seconds from creation to
        end, its status, and its lifecycle events' times."""
        import uuid

        run_id = str(uuid.uuid4())
        tags = {PARTITION_RANGE_START_TAG: self.partition_keys[0], PARTITION_RANGE_END_TAG: self.partition_keys[-1],
                "kts/trigger": "bench"}
        launch = subprocess.run([str(Path(sys.executable).with_name("dagster")), "job", "launch", "-w",
                                 str(REPO_ROOT / "workspace.yaml"), "-j", "copy_job", "--run-id", run_id,
                                 "--tags", json.dumps(tags)], env=self.env.environ(), cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=300, check=False)
        if launch.returncode != 0:
            raise SystemExit(f"dagster job launch exited {launch.returncode}:\n{launch.stderr[-3000:]}")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            record = self.instance.get_run_record_by_id(run_id)
            if record is not None and record.dagster_run.is_finished:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the daemon-launched run {run_id} did not finish in {RUN_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        created = record.create_timestamp.timestamp()
        # Where the launch's time goes: the run's lifecycle events, seconds after its creation.
        lifecycle: dict[str, float] = {}
        failures: list[str] = []
        for entry in self.instance.all_logs(run_id):
            kind = entry.dagster_event.event_type_value if entry.dagster_event else None
            if kind == "STEP_FAILURE":
                error = entry.dagster_event.step_failure_data.error
                cause = error.cause if error is not None and error.cause is not None else error
                said = f"{cause.cls_name}: {cause.message}" if cause is not None else entry.message or ""
                failures.append(f"{entry.step_key}: {' '.join(said.split())[:800]}")
            if kind in ("PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_START", "RESOURCE_INIT_SUCCESS",
                        "PIPELINE_SUCCESS", "PIPELINE_FAILURE") and kind not in lifecycle:
                lifecycle[kind] = round(entry.timestamp - created, 3)
        server = spark_connect.running(self.spark_home)
        if server is None or server.pid != self.server_pid:
            raise SystemExit(f"the run worker did not use KTS_HOME's standing Spark Connect server (pid {self.server_pid}): "
                             f"now {server.pid if server else 'none'} runs")
        # create_timestamp is when `dagster job launch` stored the run; end_time when its worker
        # reported it finished. Both are wall-clock seconds.
        return {"seconds": record.end_time - created, "status": record.dagster_run.status.value, "run_id": run_id,
                "failures": failures,
                "lifecycle": lifecycle, "queued_to_start_seconds": (record.start_time or record.end_time) - created}

    def close(self) -> None:
        self.daemon.stop()
        self.instance.dispose()
        self.dbs.drop(self.url)
        spark_connect.stop(self.spark_home)


def measure(args: argparse.Namespace, tmpdir: Path, dbs: Databases, spark_env: dict[str, str]) -> dict:
    root = tmpdir / "logs"
    progress(f"simulating a log dir: {args.size / MiB:.0f} MiB in {args.segment_size / MiB:.0f} MiB segments over "
             f"{args.partitions} partitions (seed {args.seed})")
    sim = simulate_log_dir(root, args.size, args.segment_size, args.partitions, args.seed, 0.0)
    eligible = eligible_segments(root)
    if not eligible:
        raise SystemExit("the simulated log dir has no eligible segment: raise --size or lower --segment-size")
    files = [p for e in eligible for p in e.files]
    total_bytes = sum(p.stat().st_size for p in files)
    partition_keys = [p.path.name for p in LogDir(root).partitions()]  # the discovery sensor's keys, in its order
    progress(f"  {len(eligible)} eligible segments in {len(partition_keys)} partitions, {total_bytes / MiB:.0f} MiB")

    rounds: dict[str, list[float]] = {"sync": [], "daemon_run": []}
    details: list[dict] = []
    verification: dict[str, dict] = {}
    counter = [0]

    progress("starting dagster-daemon on its world (untimed, as in a deployment)")
    standing = StandingDaemon(tmpdir / "daemon-world", dbs, root, partition_keys)

    def one(name: str, record: bool) -> None:
        if name == "sync":
            counter[0] += 1
            url = dbs.fresh()
            env = make_sync_env(tmpdir / f"sync-world-{counter[0]}", url, root, spark_env)
        else:
            standing.reset()
            url, env = standing.url, standing.env
        try:
            os.sync()
            warm(files)
            if name == "sync":
                progress("  kts sync …")
                result = run_sync(env)
                if result["copied_segments"] != len(eligible):
                    raise SystemExit(f"kts sync copied {result['copied_segments']} of {len(eligible)} eligible segments")
            else:
                progress("  daemon-launched copy_job …")
                result = standing.run()
                if result["status"] != "SUCCESS":
                    raise SystemExit(f"the daemon-launched run {result['run_id']} ended {result['status']}:\n"
                                     + "\n".join(result["failures"][-5:]))
            seconds = result["seconds"]
            # Every round, untimed: the store holds exactly the eligible segments, the tier their bytes.
            checked = verify(url, env.remote, root, eligible)
            if not checked["passed"]:
                raise SystemExit(f"{name} did not tier the log dir: {checked}")
            verification.setdefault(name, checked)
            progress(f"  {name}: {seconds:.2f} s")
            if record:
                rounds[name].append(seconds)
                details.append({"measurement": name, **{k: v for k, v in result.items() if k != "stdout"}})
        finally:
            if name == "sync":
                dbs.drop(url)
                shutil.rmtree(env.remote.parent, ignore_errors=True)

    names = ["sync", "daemon_run"]
    try:
        if args.warmup:
            progress("warm-up round (untimed; the correctness checks run here)")
            for name in names:
                one(name, False)
        for round_ in range(args.repeats):
            order = names[round_ % 2:] + names[: round_ % 2]
            progress(f"round {round_ + 1}/{args.repeats}: {', '.join(order)}")
            for name in order:
                one(name, True)
    finally:
        standing.close()
    best = {n: min(s) for n, s in rounds.items()}
    med = {n: median(s) for n, s in rounds.items()}
    per_round = [d / s for s, d in zip(rounds["sync"], rounds["daemon_run"])]
    return {
        "log_dir": {**sim, "eligible_segments": len(eligible), "bytes": total_bytes, "partitions": len(partition_keys)},
        "sync": {"seconds": best["sync"], "median_seconds": med["sync"], "rounds_seconds": rounds["sync"]},
        "daemon_run": {"seconds": best["daemon_run"], "median_seconds": med["daemon_run"], "rounds_seconds": rounds["daemon_run"],
                       "ratio_vs_sync": best["daemon_run"] / best["sync"], "median_ratio_vs_sync": median(per_round),
                       "goal": GOAL, "meets_goal": median(per_round) <= GOAL},
        "rounds": details,
        "verification": {**verification, "passed": all(v["passed"] for v in verification.values()) and len(verification) == 2},
    }


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kts-bench-daemon-") as tmp:
        dbs = Databases(Path(tmp))
        spark_home = Path(tmp) / "kts_home" / "spark-connect"
        try:
            progress(f"starting an embedded Spark Connect server under {spark_home.parent}")
            spark_env = {"KTS_SPARK_REMOTE": spark_connect.ensure_running(spark_home).url}
            result = measure(args, Path(tmp), dbs, spark_env)
        finally:
            dbs.close()
            if spark_connect.stop(spark_home):
                progress("stopped the embedded Spark Connect server")
    return {
        "params": {"size_bytes": args.size, "segment_size_bytes": args.segment_size, "partitions": args.partitions,
                   "repeats": args.repeats, "warmup": args.warmup, "quick": bool(args.quick), "seed": args.seed,
                   "spark": "connect (one standing server)", "database": dbs.info, **versions(), "git": git_state(),
                   "cpus": os.cpu_count(),
                   "load_average": {"before": [round(x, 2) for x in load_before],
                                    "after": [round(x, 2) for x in os.getloadavg()]}},
        **result,
        "runtime_seconds": time.perf_counter() - started,
    }


def table(result: dict) -> str:
    s, d = result["sync"], result["daemon_run"]
    rows = [("measurement", "best s", "median s", "ratio", "vs")]
    rows.append(("kts sync (subprocess)", f"{s['seconds']:.2f}", f"{s['median_seconds']:.2f}", "1.00", "(baseline)"))
    rows.append(("daemon-launched copy_job run", f"{d['seconds']:.2f}", f"{d['median_seconds']:.2f}",
                 f"{d['ratio_vs_sync']:.2f}", "kts sync, best rounds"))
    rows.append(("", "", "", f"{d['median_ratio_vs_sync']:.2f}", f"kts sync, median of per-round ratios (goal ≤ {GOAL})"))
    return "\n".join(format_rows(rows, right={1, 2, 3}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=None, help="bytes of closed segments (default 256MiB; --quick 16MiB)")
    p.add_argument("--segment-size", type=parse_size, default=None, help="segment size (default 16MiB; --quick 2MiB)")
    p.add_argument("--partitions", type=int, default=None, help="partitions (default 4; --quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3; --quick 1)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--no-warmup", dest="warmup", action="store_false", default=None,
                   help="skip the untimed warm-up round (default: one, none with --quick)")
    p.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    add_json_argument(p, "daemon_run")
    args = p.parse_args(argv)
    for name, (full, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.warmup is None:
        args.warmup = not args.quick
    if args.repeats < 1 or args.partitions < 1:
        p.error("--repeats and --partitions must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    write_json(args.json, result)
    if not result["verification"]["passed"]:
        print(f"verification FAILED: {result['verification']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
