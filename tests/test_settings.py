"""One road for each setting: every KTS_* variable is read in kts_resources/settings.py, when asked
(not at import), and the Dagster resources and the CLI get the same values from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kts_resources import settings
from kts_resources.metadata import database
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kts_assets", "kts_resources")
SETTINGS = REPO_ROOT / "kts_resources" / "settings.py"
ENV_READERS = {"getenv", "get", "EnvVar", "pop", "setdefault"}


def _is_kts_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("KTS_") \
        and node.value.replace("_", "").isalnum() and node.value.isupper()


def _mentions_environ(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and (getattr(n, "id", None) == "environ" or getattr(n, "attr", None) == "environ")
               for n in ast.walk(node))


def kts_variable_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place the code names a KTS_* variable: a string literal that is exactly
    such a name (docstrings and messages that mention one inside a sentence are fine), and any
    environment read (os.environ[...], os.environ.get, os.getenv, dg.EnvVar) whose key is not a
    plain literal of another variable (a key held in a constant could hide a KTS_ name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _is_kts_name(node):
            found.append((node.lineno, f"names {node.value}"))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            is_env_call = name in ("getenv", "EnvVar") or (name in ENV_READERS and isinstance(func, ast.Attribute) and _mentions_environ(func.value))
            key = node.args[0]
            if is_env_call and not (isinstance(key, ast.Constant) and isinstance(key.value, str) and not key.value.startswith("KTS_")):
                found.append((node.lineno, f"reads the environment with key {ast.unparse(key)}"))
        elif isinstance(node, ast.Subscript) and _mentions_environ(node.value):
            key = node.slice
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and not key.value.startswith("KTS_")):
                found.append((node.lineno, f"reads the environment with key {ast.unparse(key)}"))
    return found


def test_the_detector_finds_every_way_of_reading_a_kts_variable():
    """The package check below can fail: each of these spellings is caught, and prose is not."""
    for line in ('os.environ.get("KTS_HOME")', 'os.getenv("KTS_REMOTE_URI", "")', 'os.environ["KTS_LOG_DIRS"]',
                 'dg.EnvVar("KTS_DATABASE_URL")', 'NAME = "KTS_SPARK_MASTER"', "os.environ.get(settings.LOG_LEVEL)",
                 "environ.get(name)"):
        assert kts_variable_reads(line), line
    assert kts_variable_reads('"""Reads ``KTS_HOME``."""\nos.environ.get("DAGSTER_HOME")\nraise E("set KTS_LOG_DIRS")') == []


def test_no_module_but_settings_reads_a_kts_variable():
    modules = [p for package in PACKAGES for p in sorted((REPO_ROOT / package).rglob("*.py")) if p != SETTINGS]
    assert len(modules) > 20  # the walk found the packages
    offences = [f"{p.relative_to(REPO_ROOT)}:{line}: {what}" for p in modules for line, what in kts_variable_reads(p.read_text())]
    assert offences == [], "read KTS_* variables through kts_resources.settings:\n" + "\n".join(offences)


def test_settings_read_the_environment_when_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "home"))
    for name in ("KTS_LOG_DIRS", "KTS_OWNED_LOG_DIRS", "KTS_REMOTE_URI", "KTS_S3_ENDPOINT_URL", "KTS_DATABASE_URL",
                 "KTS_SPARK_MASTER", "KTS_SPARK_REMOTE", "KTS_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    assert settings.log_dirs() == [tmp_path / "home" / "logs"]
    assert settings.owned_log_dirs() == []
    assert settings.remote_uri() == (tmp_path / "home" / "remote").as_uri()
    assert (settings.s3_endpoint_url(), settings.database_url(), settings.spark_remote()) == (None, None, None)
    assert settings.spark_master() == "local[*]"
    assert settings.log_level("warning") == "WARNING"

    monkeypatch.setenv("KTS_LOG_DIRS", f" {tmp_path / 'a'} ,, {tmp_path / 'b'} ")
    monkeypatch.setenv("KTS_OWNED_LOG_DIRS", str(tmp_path / "b"))
    monkeypatch.setenv("KTS_REMOTE_URI", "s3://bucket/tiered")
    monkeypatch.setenv("KTS_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("KTS_DATABASE_URL", "  postgresql://db.example/meta ")
    monkeypatch.setenv("KTS_SPARK_MASTER", "spark://cluster:7077")
    monkeypatch.setenv("KTS_SPARK_REMOTE", "sc://connect:15002")
    monkeypatch.setenv("KTS_LOG_LEVEL", "debug")
    assert settings.log_dirs() == [tmp_path / "a", tmp_path / "b"]
    assert settings.owned_log_dirs() == [tmp_path / "b"]
    assert settings.remote_uri() == "s3://bucket/tiered"
    assert settings.s3_endpoint_url() == "http://127.0.0.1:9000"
    assert settings.database_url() == "postgresql://db.example/meta"
    assert settings.spark_master() == "spark://cluster:7077"
    assert settings.spark_remote() == "sc://connect:15002"
    assert settings.log_level("WARNING") == "DEBUG"


@pytest.mark.parametrize("remote", ["file", "s3"])
def test_unconfigured_resources_take_the_values_the_cli_takes(monkeypatch, tmp_path, remote):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KTS_LOG_DIRS", f"{tmp_path / 'a'},{tmp_path / 'b'}")
    monkeypatch.setenv("KTS_OWNED_LOG_DIRS", str(tmp_path / "b"))
    monkeypatch.setenv("KTS_DATABASE_URL", "postgres://kts@db.example:6543/meta")
    if remote == "s3":
        monkeypatch.setenv("KTS_REMOTE_URI", "s3://bucket/tiered")
        monkeypatch.setenv("KTS_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    else:
        monkeypatch.delenv("KTS_REMOTE_URI", raising=False)
        monkeypatch.delenv("KTS_S3_ENDPOINT_URL", raising=False)

    log_dirs = KafkaLogDirsResource()
    assert log_dirs.paths() == settings.log_dirs()
    assert log_dirs.owned_paths() == {p.resolve() for p in settings.owned_log_dirs()}
    assert MetadataStoreResource().url() == database.database_url() == "postgresql+psycopg2://kts@db.example:6543/meta"
    tier = RemoteTierResource()
    assert tier.uri() == settings.remote_uri()
    assert tier.endpoint_url() == settings.s3_endpoint_url()


def test_the_definitions_leave_every_setting_to_settings_py():
    """Empty fields: the resources ask settings.py when used, so nothing is frozen at import."""
    from kts_assets.definitions import default_resources

    resources = default_resources()
    assert resources["kafka_log_dirs"].log_dirs == resources["kafka_log_dirs"].owned_log_dirs == ""
    assert resources["metadata_store"].database_url == ""
    assert resources["remote_tier"].remote_uri == resources["remote_tier"].s3_endpoint_url == ""


def test_the_steps_retry_delay_is_five_seconds_unless_set_to_a_number_of_seconds(monkeypatch):
    monkeypatch.delenv("KTS_STEP_RETRY_DELAY_S", raising=False)
    assert settings.step_retry_delay_s() == 5.0
    for value, expected in (("0.5", 0.5), ("0", 0.0), ("30", 30.0), ("-1", 5.0), ("soon", 5.0), ("inf", 5.0)):
        monkeypatch.setenv("KTS_STEP_RETRY_DELAY_S", value)
        assert settings.step_retry_delay_s() == expected, value
