"""What a caller of the read path chooses: the isolation level and how many bytes a fetch returns
at most. Apart from the reader, so the CLI describes `kts fetch`'s options without importing the
reader (and with it the tier, the store and the remote log index) on every command."""

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
DEFAULT_MAX_BYTES = 1024 * 1024
