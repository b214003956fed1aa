"""The metadata store and the remote tier this environment names (KTS_DATABASE_URL, KTS_REMOTE_URI,
or kts's embedded defaults), opened for a command: a setting kts cannot use is one line
(:class:`~kts_assets.cli.common.CommandError`), before any work."""

from __future__ import annotations

from kts_assets.cli.common import EXIT_USAGE, CommandError


def remote_storage():
    from kts_resources.remote_storage.factory import remote_storage_from_uri

    try:
        return remote_storage_from_uri(remote_uri())
    except ValueError as e:
        raise CommandError(f"KTS_REMOTE_URI: {e}", EXIT_USAGE) from None


def remote_uri() -> str:
    """``KTS_REMOTE_URI`` (or its default), refused as a usage error before any work when the
    factory would not open it (a relative ``file:`` path, an unknown scheme)."""
    from kts_resources import settings
    from kts_resources.remote_storage.factory import check_remote_uri

    uri = settings.remote_uri()
    try:
        check_remote_uri(uri)
    except ValueError as e:
        raise CommandError(f"KTS_REMOTE_URI: {e}", EXIT_USAGE) from None
    return uri


def metadata_store():
    from kts_resources.metadata.database import MetadataStoreMisconfigured
    from kts_resources.metadata.embedded import EmbeddedPostgresError
    from kts_resources.metadata.store import RemoteLogMetadataStore

    try:
        return RemoteLogMetadataStore.from_env()
    except (MetadataStoreMisconfigured, EmbeddedPostgresError) as e:
        raise CommandError(str(e)) from None


def known_partition(store, topic: str, partition: int):
    """The topic's partition as the metadata store knows it (its topic id); one line for a topic name
    Kafka refuses or a topic kts has not seen."""
    from kts_resources.kafka.partition import TopicPartition, topic_name_problem
    from kts_resources.remote_log import TopicIdPartition

    problem = topic_name_problem(topic)
    if problem is not None:
        raise CommandError(f"topic {topic!r}: {problem}", EXIT_USAGE)
    topic_id = store.topic_id(topic)
    if topic_id is None:
        raise CommandError(f"topic {topic!r} is not known to the metadata store (kts sync has not seen it)")
    return TopicIdPartition(topic_id, TopicPartition(topic, partition))
