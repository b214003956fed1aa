"""kts's assets, each partitioned by topic-partition: the local inventory, the remote tier and its index."""

from kts_assets.assets.backfill import hourly_record_counts
from kts_assets.assets.copy import remote_segments
from kts_assets.assets.remote_index import remote_log_index
from kts_assets.assets.retention import retention_state
from kts_assets.assets.segments import local_segments
from kts_assets.assets.tiering import local_and_remote_segments

# local_segments and remote_segments are the specs (keys, lineage) of the two assets that
# local_and_remote_segments materialises in one step.
__all__ = ["hourly_record_counts", "local_and_remote_segments", "local_segments", "remote_log_index", "remote_segments",
           "retention_state"]
