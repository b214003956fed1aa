"""The Spark settings of every session kts builds, classic or its embedded Connect server's: its own
module so that the session (``session.py``) and the server (``connect_server.py``) share them
without importing each other."""

from __future__ import annotations

from kts_resources import settings

# What a shared-nothing local session needs: no UI port to collide on, few shuffle partitions.
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


# Adaptive execution re-plans every query at each shuffle: on one machine with kts's small jobs it
# coalesces nothing worth having and costs ~0.2 s a query (bench/read_bench.py: a third of a Spark
# job's fixed cost here). A cluster keeps Spark's default.
#
# The JVM compiles with C1 only: its C2 compiler threads, warming up on every new query of a
# server that only ever runs small ones (kts's work is in the Python workers), took ~0.6 CPU-s of
# each inventory job on this 2-CPU machine, beside a copy that needs those cores. With C1 alone a
# warm server's inventory of 1 GiB costs 0.5 CPU-s instead of 1.4 and ends in half the time, and
# its start and first job take ~25–40 % less (bench/README.md).
_LOCAL_CONF = {"spark.sql.adaptive.enabled": "false", "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}


def spark_conf(master: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """``master`` (default ``settings.spark_master()``), kts's settings for it, then ``extra``."""
    master = master or settings.spark_master()
    local = _LOCAL_CONF if master.startswith("local") else {}
    return {"spark.master": master, **_DEFAULT_CONF, **local, **(extra or {})}
