"""Spark: the session (local, embedded Spark Connect, or a remote Connect endpoint), the embedded
Connect server, and the jobs that run on executors — the segment inventory, the remote log index
build, retention planning and ``read_tiered`` for backfills. Importing this package imports no
PySpark; its modules do."""
