"""Tiering: the rules and procedures that move a partition's segments between its two tiers — who
copies (leadership), along which leader-epoch lineage, the partition's two-tier view, the copy
(Kafka's RLMCopyTask), retention rules and expiry (RLMExpirationTask), DeleteRecords and topic
deletion, the KIP-956 quotas and the data-loss rule."""
