"""The keys of kts's assets, named once: the assets take their names from here, and the checks
(``kts_assets.checks``, whose specs the assets carry) refer to them without importing the assets.
Also the kind the UI labels the remote tier with."""

from urllib.parse import urlsplit

import dagster as dg

from kts_resources import settings

LOCAL_SEGMENTS = dg.AssetKey("local_segments")
REMOTE_SEGMENTS = dg.AssetKey("remote_segments")
RETENTION_STATE = dg.AssetKey("retention_state")
REMOTE_LOG_INDEX = dg.AssetKey("remote_log_index")


def tier_kind() -> str:
    """The remote tier's kind, as the asset's tag in the UI: ``s3`` for an S3 tier, ``filesystem`` for
    a directory (the default) — the label follows the tier this code location writes."""
    return "s3" if urlsplit(settings.remote_uri()).scheme == "s3" else "filesystem"
