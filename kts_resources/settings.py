"""kts's environment contract (ARCHITECTURE.md): every ``KTS_*`` variable is read here, and only here.

Each accessor reads the environment when called (not at import), so a test or a CLI command that
sets a variable sees it at once. The CLI, the Dagster resources and ``dagster dev`` all ask these
functions, so they agree on every value. A test (tests/test_settings.py) fails if any other module
of kts_assets/ or kts_resources/ reads a ``KTS_*`` variable.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME = "KTS_HOME"
LOG_DIRS = "KTS_LOG_DIRS"
OWNED_LOG_DIRS = "KTS_OWNED_LOG_DIRS"
METADATA_LOG_DIR = "KTS_METADATA_LOG_DIR"
REMOTE_URI = "KTS_REMOTE_URI"
S3_ENDPOINT_URL = "KTS_S3_ENDPOINT_URL"
DATABASE_URL = "KTS_DATABASE_URL"
SPARK_MASTER = "KTS_SPARK_MASTER"
SPARK_REMOTE = "KTS_SPARK_REMOTE"
LOG_LEVEL = "KTS_LOG_LEVEL"
CLI_SERVER = "KTS_CLI_SERVER"
DAGSTER_PER_BROKER = "KTS_DAGSTER_PER_BROKER"
IDLE_CHECK = "KTS_IDLE_CHECK_S"
STEP_RETRY_DELAY = "KTS_STEP_RETRY_DELAY_S"

DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_IDLE_CHECK_S = 10.0
DEFAULT_STEP_RETRY_DELAY_S = 5.0


def _get(name: str) -> str | None:
    """The variable's value with surrounding blanks removed; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def _paths(raw: str | None) -> list[Path]:
    return [Path(p.strip()).expanduser() for p in (raw or "").split(",") if p.strip()]


def kts_home() -> Path:
    """``KTS_HOME``, default ``~/.kts``: embedded Postgres, the local remote tier, caches."""
    return Path(_get(HOME) or Path.home() / ".kts").expanduser()


def log_dirs() -> list[Path]:
    """``KTS_LOG_DIRS`` (comma-separated broker log dirs), default ``KTS_HOME/logs``."""
    return _paths(_get(LOG_DIRS)) or [kts_home() / "logs"]


def owned_log_dirs() -> list[Path]:
    """``KTS_OWNED_LOG_DIRS`` (comma-separated): the log dirs kts may edit; default none."""
    return _paths(_get(OWNED_LOG_DIRS))


def metadata_log_dir() -> Path | None:
    """``KTS_METADATA_LOG_DIR``: the broker's ``metadata.log.dir`` (the directory holding KRaft's
    ``__cluster_metadata-0``; the partition directory itself is accepted too). None means: look
    for ``__cluster_metadata-0`` in each of ``KTS_LOG_DIRS``, as Kafka defaults metadata.log.dir
    to the first of its log.dirs."""
    raw = _get(METADATA_LOG_DIR)
    return Path(raw).expanduser() if raw else None


def remote_uri() -> str:
    """``KTS_REMOTE_URI`` (``file:///path`` or ``s3://bucket/prefix``), default the directory
    ``KTS_HOME/remote``."""
    return _get(REMOTE_URI) or (kts_home() / "remote").absolute().as_uri()


def s3_endpoint_url() -> str | None:
    """``KTS_S3_ENDPOINT_URL``: an S3-compatible store's endpoint; None means AWS."""
    return _get(S3_ENDPOINT_URL)


def database_url() -> str | None:
    """``KTS_DATABASE_URL`` as configured (any PostgreSQL URL); None means the embedded server
    (``metadata.database.database_url`` starts it and normalises either)."""
    return _get(DATABASE_URL)


def spark_master() -> str:
    """``KTS_SPARK_MASTER``, default ``local[*]``: the classic session's master when set, else the
    embedded Spark Connect server's."""
    return _get(SPARK_MASTER) or DEFAULT_SPARK_MASTER


def spark_classic_master() -> str | None:
    """``KTS_SPARK_MASTER`` as configured: set, kts runs a classic in-process session on it; None
    means Spark Connect (``KTS_SPARK_REMOTE``, else the embedded server)."""
    return _get(SPARK_MASTER)


def spark_remote() -> str | None:
    """``KTS_SPARK_REMOTE`` (``sc://host:port``): an existing Spark Connect endpoint to attach to;
    None (and no ``KTS_SPARK_MASTER``) means the embedded server under ``KTS_HOME``."""
    return _get(SPARK_REMOTE)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(default: str) -> str:
    """``KTS_LOG_LEVEL`` (a ``logging`` level name, any case), else ``default``; upper-cased.
    The CLI's default is ERROR for library logging, and CRITICAL in ``kts sync`` for both library
    logging and the run's Dagster console (the sync prints each failed partition once instead).
    Any other value is an error (ValueError naming the variable and the accepted names)."""
    configured = _get(LOG_LEVEL)
    level = (configured or default).upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"{LOG_LEVEL}={configured!r}: not a log level; use one of {', '.join(LOG_LEVELS)}")
    return level


def _on_or_off(name: str, default: str) -> bool:
    """A switch: on/1/true/yes or off/0/false/no (any case), ``default`` when unset; else ValueError."""
    value = (_get(name) or default).lower()
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"{name}={_get(name)!r}: must be on or off")


def cli_server_enabled() -> bool:
    """``KTS_CLI_SERVER``: ``on`` (the default) runs ``kts sync`` in the standing CLI server of
    ``KTS_HOME`` (``kts_assets.cli.server``), started by the first sync that needs it; ``off`` runs
    it in its own process. Any other value is an error (ValueError naming it)."""
    return _on_or_off(CLI_SERVER, "on")


def dagster_per_broker() -> bool:
    """``KTS_DAGSTER_PER_BROKER``: ``on`` names this kts's Dagster code location, asset keys,
    partitions and pool after its broker's id (``kts_assets/broker_scope.py``), for brokers whose kts
    share one Dagster instance; ``off`` (the default) keeps the plain names. Any other value is an
    error (ValueError naming it)."""
    return _on_or_off(DAGSTER_PER_BROKER, "off")


def dagster_scope_inputs() -> tuple[str, ...]:
    """What the names of a process's Dagster objects depend on, never an error: ``("off",)``, or
    ``KTS_DAGSTER_PER_BROKER`` as configured and where the broker's id is read from. The CLI server
    compares them to tell a client whose Definitions would differ from those it imported."""
    try:
        if not dagster_per_broker():
            return ("off",)
    except ValueError:
        pass  # malformed: compared as configured (the command itself says what is wrong)
    return tuple(_get(name) or "" for name in (DAGSTER_PER_BROKER, LOG_DIRS, METADATA_LOG_DIR))


def idle_check_s() -> float:
    """``KTS_IDLE_CHECK_S``: how often (seconds, default 10) the watchdog beside an embedded server
    checks that the server's ``KTS_HOME`` is still there (``home_watch.py``). A value that is not a
    positive number means the default: the watchdog runs detached, with nobody to tell."""
    try:
        value = float(_get(IDLE_CHECK) or DEFAULT_IDLE_CHECK_S)
    except ValueError:
        return DEFAULT_IDLE_CHECK_S
    return value if 0 < value < float("inf") else DEFAULT_IDLE_CHECK_S


def step_retry_delay_s() -> float:
    """``KTS_STEP_RETRY_DELAY_S``: seconds (default 5) before a pipeline step that failed for every
    partition (the store or the bucket briefly away) runs again; the second retry waits twice as
    long. Read when the definitions load. A value that is not a number ≥ 0 means the default, as
    the UI's code location must load whatever the environment says."""
    try:
        value = float(_get(STEP_RETRY_DELAY) or DEFAULT_STEP_RETRY_DELAY_S)
    except ValueError:
        return DEFAULT_STEP_RETRY_DELAY_S
    return value if 0 <= value < float("inf") else DEFAULT_STEP_RETRY_DELAY_S


def resolved_environment() -> dict[str, str]:
    """This process's environment with ``KTS_HOME`` and ``KTS_LOG_DIRS`` as kts resolves them
    (absolute, defaults filled in): for a child process (``kts ui``'s ``dagster dev``) that must see
    exactly the world this CLI sees, whatever its working directory."""
    return {**os.environ, HOME: str(kts_home().absolute()), LOG_DIRS: ",".join(str(p.absolute()) for p in log_dirs())}
