"""The Dagster instance every kts process shares (``kts sync``, ``kts ui``, the commands that report
to the UI): its home and its one config, ``kts_assets/dagster.yaml``, package data so that an
installed kts runs with the same pools, run monitoring, retries and storage as a source checkout
(whose top-level ``dagster.yaml`` links to it)."""

from __future__ import annotations

import os
from pathlib import Path

# A source checkout's root: its dagster.yaml and workspace.yaml (an installed kts has neither).
REPO_ROOT = Path(__file__).resolve().parent.parent
INSTANCE_CONFIG = "dagster.yaml"
EVENT_BATCH_SIZE = 1000


def instance_config() -> str:
    """The text of the instance config kts ships."""
    from importlib.resources import files

    return files(__package__).joinpath(INSTANCE_CONFIG).read_text()


def dagster_home() -> Path:
    """The instance's home `kts sync` and `kts ui` share: DAGSTER_HOME, else the repo root holding
    dagster.yaml (a source checkout), else KTS_HOME/dagster with a copy of the packaged config
    (set into DAGSTER_HOME for Dagster)."""
    from kts_resources import settings

    # A run's planned materialisations and its step's materialisations (one per partition, 200 a
    # run) go to the event log as one batch each rather than one transaction apiece (Dagster reads
    # this variable at every event; 0, its default, turns batching off).
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", str(EVENT_BATCH_SIZE))
    if not os.environ.get("DAGSTER_HOME"):
        home = REPO_ROOT if (REPO_ROOT / INSTANCE_CONFIG).is_file() else settings.kts_home() / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        if not (home / INSTANCE_CONFIG).exists():
            (home / INSTANCE_CONFIG).write_text(instance_config())
        os.environ["DAGSTER_HOME"] = str(home)
    return Path(os.environ["DAGSTER_HOME"])


def dagster_instance():
    """The instance `kts ui` shows: every CLI run shows in the UI."""
    import dagster as dg

    dagster_home()
    return dg.DagsterInstance.get()
