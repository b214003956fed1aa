"""kts assets: the Dagster pipeline (partitions, assets, checks, sensors, schedules, the one
``Definitions``) and the ``kts`` command line."""

import warnings

# kts uses two Dagster APIs on purpose that warn each time a definition is built (so in every
# process that loads kts's code location, tick after tick in `dagster dev`'s log): the beta
# `backfill_policy` (one run, one Spark session, for a range of partitions) and the preview
# partitioned asset checks (a check result per topic-partition). Only those two warnings are
# silenced; any other Dagster warning still shows.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset` is currently in beta")
warnings.filterwarnings("ignore", message=r"Specifying a partitions_def on an AssetCheckSpec is currently in preview")
