"""Spark for the tests: Spark Connect by default, as kts runs.

Test modules that run Spark carry ``pytestmark = pytest.mark.spark``. When any collected test
does, the session starts one embedded Spark Connect server (kts's own, under a temporary
KTS_HOME) and points ``KTS_SPARK_REMOTE`` at it, so every Spark test and every ``kts sync``
subprocess attaches to that server instead of starting a JVM (or a server) of its own; the
session stops it at the end. A ``KTS_SPARK_REMOTE`` or ``KTS_SPARK_MASTER`` already set wins.

Fixtures:
- ``spark_connect_url``: the session's Spark Connect endpoint (sc://127.0.0.1:port), or None when
  the environment chose another engine.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

__all__ = ["spark_connect_url"]


@pytest.fixture(scope="session", autouse=True)
def spark_connect_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    wanted = any(item.get_closest_marker("spark") for item in request.session.items)
    chosen = os.environ.get("KTS_SPARK_REMOTE", "").strip() or os.environ.get("KTS_SPARK_MASTER", "").strip()
    if not wanted or chosen:
        yield os.environ.get("KTS_SPARK_REMOTE", "").strip() or None
        return
    from kts_resources.spark import connect_server as spark_connect

    home = tmp_path_factory.mktemp("kts_home_spark") / "spark-connect"
    server = spark_connect.ensure_running(home, master="local[2]")
    os.environ["KTS_SPARK_REMOTE"] = server.url
    try:
        yield server.url
    finally:
        os.environ.pop("KTS_SPARK_REMOTE", None)
        from kts_resources.spark.session import forget_connect_sessions

        forget_connect_sessions()
        spark_connect.stop(home)
