"""The Dagster UI as a person meets it: how long ``kts ui`` takes to answer its first page, and the
Materialize button on ``remote_segments`` for one partition against ``copy_job`` launched for the
same partition (goal: Materialize ≤ 2× copy_job).

    .venv/bin/python bench/ui_bench.py [--starts N] [--launches N] [--quick] [--json PATH]

One world (a fresh database on ``KTS_DATABASE_URL``'s server or an embedded one, a simulated log dir,
KTS_HOME, a directory tier, DAGSTER_HOME with the repo's dagster.yaml), its partitions registered as
the discovery sensor registers them and tiered once by ``kts sync`` (untimed; it also leaves KTS_HOME's
embedded Spark Connect server up, as a user's first sync does). Then:

- "kts ui first page": ``kts ui`` started ``--starts`` times, each timed from its launch to the first
  200 of ``/server_info`` with every code location loaded, then stopped (SIGTERM);
- "Materialize" / "copy_job": with one ``kts ui`` up, ``--launches`` rounds (order alternating) of
  two GraphQL ``launchPipelineExecution`` calls for one partition: what the asset page's Materialize
  sends (``__ASSET_JOB``, ``assetSelection`` remote_segments, ``assetCheckSelection`` the asset's
  checks in that job, tag ``dagster/partition``), and ``copy_job`` with the same tag (the job page's
  launch). Each timed from the run's creation to its end (RunRecord), queue and run worker included.

The machine may be shared: the Materialize result is the ratio of medians from interleaved rounds;
the first-page seconds are absolute (the acceptance bound is on this machine) with the load average
beside them. Prints a table, progress on stderr, JSON to bench/results/ui.json by default.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchlib import REPO_ROOT, add_json_argument, format_rows, git_state, progress, write_json
from sync_bench import MiB, Databases, make_sync_env, median, run_sync, simulate_log_dir, versions

from kts_assets.partitions import topic_partitions
from kts_resources.kafka.logdir import LogDir
from kts_resources.spark import connect_server as spark_connect

GOAL_RATIO = 2.0  # Materialize ÷ copy_job, same partition
START_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
LOCATION, REPOSITORY = "kts", "__repository__"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy

LAUNCH = """mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
ASSET_CHECKS = """query Checks($keys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $keys) { assetChecksOrError { ... on AssetChecks { checks { name jobNames } } } }
}"""
LOADED = "{ locationStatusesOrError { ... on WorkspaceLocationStatusEntries { entries { loadStatus } } } }"


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=60) as response:
        payload = json.load(response)
    if payload.get("errors"):
        raise SystemExit(f"GraphQL errors: {payload['errors']}")
    return payload["data"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ui:
    """One ``kts ui`` on a free port, timed to its first page with the location loaded."""

    def __init__(self, environ: dict[str, str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        started = time.perf_counter()
        with open(log, "ab") as out:
            self.process = subprocess.Popen([str(Path(sys.executable).with_name("kts")), "ui", "--port", str(self.port)],
                                            env=environ, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = started + START_TIMEOUT_S
        while not self._loaded():
            if self.process.poll() is not None or time.perf_counter() > deadline:
                self.stop()
                raise SystemExit(f"kts ui did not serve {self.url}:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        self.first_page_seconds = time.perf_counter() - started

    def _loaded(self) -> bool:
        try:
            entries = graphql(self.url, LOADED)["locationStatusesOrError"]["entries"]
            return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, TypeError, ValueError):
            return False

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def launch_params(url: str, job: str, partition: str, asset: str | None) -> dict:
    """What the UI sends: the job page's launch of ``job``, or with ``asset`` the asset page's
    Materialize (the asset and its checks that ``job`` holds)."""
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": job}
    if asset is not None:
        [node] = graphql(url, ASSET_CHECKS, {"keys": [{"path": [asset]}]})["assetNodes"]
        checks = [c["name"] for c in node["assetChecksOrError"]["checks"] if job in c["jobNames"]]
        selector.update(assetSelection=[{"path": [asset]}],
                        assetCheckSelection=[{"assetKey": {"path": [asset]}, "name": name} for name in checks])
    return {"mode": "default", "runConfigData": "{}", "selector": selector,
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}


def timed_run(url: str, instance, params: dict) -> dict:
    """Launch, wait for the end; seconds from the run's creation to its end, and its steps."""
    result = graphql(url, LAUNCH, {"params": params})["launchPipelineExecution"]
    if result["__typename"] != "LaunchRunSuccess":
        raise SystemExit(f"launch failed: {result}")
    run_id = result["run"]["runId"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        record = instance.get_run_record_by_id(run_id)
        if record is not None and record.dagster_run.is_finished:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} did not finish in {RUN_TIMEOUT_S} s")
        time.sleep(0.1)
    if record.dagster_run.status.value != "SUCCESS":
        raise SystemExit(f"run {run_id} ended {record.dagster_run.status.value}")
    created = record.create_timestamp.timestamp()
    logs = instance.all_logs(run_id)
    steps = sorted({e.step_key for e in logs if e.step_key})
    # Where the time before the first step goes: the queue (the daemon's dequeue), then the run
    # worker's start (a process importing Dagster and kts, loading the definitions).
    lifecycle = {}
    for entry in logs:
        kind = entry.dagster_event.event_type_value if entry.dagster_event else None
        if kind in ("PIPELINE_STARTING", "PIPELINE_START", "STEP_START") and kind not in lifecycle:
            lifecycle[kind] = round(entry.timestamp - created, 3)
    return {"seconds": record.end_time - created, "run_id": run_id, "steps": steps, "lifecycle": lifecycle,
            "worker_start_seconds": (record.start_time or record.end_time) - created}


def measure(args: argparse.Namespace, tmp: Path, dbs: Databases) -> dict:
    root = tmp / "logs"
    simulate_log_dir(root, args.size, args.segment_size, args.partitions, 11, 0.0)
    keys = [p.path.name for p in LogDir(root).partitions()]
    env = make_sync_env(tmp / "world", dbs.fresh(), root, {})
    environ = env.environ()
    instance = env.instance()
    try:
        instance.add_dynamic_partitions(topic_partitions.name, keys)
        progress("one kts sync (untimed): the world tiered, KTS_HOME's Spark Connect server up")
        run_sync(env)
        starts, loads = [], []
        for i in range(args.starts):
            ui = Ui(environ, tmp / "ui.log")
            loads.append(os.getloadavg()[0])
            starts.append(ui.first_page_seconds)
            progress(f"  kts ui first page {i + 1}/{args.starts}: {ui.first_page_seconds:.1f} s (load {loads[-1]:.1f})")
            if i < args.starts - 1:
                ui.stop()
        try:
            partition = keys[0]
            kinds = {"materialize": launch_params(ui.url, "__ASSET_JOB", partition, "remote_segments"),
                     "copy_job": launch_params(ui.url, "copy_job", partition, None)}
            rounds: dict[str, list[dict]] = {name: [] for name in kinds}
            progress("  one launch of each, untimed: the daemon's first dequeue, the page cache warm")
            for name in kinds:
                timed_run(ui.url, instance, kinds[name])
            for i in range(args.launches):
                order = list(kinds) if i % 2 == 0 else list(reversed(kinds))
                for name in order:
                    rounds[name].append(timed_run(ui.url, instance, kinds[name]))
                    progress(f"  {name} {i + 1}/{args.launches}: {rounds[name][-1]['seconds']:.2f} s")
        finally:
            ui.stop()
    finally:
        instance.dispose()
        spark_connect.stop(env.kts_home / "spark-connect")
    med = {name: median([r["seconds"] for r in runs]) for name, runs in rounds.items()}
    return {
        "ui_first_page": {"seconds": starts, "median_seconds": median(starts), "load_average_1m": loads, "goal_seconds": 15},
        "launches": {name: {"median_seconds": med[name], "rounds": runs,
                            "median_worker_start_seconds": median([r["worker_start_seconds"] for r in runs])}
                     for name, runs in rounds.items()},
        "materialize_check_selection": [c["name"] for c in kinds["materialize"]["selector"]["assetCheckSelection"]],
        "ratio": med["materialize"] / med["copy_job"], "goal_ratio": GOAL_RATIO,
        "meets_goal": med["materialize"] <= GOAL_RATIO * med["copy_job"],
    }


def table(result: dict) -> str:
    ui, launches = result["ui_first_page"], result["launches"]
    rows = [("measurement", "median s", "rounds s", "note")]
    rows.append(("kts ui first page", f"{ui['median_seconds']:.1f}", " ".join(f"{s:.1f}" for s in ui["seconds"]),
                 f"goal ≤ {ui['goal_seconds']} s; load {' '.join(f'{x:.1f}' for x in ui['load_average_1m'])}"))
    for name in ("materialize", "copy_job"):
        runs = launches[name]
        rows.append((name, f"{runs['median_seconds']:.2f}", " ".join(f"{r['seconds']:.2f}" for r in runs["rounds"]),
                     f"run worker start {runs['median_worker_start_seconds']:.2f} s; steps {', '.join(runs['rounds'][0]['steps'])}"))
    rows.append(("materialize ÷ copy_job", f"{result['ratio']:.2f}", "", f"goal ≤ {result['goal_ratio']}"))
    return "\n".join(format_rows(rows, right={1}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=None, help="kts ui starts timed (default 3; --quick 1)")
    p.add_argument("--launches", type=int, default=None, help="rounds of Materialize and copy_job (default 4; --quick 1)")
    p.add_argument("--quick", action="store_true", help="one start, one round: a smoke run")
    add_json_argument(p, "ui")
    args = p.parse_args(argv)
    args.starts = args.starts or (1 if args.quick else 3)
    args.launches = args.launches or (1 if args.quick else 4)
    args.size, args.segment_size, args.partitions = 8 * MiB, 1 * MiB, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kts-bench-ui-") as tmp:
        dbs = Databases(Path(tmp))
        try:
            result = measure(args, Path(tmp), dbs)
        finally:
            dbs.close()
    result = {"params": {"starts": args.starts, "launches": args.launches, "quick": args.quick, "database": dbs.info,
                         **versions(), "git": git_state(), "cpus": os.cpu_count(),
                         "load_average": {"before": [round(x, 2) for x in load_before],
                                          "after": [round(x, 2) for x in os.getloadavg()]}},
              **result}
    print(table(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
