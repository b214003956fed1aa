"""Fixtures shared by the test modules: where the project's shared files (../shared) live."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path

import pytest

# Real servers the tests share: PostgreSQL (pg_url, metadata_store, pg_admin_url, …) and an S3 HTTP
# endpoint (s3_endpoint, s3_bucket, remote_storage, …), and a Spark Connect server (spark_connect_url).
pytest_plugins = ["tests.fixtures_postgres", "tests.fixtures_s3", "tests.fixtures_spark"]

REPO_ROOT = Path(__file__).resolve().parent.parent

# Commands run in their own process, as each test's subprocess always did: a standing CLI server
# per test's KTS_HOME would outlive the test. tests/test_cli_server.py turns it on where it tests it,
# and tests/test_sync_independent.py runs on kts's defaults (so in the server), stopping it after.
os.environ["KTS_CLI_SERVER"] = "off"


class SignalStateLeak(UserWarning):
    """A test left the worker's main thread with SIGINT/SIGTERM blocked or ignored."""


_TERMINATING = (signal.SIGINT, signal.SIGTERM)

# A worker started in the background by a non-interactive shell has SIGINT ignored, and Dagster's
# in-process execution maps SIGTERM to SIGINT's handler (for k8s) without mapping it back: SIGTERM
# was then ignored by every process the worker started later, which an ignored disposition keeps
# through exec. Dagster's `tail -F` log mirrors outlived a sync's `terminate()` and held its stdout
# open, hanging its test, and a server a test stopped ignored the SIGTERM (one CI run). SIGINT as
# Python sets it for a program is what pytest expects anyway.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signals_as_found(request):
    """Each test starts with the worker's signal mask and SIGINT/SIGTERM handlers as the one before
    found them (in-process Dagster runs leave theirs), and a test that left one blocked or ignored —
    which every process a later test starts would inherit — is named."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handlers = {signum: signal.getsignal(signum) for signum in _TERMINATING}
    yield
    inherited = []
    now = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if now != mask:
        inherited.append(f"blocked signals {sorted(now)}")
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for signum, handler in handlers.items():
        current = signal.getsignal(signum)
        if current is not handler:
            if current is signal.SIG_IGN:
                inherited.append(f"{signal.Signals(signum).name} ignored")
            signal.signal(signum, handler)
    if inherited:
        warnings.warn(SignalStateLeak(f"{request.node.nodeid} left {', '.join(inherited)}; restored"), stacklevel=1)


def shared_dir() -> Path:
    """``$KTS_SHARED_DIR`` if set, else ``shared/`` beside the repository (how CI clones them)."""
    configured = os.environ.get("KTS_SHARED_DIR")
    return Path(configured).resolve() if configured else REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def third_party_dir() -> Path:
    """The Kafka-format segment files other implementations wrote (fixtures/third_party)."""
    path = shared_dir() / "fixtures" / "third_party"
    if not path.is_dir():
        # Failing, not skipping: these files are part of what kts must read.
        pytest.fail(f"third-party fixtures not found at {path}; set KTS_SHARED_DIR to the shared/ directory")
    return path


# Test files that take minutes (Dagster runs in subprocesses, JVMs, daemons, SIGKILLs), longest
# first, from CI's --durations. They are collected first so that `make test`'s workers (pytest-xdist,
# --dist loadfile --no-loadscope-reorder) start them first and the run ends on short files; xdist's
# default order (files with the most tests first) left these to the end, one worker busy for minutes
# on them while the other idled.
LONG_FILES = (
    "test_sync_independent.py", "test_fault_harness.py", "test_run_hygiene.py", "test_cli_server.py", "test_recover.py", "test_cli_sync.py", "test_lost_ranges.py",
    "test_bench_daemon_run_smoke.py", "test_recover_sync.py", "test_sync_outcome.py", "test_spark_connect.py",
    "test_bench_sync_smoke.py", "test_spark_cluster.py", "test_webserver.py", "test_spark_inventory.py", "test_assets.py", "test_scrub.py",
    "test_restore.py", "test_hostile_partitions.py", "test_pipeline_end_to_end.py", "test_retention_asset.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def materializations(result, asset: str) -> list:
    """The run's materialisations of ``asset`` (``asset_materializations_for_node`` goes by step,
    and one step, local_and_remote_segments, materialises two assets)."""
    import dagster as dg

    key = dg.AssetKey(asset)
    return [e.step_materialization_data.materialization for e in result.all_node_events
            if e.is_step_materialization and e.asset_key == key]


# -- leftovers: a run ends with nothing of it left running (issue 34) ------------------------------
# What this run starts is told from what other runs on this machine start (another `.ci/run`,
# another checkout's tests) by two marks, never by looking at the machine as a whole: every KTS_HOME
# of this run lies under its base temp directory (workers' included), and every process it starts
# carries RUN_MARKER in its environment. At the end, in the controller once xdist's workers are
# gone, a kts server or cluster (/var/lib/kts/postgres) whose KTS_HOME lies under the base temp
# directory, or any process with this run's mark, fails the run: each is named, then stopped, so
# the machine is left as the run found it.
RUN_MARKER = "KTS_TEST_RUN"
# A watchdog (kts_resources/servers/home_watch.py) leaves within a second of its server's end.
os.environ.setdefault("KTS_IDLE_CHECK_S", "1")
# A step that failed for every partition (a store or bucket the test stopped) runs again after
# 0.5 s and 1 s, not 5 s and 10 s: the same retries, without a minute of sleep per such sync.
os.environ.setdefault("KTS_STEP_RETRY_DELAY_S", "0.5")
# Hang-only: how long the last fixtures' servers and watchdogs get to exit before they count.
LEFTOVER_GRACE_S = 120


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): workers inherit it
        os.environ[RUN_MARKER] = f"{os.getpid()}-{os.urandom(8).hex()}"


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session):
    yield  # after every fixture's teardown, and xdist's workers' end
    if hasattr(session.config, "workerinput") or RUN_MARKER not in os.environ:
        return
    basetemp = session.config._tmp_path_factory.getbasetemp()
    _end_classic_spark_gateway()
    _end_resource_tracker()
    servers, processes = _leftovers(basetemp, os.environ[RUN_MARKER])
    if not servers and not processes:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{s.kind} {s.state}{f' (pid {s.pid})' if s.pid else ''} of KTS_HOME {s.kts_home}"
             f"{' (gone)' if s.orphan else ''}: {s.data_dir}" for s in servers]
    lines += [f"process {pid} started by this run: {' '.join(argv)[:300]}" for pid, argv in processes]
    say = reporter.write_line if reporter is not None else print
    if reporter is not None:
        reporter.write_sep("=", "this run left servers, clusters or processes behind (now stopped)", red=True)
    for line in lines:
        say(line)
    _clear(servers, processes)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _end_classic_spark_gateway() -> None:
    """A classic SparkSession's JVM (pyspark's py4j gateway, started by a run without xdist
    workers) outlives ``spark.stop()`` until this process ends, when its stdin pipe closes. The
    run ends it here, as the process's end would, so it does not count as left behind."""
    import sys

    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()  # PythonGatewayServer exits on end of input
        proc.wait(timeout=LEFTOVER_GRACE_S)


def _end_resource_tracker() -> None:
    """multiprocessing's resource tracker, started by a test's spawn-context child in a run without
    xdist workers, lives until this process ends (it carries the run's mark). The run ends it here,
    as the process's end would, so it does not count as left behind."""
    import sys

    if "multiprocessing.resource_tracker" not in sys.modules:
        return
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()  # a no-op when it never started


def _leftovers(basetemp: Path, marker: str) -> tuple[list, list[tuple[int, list[str]]]]:
    """This run's kts servers and clusters, and its marked processes, still there after the grace."""
    import time

    from kts_resources.servers.services import machine_servers

    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while True:
        servers = machine_servers(basetemp, watchdogs=True)
        listed = {s.pid for s in servers}
        processes = [(pid, argv) for pid, argv in _marked_processes(marker) if pid not in listed]
        if (not servers and not processes) or time.monotonic() > deadline:
            return servers, processes
        time.sleep(0.5)


def _marked_processes(marker: str) -> list[tuple[int, list[str]]]:
    """Live processes (this one aside) whose environment has ``RUN_MARKER=marker``."""
    from kts_resources.servers.local_processes import alive, command_line, pids

    mark = f"{RUN_MARKER}={marker}".encode()
    found = []
    for pid in pids():
        if pid == os.getpid():
            continue
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environment and alive(pid):
            found.append((pid, command_line(pid)))
    return found


def _clear(servers: list, processes: list[tuple[int, list[str]]]) -> None:
    import signal

    from kts_resources.servers.services import stop_machine_servers

    from kts_resources.metadata import embedded

    from kts_resources.servers.local_processes import same_process

    stop_machine_servers(servers)
    for server in servers:
        if server.kind == "watchdog" and same_process(server.pid, server.started):
            os.kill(server.pid, signal.SIGKILL)
        elif server.kind == "postgres" and server.data_dir is not None:
            embedded.remove_cluster(server.data_dir.parent)  # its KTS_HOME is this run's: nobody's to keep
    for pid, _argv in processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended meanwhile
