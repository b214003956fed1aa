"""The partitions every kts asset is split by: one per Kafka topic-partition."""

import dagster as dg

from kts_assets import broker_scope

# Keys are "<topic>-<partition>", the broker's own directory name; the discovery sensor adds them.
# The set is named per broker beside a cluster (kts_assets.broker_scope): each broker's log dirs
# hold their own partitions, and the instance keeps dynamic partitions by name.
topic_partitions = dg.DynamicPartitionsDefinition(name=broker_scope.current().partitions_def_name)

# Why a sensor or schedule over the known partitions skips its tick before discovery added any.
NO_PARTITIONS_YET = "no partitions known yet (the discovery sensor adds them)"
