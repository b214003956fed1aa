"""The one road from a tier URI (``KTS_REMOTE_URI``, ARCHITECTURE.md's environment contract) to a
remote storage object, ``remote_storage_from_uri``, and the one builder of S3 clients, ``s3_client``.
The CLI, the pipeline's ``RemoteTierResource`` (its S3 client through dagster-aws's ``S3Resource``,
``resources.KtsS3Resource``, which calls the second), the Spark tasks and the tests all open the
tier through the first, so every S3 client has the same timeouts, retries and addressing style."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from kts_resources import settings
from kts_resources.remote_storage.base import RemoteStorageManager
from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage

# Fail fast: an unreachable endpoint is reported in seconds, not after botocore's defaults (60 s
# to connect, five attempts); a slow read of a large part still has a minute.
S3_CONNECT_TIMEOUT_S = 3
S3_READ_TIMEOUT_S = 60
S3_MAX_ATTEMPTS = 3  # in all, the first included
S3_MAX_POOL_CONNECTIONS = 16  # parallel multipart parts of several partitions at once


def s3_client_config(endpoint_url: str | None = None, max_attempts: int = S3_MAX_ATTEMPTS) -> Any:
    """The botocore ``Config`` of every S3 client kts makes. S3-compatible stores (MinIO, Ceph,
    moto) rarely resolve virtual-hosted bucket names, so a custom endpoint gets path-style addressing."""
    from botocore.config import Config

    return Config(
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        s3={"addressing_style": "path"} if endpoint_url else None,
        max_pool_connections=S3_MAX_POOL_CONNECTIONS,
    )


def s3_client(
    endpoint_url: str | None = None,
    *,
    max_attempts: int = S3_MAX_ATTEMPTS,
    region_name: str | None = None,
    profile_name: str | None = None,
    use_ssl: bool = True,
    verify: str | bool | None = None,
    aws_access_key_id: str | None = None,
    aws_secret_access_key: str | None = None,
    aws_session_token: str | None = None,
) -> Any:
    """A boto3 S3 client configured by ``s3_client_config`` (boto3 is imported only here, when S3
    is used). The keyword arguments are dagster-aws ``S3Resource``'s fields, which
    ``resources.KtsS3Resource`` passes through; None leaves each to boto3's own lookup
    (environment, profile, instance role)."""
    import boto3

    session = boto3.session.Session(profile_name=profile_name)
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_name,
        use_ssl=use_ssl,
        verify=verify,
        aws_access_key_id=aws_access_key_id,
        aws_secret_access_key=aws_secret_access_key,
        aws_session_token=aws_session_token,
        config=s3_client_config(endpoint_url, max_attempts),
    )


def default_remote_uri() -> str:
    """``$KTS_REMOTE_URI``, else the directory ``KTS_HOME/remote`` (``settings.remote_uri``)."""
    return settings.remote_uri()


# ``endpoint_url``'s default: ``KTS_S3_ENDPOINT_URL`` of this process. A Spark task passes the
# driver's value instead (None included: AWS), which its executor's environment may not have.
FROM_SETTINGS: Any = object()


def remote_storage_from_uri(uri: str | None = None, *, endpoint_url: str | None = FROM_SETTINGS,
                            make_s3_client: Callable[[str | None], Any] | None = None) -> RemoteStorageManager:
    """``file:///path`` → FileSystemRemoteStorage, ``s3://bucket/prefix`` → S3RemoteStorage over
    ``make_s3_client(endpoint_url)`` (by default ``s3_client``; the pipeline's goes through
    dagster-aws), ``endpoint_url`` None meaning AWS and by default ``settings.s3_endpoint_url()``;
    None → ``default_remote_uri()``. Nothing is contacted yet: call ``check_access()`` for an early,
    clear error."""
    uri = uri or default_remote_uri()
    parts = urlsplit(uri)
    if parts.scheme == "file":
        root, modes = _file_tier(uri)
        try:
            return FileSystemRemoteStorage(root, **modes)
        except ValueError as e:
            raise ValueError(f"remote tier {uri!r}: {e}") from None
    if parts.scheme == "s3":
        from kts_resources.remote_storage.s3 import S3RemoteStorage, parse_s3_uri  # boto3 only when S3 is used

        bucket, prefix = parse_s3_uri(uri)
        if endpoint_url is FROM_SETTINGS:
            endpoint_url = settings.s3_endpoint_url()
        return S3RemoteStorage((make_s3_client or s3_client)(endpoint_url), bucket, prefix)
    raise ValueError(f"remote tier {uri!r}: expected file:///path or s3://bucket/prefix")


def check_remote_uri(uri: str) -> None:
    """ValueError (one line) unless ``uri`` is a tier URI ``remote_storage_from_uri`` accepts; no
    client is made and nothing is touched, so a command can refuse it before any work."""
    scheme = urlsplit(uri).scheme
    if scheme == "file":
        _file_tier(uri)
    elif scheme == "s3":
        from kts_resources.remote_storage.s3 import parse_s3_uri

        parse_s3_uri(uri)
    else:
        raise ValueError(f"remote tier {uri!r}: expected file:///path or s3://bucket/prefix")


def _file_tier(uri: str) -> tuple[Path, dict[str, int]]:
    """The root directory and modes of a ``file:`` URI. Only an absolute path: a relative one
    would name another tier in every working directory (issue 34)."""
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost") or parts.fragment or not parts.path.startswith("/"):
        raise ValueError(f"remote tier {uri!r}: expected file:///absolute/path (an absolute path; a relative "
                         f"one names another tier in every working directory)")
    try:
        return Path(unquote(parts.path)), _file_modes(uri, parts.query)
    except ValueError as e:
        raise ValueError(f"remote tier {uri!r}: {e}") from None


FILE_URI_MODES = ("dir_mode", "file_mode")


def _file_modes(uri: str, query: str) -> dict[str, int]:
    """``?dir_mode=0750&file_mode=0640`` (octal) of a ``file://`` URI; nothing else is accepted."""
    modes = {}
    try:
        fields = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"query {query!r}: expected dir_mode=0700&file_mode=0600") from None
    for name, value in fields:
        if name not in FILE_URI_MODES:
            raise ValueError(f"unknown parameter {name!r} (expected {' or '.join(FILE_URI_MODES)})")
        try:
            modes[name] = int(value, 8)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an octal mode such as 0700") from None
    return modes
