"""kts assets: the Dagster pipeline (partitions, assets, checks, sensors, schedules, the one
``Definitions``) and the ``kts`` command line."""
