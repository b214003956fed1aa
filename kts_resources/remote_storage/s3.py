"""The remote tier on S3 or an S3-compatible store, over a boto3 S3 client.

The client comes from kts's one builder (``factory.s3_client``), by way of the one road to a tier
(``factory.remote_storage_from_uri``), so every path has the same timeouts and retries. Objects
up to ``multipart_threshold`` go up in one PUT, larger ones as an explicit multipart upload so a
failure can abort it (S3 never shows an incomplete multipart upload as an object). Every PUT and part
carries our CRC-32C, which S3 checks against the bytes it received; what the store echoes back (or,
for stores that echo nothing, what HeadObject reports) is compared with our own.
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from kts_resources.kafka.crc import crc32c

from kts_resources.remote_storage.base import (
    ObjectInfo,
    RangeReader,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
    StoredObject,
    UploadSource,
)
from kts_resources.remote_storage.keys import ObjectKeys

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PARTS = 10_000
DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys

_BUCKET = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]{1,254}")
_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_ACCESS_DENIED = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


def _b64(crc: int) -> str:
    """S3's spelling of a CRC-32C: base64 of its 4 big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix); ValueError unless it is one."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{uri!r} is not s3://bucket/prefix")
    if not _BUCKET.fullmatch(parts.netloc):
        raise ValueError(f"{uri!r}: {parts.netloc!r} is not a bucket name")
    return parts.netloc, parts.path.lstrip("/")


class S3RemoteStorage(RemoteStorageManager):
    """Objects in ``bucket`` under ``prefix``, laid out by ``ObjectKeys(prefix)``."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        multipart_threshold: int = 64 * MiB,
        part_size: int = 16 * MiB,
        max_concurrency: int = 4,
    ):
        if not _BUCKET.fullmatch(bucket):
            raise ValueError(f"{bucket!r} is not a bucket name")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part size {part_size} is below S3's minimum of {MIN_PART_SIZE}")
        if multipart_threshold < 1 or max_concurrency < 1:
            raise ValueError("multipart threshold and concurrency must be positive")
        self._client = client
        self.bucket = bucket
        self.keys = ObjectKeys(prefix)
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.max_concurrency = max_concurrency

    @property
    def client(self) -> Any:
        return self._client

    def __repr__(self) -> str:
        return f"S3RemoteStorage({self.location(self.keys.root)!r}, endpoint={self._endpoint!r})"

    @property
    def _endpoint(self) -> str:
        return str(getattr(self._client.meta, "endpoint_url", "") or "AWS")

    def location(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def _error(self, key: str, e: Exception) -> RemoteStorageError:
        """One line naming the object and what went wrong, instead of a botocore traceback."""
        where = self.location(key)
        if isinstance(e, RemoteStorageError):
            return e
        if isinstance(e, ClientError):
            error = e.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "NoSuchBucket":
                return RemoteStorageError(f"{where}: bucket {self.bucket!r} does not exist at {self._endpoint}")
            if code in _NOT_FOUND:
                return RemoteResourceNotFoundError(f"{where}: no such object")
            if code in _ACCESS_DENIED:
                return RemoteStorageError(f"{where}: access denied ({code}); check the credentials and the bucket policy")
            return RemoteStorageError(f"{where}: {code}: {error.get('Message') or e}")
        if isinstance(e, NoCredentialsError):
            return RemoteStorageError(f"{where}: no AWS credentials found (environment, profile or instance role)")
        if isinstance(e, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError)):
            return RemoteStorageError(f"{where}: cannot reach the S3 endpoint {self._endpoint}: {e}")
        if isinstance(e, ReadTimeoutError):
            return RemoteStorageError(f"{where}: the S3 endpoint {self._endpoint} timed out: {e}")
        return RemoteStorageError(f"{where}: {e}")

    def _call(self, key: str, operation: str, **params: Any) -> Any:
        try:
            return getattr(self._client, operation)(Bucket=self.bucket, **params)
        except (ClientError, BotoCoreError) as e:
            raise self._error(key, e) from e

    # --- upload ---

    def _put_object(self, key: str, source: UploadSource) -> StoredObject:
        if source.size <= self.multipart_threshold:
            return self._put_single(key, source)
        return self._put_multipart(key, source)

    def _put_single(self, key: str, source: UploadSource) -> StoredObject:
        data = source.read(source.size + 1)  # one byte more than expected shows a file that grew
        source.finish(len(data))
        crc = crc32c(data)
        source.check_crc32c(crc, self.location(key))
        response = self._call(key, "put_object", Key=key, Body=data, ContentLength=len(data), ChecksumCRC32C=_b64(crc))
        self._verify_stored(key, response, len(data), {_b64(crc)})
        return StoredObject(key, len(data), crc)

    def _put_multipart(self, key: str, source: UploadSource) -> StoredObject:
        part_size = max(self.part_size, -(-source.size // MAX_PARTS))
        upload_id = self._call(key, "create_multipart_upload", Key=key, ChecksumAlgorithm="CRC32C")["UploadId"]
        try:
            parts, part_crcs, crc, size = self._upload_parts(key, upload_id, source, part_size)
            source.finish(size)
            source.check_crc32c(crc, self.location(key))  # before completing: never visible if not
            response = self._call(
                key, "complete_multipart_upload", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as e:
            self._abort(key, upload_id, e)
            raise
        # A multipart object's CRC-32C is either the checksum of the part checksums ("…-N") or,
        # on stores that compute full-object checksums, the plain CRC of the bytes: accept either.
        composite = _b64(crc32c(b"".join(c.to_bytes(4, "big") for c in part_crcs)))
        self._verify_stored(key, response, size, {composite, _b64(crc)})
        return StoredObject(key, size, crc)

    def _upload_parts(
        self, key: str, upload_id: str, source: UploadSource, part_size: int
    ) -> tuple[list[dict[str, Any]], list[int], int, int]:
        """Read parts in order (the whole-object CRC is computed as they are read) and upload up to
        ``max_concurrency`` at once; at most that many parts are held in memory."""
        futures: list[Future[dict[str, Any]]] = []
        part_crcs: list[int] = []
        pending: set[Future[dict[str, Any]]] = set()
        crc = size = 0
        # Leaving the with-block waits for parts in flight, so an abort never races an upload.
        with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="kts-s3-part") as pool:
            try:
                while True:
                    body = source.read(part_size)
                    if not body and futures:
                        break
                    part_crc = crc32c(body)
                    crc = crc32c(body, crc)
                    size += len(body)
                    part_crcs.append(part_crc)
                    future = pool.submit(self._upload_part, key, upload_id, len(futures) + 1, body, part_crc)
                    futures.append(future)
                    pending.add(future)
                    while len(pending) >= self.max_concurrency:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for f in done:
                            f.result()  # the first failed part stops the upload
                    if len(body) < part_size:
                        break
                    if len(futures) >= MAX_PARTS:
                        raise RemoteStorageError(f"{self.location(key)}: more than {MAX_PARTS} parts: the file grew")
            except BaseException:
                for f in pending:
                    f.cancel()
                raise
        return [f.result() for f in futures], part_crcs, crc, size

    def _upload_part(self, key: str, upload_id: str, number: int, body: bytes, part_crc: int) -> dict[str, Any]:
        response = self._call(
            key, "upload_part", Key=key, UploadId=upload_id, PartNumber=number, Body=body,
            ContentLength=len(body), ChecksumCRC32C=_b64(part_crc),
        )  # fmt: skip
        echoed = response.get("ChecksumCRC32C")
        if echoed is not None and echoed != _b64(part_crc):
            raise RemoteStorageError(f"{self.location(key)}: part {number} stored with CRC-32C {echoed}, sent {_b64(part_crc)}")
        return {"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": _b64(part_crc)}

    def _abort(self, key: str, upload_id: str, cause: BaseException) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except (ClientError, BotoCoreError) as e:
            # The endpoint is gone too: the parts stay invisible until abort_incomplete_uploads.
            cause.add_note(f"{self.location(key)}: could not abort multipart upload {upload_id}: {self._error(key, e)}")

    def _verify_stored(self, key: str, response: dict[str, Any], size: int, accepted: set[str]) -> None:
        """The store's own CRC-32C of what it stored must be ours; a store that echoes none is
        asked (HeadObject) for the size and the checksum it kept."""
        echoed = response.get("ChecksumCRC32C")
        problem = None
        if echoed is None:
            head = self._call(key, "head_object", Key=key, ChecksumMode="ENABLED")
            if head.get("ContentLength") != size:
                problem = f"stored {head.get('ContentLength')} bytes, uploaded {size}"
            echoed = head.get("ChecksumCRC32C")
        if problem is None and echoed is not None and echoed.split("-")[0] not in accepted:
            problem = f"stored with CRC-32C {echoed}, uploaded {' or '.join(sorted(accepted))}"
        if problem is not None:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=key)  # never leave a wrong object visible
            except (ClientError, BotoCoreError):
                pass
            raise RemoteStorageError(f"{self.location(key)}: {problem}")

    # --- reads ---

    def _ranged_get(self, key: str, start: int, end: int | None) -> Any | None:
        """GetObject for bytes start..end (inclusive); None when start is at or past the end."""
        try:
            return self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{'' if end is None else end}")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return None
            raise self._error(key, e) from e
        except BotoCoreError as e:
            raise self._error(key, e) from e

    def _read_body(self, key: str, body: Any) -> bytes:
        try:
            with body:
                return body.read()
        except (BotoCoreError, OSError) as e:
            raise self._error(key, e) from e

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        response = self._ranged_get(key, start, end)
        return b"" if response is None else self._read_body(key, response["Body"])

    def _open_range(self, key: str, start: int, end: int | None) -> RangeReader:
        response = self._ranged_get(key, start, end)
        return _EmptyReader() if response is None else _BodyReader(response["Body"], lambda e: self._error(key, e))

    def _get_object(self, key: str) -> bytes:
        return self._read_body(key, self._call(key, "get_object", Key=key)["Body"])

    # --- deletes, listing, clean-up ---

    def _delete_objects(self, keys: list[str]) -> dict[str, str]:
        if not keys:
            return {}
        wanted = set(keys)

        def delete(batch: list[str]) -> list[dict[str, Any]]:
            # Quiet: the answer names only the keys that failed (a missing key is not a failure).
            return self._call(batch[0], "delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}).get("Errors") or []

        def abort_leftovers() -> None:
            # Parts of an upload of these keys that a crash left behind go too.
            for upload in self._incomplete_uploads(os.path.commonprefix(keys)):
                if upload["Key"] in wanted:
                    self._abort_quietly(upload["Key"], upload["UploadId"])

        # The requests depend on none of each other: up to max_concurrency at once, so a batch of
        # segments costs about one round trip, not one per 1,000 keys and another for the listing.
        # Leaving the with-block waits for every request, so none is still in flight after a failure.
        batches = [keys[i : i + DELETE_BATCH] for i in range(0, len(keys), DELETE_BATCH)]
        with ThreadPoolExecutor(min(self.max_concurrency, len(batches) + 1), thread_name_prefix="kts-s3-delete") as pool:
            answers = [pool.submit(delete, batch) for batch in batches]
            leftovers = pool.submit(abort_leftovers)
        failed = {e.get("Key", ""): f"{e.get('Code')}: {e.get('Message')}" for answer in answers for e in answer.result()}
        leftovers.result()
        return failed

    def _incomplete_uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        try:
            for page in self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
                yield from page.get("Uploads", [])
        except (ClientError, BotoCoreError) as e:
            raise self._error(prefix, e) from e

    def _abort_quietly(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchUpload":  # someone else aborted it
                raise self._error(key, e) from e
        except BotoCoreError as e:
            raise self._error(key, e) from e

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._list_prefix(prefix)
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for item in page.get("Contents", []):
                    modified = item.get("LastModified")
                    etag = item.get("ETag")
                    yield ObjectInfo(item["Key"], int(item["Size"]), modified.timestamp() if modified else None,
                                     f"{etag}@{modified.timestamp() if modified else ''}" if etag else None)
        except (ClientError, BotoCoreError) as e:
            raise self._error(full, e) from e

    def abort_incomplete_uploads(self, older_than_s: float) -> int:
        """Abort multipart uploads under this prefix started more than ``older_than_s`` ago (a
        process killed mid-upload leaves one, invisible but billed)."""
        cutoff = time.time() - older_than_s
        aborted = 0
        for upload in list(self._incomplete_uploads(self.keys.root)):
            initiated = upload.get("Initiated")
            if initiated is None or initiated.timestamp() <= cutoff:
                self._abort_quietly(upload["Key"], upload["UploadId"])
                aborted += 1
        return aborted

    def check_access(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise RemoteStorageError(f"{self.location()}: bucket {self.bucket!r} does not exist at {self._endpoint}") from e
            raise self._error("", e) from e
        except BotoCoreError as e:
            raise self._error("", e) from e


class _BodyReader(RangeReader):
    """A GetObject body as a raw stream; network failures surface as RemoteStorageError."""

    def __init__(self, body: Any, error: Any):
        super().__init__()
        self._body = body
        self._to_error = error

    def readinto(self, buffer) -> int:  # type: ignore[override]
        try:
            data = self._body.read(len(buffer))
        except (BotoCoreError, OSError) as e:
            raise self._to_error(e) from e
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class _EmptyReader(RangeReader):
    def readinto(self, buffer) -> int:  # type: ignore[override]
        return 0
