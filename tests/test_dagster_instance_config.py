"""One Dagster instance config (kts_assets/dagster.yaml, package data): the repo root's dagster.yaml
is that file, and an installed kts, which has no source checkout, runs its instance with it too —
pools, run monitoring, run retries and the instance in kts's PostgreSQL — not with a smaller
config of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGED = REPO_ROOT / "kts_assets" / "dagster.yaml"


def test_the_repo_roots_dagster_yaml_is_the_packaged_one():
    assert (REPO_ROOT / "dagster.yaml").is_file()  # `dagster dev` and DAGSTER_HOME=<repo> find it at the top
    assert (REPO_ROOT / "dagster.yaml").resolve() == PACKAGED.resolve()


def test_an_installed_kts_copies_the_packaged_config_into_its_dagster_home(tmp_path):
    # What a wheel holds: the packages as setuptools builds them from pyproject (package data included).
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "egg_info", "--egg-base", str(tmp_path),
                    "build_py", "--build-lib", str(site)], cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), KTS_HOME=str(tmp_path / "home"))
    shown = subprocess.run([sys.executable, "-c",
                            "import kts_assets.instance as i; print(i.__file__); print(i.dagster_home())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    module, home = shown.stdout.split()
    assert Path(module).is_relative_to(site)  # the installed copy, not the source checkout
    assert Path(home) == tmp_path / "home" / "dagster"
    written = (Path(home) / "dagster.yaml").read_text()
    assert written == PACKAGED.read_text()
    config = yaml.safe_load(written)
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["enabled"]
    assert config["concurrency"]["pools"]["default_limit"] == 1
    assert config["storage"]["custom"]["class"] == "KtsDagsterStorage"


def test_every_process_of_the_instance_stores_a_steps_materialisations_in_batches(monkeypatch, tmp_path):
    # A run over 200 partitions stores 200 materialisations per asset: as one batch each, not one
    # transaction apiece (issue 33). `kts ui`'s webserver, daemon and run workers get it from the
    # environment kts gives them; an operator's own setting stands.
    from kts_assets.cli.dagster_ui import _environment
    from kts_assets.instance import EVENT_BATCH_SIZE

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "")  # recorded, so the test leaves the environment as it was
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE")
    assert _environment()["DAGSTER_EVENT_BATCH_SIZE"] == str(EVENT_BATCH_SIZE) == os.environ["DAGSTER_EVENT_BATCH_SIZE"]
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "0")
    assert _environment()["DAGSTER_EVENT_BATCH_SIZE"] == "0"
