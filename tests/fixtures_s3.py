"""Remote-tier fixtures: a real S3 HTTP endpoint (moto's ThreadedMotoServer on loopback), a fresh
bucket per test, a proxy that can cut the network mid-request, and ``remote_storage`` — the same
suite run against the filesystem backend and the S3 backend.

The code under test only ever talks HTTP to the endpoint; nothing is patched in process. moto and
boto3 are imported inside the fixtures so that test modules that do not use them start fast.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MiB = 1024 * 1024
# Small enough that the suite's multi-MiB segments go up in several parts (S3's minimum part size).
TEST_MULTIPART_THRESHOLD = 5 * MiB
TEST_PART_SIZE = 5 * MiB
TEST_PREFIX = "tiered"

_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "kts-test",
    "AWS_SECRET_ACCESS_KEY": "kts-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server shared by the session (fake credentials set)."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        for name, value in _FAKE_CREDENTIALS.items():
            env.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        port = free_loopback_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.stop()


@pytest.fixture
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials that sign requests but open nothing: for tests that need no endpoint at all."""
    for name, value in _FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    """A plain boto3 client to the endpoint: the test's own view of the bucket, independent of the
    code under test."""
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def s3_bucket(s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket for one test; emptied and removed afterwards."""
    bucket = f"kts-test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    yield bucket
    try:
        for upload in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            s3_client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                s3_client.delete_object(Bucket=bucket, Key=item["Key"])
        s3_client.delete_bucket(Bucket=bucket)
    except Exception:
        pass  # a test may have removed the bucket itself


def make_s3_storage(endpoint: str, bucket: str, prefix: str = TEST_PREFIX, **kwargs: Any) -> Any:
    from kts_resources.remote_storage.factory import s3_client
    from kts_resources.remote_storage.s3 import S3RemoteStorage

    kwargs.setdefault("multipart_threshold", TEST_MULTIPART_THRESHOLD)
    kwargs.setdefault("part_size", TEST_PART_SIZE)
    return S3RemoteStorage(s3_client(endpoint), bucket, prefix, **kwargs)


@pytest.fixture(params=["filesystem", "s3"])
def remote_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The remote tier under test, once per backend, both under the prefix ``tiered``: a directory
    under ``tmp_path`` (1 MiB copy chunks), or a fresh bucket (multipart above 5 MiB)."""
    if request.param == "filesystem":
        from kts_resources.remote_storage.filesystem import FileSystemRemoteStorage

        return FileSystemRemoteStorage(tmp_path / "remote", TEST_PREFIX, chunk_size=1 * MiB)
    return make_s3_storage(request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket"))


class CuttingProxy:
    """A TCP proxy in front of the S3 endpoint that plays a network failure: once ``cut_after``
    request bytes have gone through, every open connection is dropped and new ones are closed on
    arrival, until ``heal()``."""

    def __init__(self, target: str):
        host, _, port = target.removeprefix("http://").partition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cut_after: int | None = None
        self.forwarded = 0
        self.down = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def heal(self) -> None:
        with self._lock:
            self.down = False
            self.cut_after = None

    def close(self) -> None:
        self._listener.close()
        self._cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.down:
                client.close()
                continue
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_request: bool) -> None:
        try:
            while data := src.recv(256 * 1024):
                if is_request:
                    with self._lock:
                        self.forwarded += len(data)
                        cut = self.cut_after is not None and self.forwarded >= self.cut_after
                    if cut:
                        self._cut()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _cut(self) -> None:
        with self._lock:
            self.down = True
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture
def s3_cutting_proxy(s3_endpoint: str) -> Iterator[CuttingProxy]:
    """A ``CuttingProxy`` to the moto endpoint; point a client at ``proxy.url``."""
    proxy = CuttingProxy(s3_endpoint)
    yield proxy
    proxy.close()
