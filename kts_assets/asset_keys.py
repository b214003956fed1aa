"""The keys of kts's assets, named once: the assets take their names from here, and the checks
(``kts_assets.checks``, whose specs the assets carry) refer to them without importing the assets."""

import dagster as dg

LOCAL_SEGMENTS = dg.AssetKey("local_segments")
REMOTE_SEGMENTS = dg.AssetKey("remote_segments")
RETENTION_STATE = dg.AssetKey("retention_state")
REMOTE_LOG_INDEX = dg.AssetKey("remote_log_index")
