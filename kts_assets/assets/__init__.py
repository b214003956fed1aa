"""kts's assets, each partitioned by topic-partition: the local inventory and the remote tier."""

from kts_assets.assets.copy import remote_segments
from kts_assets.assets.segments import local_segments

__all__ = ["local_segments", "remote_segments"]
