"""The partitions every kts asset is split by: one per Kafka topic-partition."""

import dagster as dg

# Keys are "<topic>-<partition>", the broker's own directory name; the discovery sensor adds them.
topic_partitions = dg.DynamicPartitionsDefinition(name="topic_partitions")
