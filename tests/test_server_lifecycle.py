"""The one lifecycle every server kts leaves running shares (kts_resources/servers/lifecycle.py):
the state file, the start lock, telling the recorded process from a stranger, and stopping it."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kts_resources.servers import lifecycle
from kts_resources.servers.local_processes import alive

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"


@pytest.fixture
def process():
    started = []

    def start(code: str = "import time; print('ready', flush=True); time.sleep(120)", *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, start_new_session=True)
        assert proc.stdout.readline() == b"ready\n"  # its signal handlers are in place
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_recorded_server_is_read_back_and_a_missing_or_unreadable_record_is_none(tmp_path):
    build = lambda raw: (int(raw["pid"]), raw["port"])  # noqa: E731
    assert lifecycle.read_state(tmp_path, build) is None
    lifecycle.write_state(tmp_path, {"pid": 123, "port": 5432})
    assert lifecycle.read_state(tmp_path, build) == (123, 5432)
    (tmp_path / lifecycle.STATE_FILE).write_text('{"pid": 12')  # half a file
    assert lifecycle.read_state(tmp_path, build) is None
    (tmp_path / lifecycle.STATE_FILE).write_text('{"port": 1}')
    assert lifecycle.read_state(tmp_path, build) is None
    lifecycle.clear_state(tmp_path)
    assert lifecycle.read_state(tmp_path, build) is None and list(tmp_path.iterdir()) == []


def test_the_recorded_process_is_told_by_its_arguments_not_its_pid_alone(process):
    proc = process("import time; print('ready', flush=True); time.sleep(120)", "serve", "/some/kts-home")
    assert lifecycle.runs(proc.pid, "serve", "/some/kts-home")
    assert not lifecycle.runs(proc.pid, "serve", "/another/kts-home")  # a reused pid is someone else
    assert not lifecycle.runs(proc.pid, "/some")  # whole arguments, not parts of one
    proc.kill()
    proc.wait()
    assert not lifecycle.runs(proc.pid, "serve", "/some/kts-home")


def test_concurrent_first_starts_share_one_server(tmp_path):
    home = tmp_path / "server"
    starts = []

    def running():
        return lifecycle.read_state(home, lambda raw: raw["server"])

    def start():
        starts.append(1)
        time.sleep(0.2)  # the others wait for the lock meanwhile
        lifecycle.write_state(home, {"server": "the one"})
        return "the one"

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: lifecycle.ensure_started(home, running, start), range(4)))
    assert results == ["the one"] * 4 and len(starts) == 1
    assert (home.stat().st_mode & 0o777) == 0o700


def test_a_stop_sends_sigterm_and_a_server_that_ignores_it_is_killed_after_the_grace(process):
    polite = process()
    began = time.monotonic()
    lifecycle.end_process(polite.pid, grace_s=30)
    assert polite.wait(5) == -15 and time.monotonic() - began < 5

    stubborn = process(IGNORES_SIGTERM)
    began = time.monotonic()
    lifecycle.end_process(stubborn.pid, grace_s=0.5)
    assert stubborn.wait(5) == -9 and time.monotonic() - began >= 0.5


def test_a_stop_leaves_a_process_that_is_not_the_one_recorded_alone(process):
    proc = process()
    lifecycle.end_process(proc.pid, started=1, grace_s=0.1)  # started at another time: a reused pid
    assert alive(proc.pid) and proc.poll() is None
