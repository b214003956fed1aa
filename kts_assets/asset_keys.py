"""The keys of kts's assets, named once: the assets take their names from here, and the checks
(``kts_assets.checks``, whose specs the assets carry) refer to them without importing the assets.
Plain names, or under ``broker_<id>/`` beside a cluster (``kts_assets.broker_scope``). Also the kind
the UI labels the remote tier with."""

from urllib.parse import urlsplit

import dagster as dg

from kts_assets import broker_scope
from kts_resources import settings

_scope = broker_scope.current()
LOCAL_SEGMENTS = _scope.asset_key("local_segments")
REMOTE_SEGMENTS = _scope.asset_key("remote_segments")
RETENTION_STATE = _scope.asset_key("retention_state")
REMOTE_LOG_INDEX = _scope.asset_key("remote_log_index")
HOURLY_RECORD_COUNTS = _scope.asset_key("hourly_record_counts")
# The whole remote tier, one unpartitioned asset: what the tier-wide scrub reports on.
REMOTE_TIER = _scope.asset_key("remote_tier")


def tier_kind() -> str:
    """The remote tier's kind, as the asset's tag in the UI: ``s3`` for an S3 tier, ``filesystem`` for
    a directory (the default) — the label follows the tier this code location writes."""
    return "s3" if urlsplit(settings.remote_uri()).scheme == "s3" else "filesystem"
