"""The Dagster APIs kts uses on purpose although Dagster marks them beta or preview, and the
warnings about them silenced: Dagster repeats each warning in every process that loads kts's
definitions (the code server, each run worker, each `kts sync`), and ``dagster dev``'s log filled
with them. Imported by the modules that build definitions with these APIs, before they build them.
Only these messages are silenced: a warning about any other API still shows.
"""

from __future__ import annotations

import warnings

import dagster as dg

KTS_BETA_AND_PREVIEW_APIS = (
    # @asset(backfill_policy=BackfillPolicy.single_run()): one run, one Spark job over many partitions.
    (dg.BetaWarning, r"Parameter `backfill_policy` of function `asset`"),
    # @asset_check(partitions_def=...): a check result per topic-partition.
    (dg.PreviewWarning, r"Specifying a partitions_def on an AssetCheckSpec"),
)

for category, message in KTS_BETA_AND_PREVIEW_APIS:
    warnings.filterwarnings("ignore", message=message, category=category)
