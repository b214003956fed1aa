"""The `kts serve` server: asyncio, one task per connection, the reader's blocking reads in a
bounded thread pool.

Why asyncio: a consumer's connection spends most of its time idle or in a fetch that waits for
data (max_wait_ms), and a thread per connection would hold a stack (8 MiB reserved) for each of
those; the reads themselves (files, ranged GETs, CRC-32C, the store) run in a pool of
``READ_THREADS``, and the GIL is released in all of them, so two cores share the work. A slow or
stalled client waits on its own socket only. Measured: 1,000 idle connections cost 4 MiB of RSS and no
thread, and a consumer beside them read as fast as alone (README, "Over the Kafka protocol").

Each connection's requests are answered one after the other, in order (as a broker does: the
protocol matches responses to requests by order as well as correlation id). A frame larger than
``MAX_REQUEST_BYTES``, of a negative size, cut short, or that does not decode, closes that
connection with one log line; an API key or version not served closes it too, as Kafka's broker
does, except an ApiVersions request, which gets KIP-511's v0 answer. SIGTERM (or SIGINT) stops
accepting, lets in-flight requests finish for up to ``DRAIN_S`` (a waiting fetch returns at once),
closes every connection and returns.

Safe to expose (serving/tls.py, auth.py, budget.py): optional TLS on every connection, optional
SASL/SCRAM-SHA-256 before anything but ApiVersions is served; at most ``max_connections`` at once
(one more is closed as it arrives, with a log line); the fetch responses held in memory capped
server-wide (``ByteBudget``); a client that takes no byte of its response for ``WRITE_STALL_S`` is
cut off, so a stalled client holds its share of memory for seconds, not for ever.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from kts_resources.reading.reader import TieredLogReader
from kts_resources.serving import auth, protocol
from kts_resources.serving.budget import ByteBudget
from kts_resources.serving.handlers import FETCH_MAX_BYTES_CAP, ReadSide

log = logging.getLogger(__name__)

# Requests a read-only node gets are small (a fetch of 1,000 partitions is tens of KiB); Kafka's
# own socket.request.max.bytes is 100 MiB, far more than any of them needs.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
READ_THREADS = 8
DRAIN_S = 5.0
MAX_CONNECTIONS = 1000
# What every connection's fetch responses may hold in memory together.
FETCH_BUDGET_BYTES = 128 * 1024 * 1024
# A client that takes no byte of a response for this long is stalled: its connection is closed (a
# slow one, still taking bytes, is not); sooner while other fetches wait for the memory it holds.
# Looked at every STALL_CHECK_S.
WRITE_STALL_S = 10.0
WRITE_STALL_CONTENDED_S = 2.0
STALL_CHECK_S = 0.5
TLS_HANDSHAKE_S = 10.0
FETCH_KEY = 1
QUOTA_SAMPLES_EVERY_MS = 100
# Chunks read from the tier and not yet written to the chunk cache, at most (past it they go uncached).
CHUNK_WRITE_BEHIND_BYTES = 64 * 1024 * 1024


class _Close(Exception):
    """End this connection (already logged), after sending ``response`` when there is one."""

    def __init__(self, response: bytes | None = None):
        super().__init__()
        self.response = response


class KafkaReadServer:
    def __init__(self, reader: TieredLogReader, host: str, port: int, advertised: tuple[str, int] | None = None, *,
                 tls: ssl.SSLContext | None = None, sasl_lookup=None, max_connections: int = MAX_CONNECTIONS,
                 fetch_budget_bytes: int = FETCH_BUDGET_BYTES) -> None:
        self.reader = reader
        self.host, self.port = host, port
        self.advertised = advertised
        self.draining = asyncio.Event()
        self._stop = asyncio.Event()
        self._connections: dict[asyncio.Task, bool] = {}  # task → busy answering a request
        self.pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="kts-serve-read")
        self.side: ReadSide | None = None
        self.tls = tls
        # sasl_lookup(user, mechanism) → the user's credential: SASL/SCRAM on (None: off).
        self.sasl = auth.Sasl(sasl_lookup, self.pool) if sasl_lookup is not None else None
        self.max_connections = max_connections
        self.budget = ByteBudget(fetch_budget_bytes)

    async def run(self, on_listening: Callable[[str, int, tuple[str, int]], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or :meth:`stop`); ``on_listening(host, port, advertised)`` once bound."""
        server = await asyncio.start_server(self._connection, self.host, self.port, reuse_address=True)
        host, port = server.sockets[0].getsockname()[:2]
        advertised = self.advertised or (host, port)
        if advertised[1] == 0:
            advertised = (advertised[0], port)
        self.side = ReadSide(self.reader, self.pool, advertised=advertised, draining=self.draining)
        # The fetch quota's samples written to the store in batches, not a transaction per remote
        # read (which cost more than the read): tiering/quotas.py's BufferedSamples.
        quota = self.reader.fetch_quota
        samples = quota.record_in_batches(QUOTA_SAMPLES_EVERY_MS) if quota is not None else None
        # Remote chunks written to the chunk cache behind the fetch that read them (chunk_cache.py).
        cache = self.reader.chunk_cache
        if cache is not None:
            cache.write_behind(CHUNK_WRITE_BEHIND_BYTES)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        try:
            if on_listening is not None:
                on_listening(host, port, advertised)
            await self._stop.wait()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            server.close()
            await self._drain()
            if self.side is not None:
                self.side.groups.close(DRAIN_S)  # the groups' last commits into the tier too
            self.pool.shutdown(wait=False, cancel_futures=True)
            if cache is not None:
                await asyncio.get_running_loop().run_in_executor(None, cache.close)
            if samples is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(None, samples.close)
                except Exception as e:  # noqa: BLE001 — stopping: the last bytes recorded are lost, said once
                    log.warning("the fetch quota's last samples were not written: %s", e)

    def stop(self) -> None:
        self._stop.set()

    async def _drain(self) -> None:
        self.draining.set()
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()  # idle: waiting for a request that will not be answered
        pending = list(self._connections)
        if pending:
            _done, late = await asyncio.wait(pending, timeout=DRAIN_S)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d request(s) still running after %.0f s: their connections are closed", len(late), DRAIN_S)
                await asyncio.wait(late, timeout=1)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer = f"{peer[0]}:{peer[1]}" if peer else "a client"
        if len(self._connections) >= self.max_connections:
            log.warning("%s: %d connections already (the most served at once): closing the new one", peer, len(self._connections))
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self._connections[task] = False
        session = auth.SaslSession(self.sasl, peer)
        try:
            if self.tls is not None:
                try:
                    await writer.start_tls(self.tls, ssl_handshake_timeout=TLS_HANDSHAKE_S)
                except (ssl.SSLError, ConnectionError, TimeoutError, asyncio.TimeoutError) as e:
                    log.warning("%s: TLS handshake failed (%s): closing the connection", peer, e)
                    return
            while not self.draining.is_set():
                try:
                    head = await reader.readexactly(4)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        self.side.stats.malformed_frames += 1
                        log.warning("%s: connection closed inside a frame's size (%d of 4 bytes): closing it", peer, len(e.partial))
                    return
                size = int.from_bytes(head, "big", signed=True)
                if size < 0 or size > MAX_REQUEST_BYTES:
                    self.side.stats.malformed_frames += 1
                    log.warning("%s: a request frame of %d bytes (at most %d are taken): closing the connection", peer, size, MAX_REQUEST_BYTES)
                    return
                try:
                    frame = await reader.readexactly(size)
                except asyncio.IncompleteReadError as e:
                    self.side.stats.malformed_frames += 1
                    log.warning("%s: the connection ended %d bytes into a %d-byte request: closing it", peer, len(e.partial), size)
                    return
                self._connections[task] = True
                held = 0
                try:
                    try:
                        response, held = await self._answer(frame, peer, session)
                    finally:
                        self._connections[task] = False
                    if response is not None:
                        for piece in response:  # one by one: writelines joins them into one copy
                            writer.write(piece)
                        response = piece = None  # the transport holds its own copy of what it has not sent yet
                        await self._drained(writer, peer)
                finally:
                    if held:
                        self.budget.release(held)
        except _Close as close:
            if close.response is not None:
                try:
                    writer.write(close.response)
                    await self._drained(writer, peer)
                except (_Close, ConnectionError):
                    pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.pop(task, None)
            writer.close()

    async def _drained(self, writer: asyncio.StreamWriter, peer: str) -> None:
        """Once the client has taken what was written (all but the transport's low-water mark);
        _Close when it stalls."""
        unsent, since = writer.transport.get_write_buffer_size(), time.monotonic()
        if not unsent and not writer.transport.is_closing():
            return  # the socket took it all: nothing to wait for (wait_for costs a task per response)
        while True:
            try:
                async with asyncio.timeout(STALL_CHECK_S):
                    await writer.drain()
                return
            except TimeoutError:
                now = writer.transport.get_write_buffer_size()
                if now < unsent:
                    unsent, since = now, time.monotonic()
                    continue
                stalled = WRITE_STALL_CONTENDED_S if self.budget.contended else WRITE_STALL_S
                if time.monotonic() - since >= stalled:
                    log.warning("%s: the client took none of its response's last %d bytes for %.0f s: closing the connection",
                                peer, now, stalled)
                    writer.transport.abort()  # drops what it holds unsent
                    raise _Close from None

    async def _answer(self, frame: bytes, peer: str, session: auth.SaslSession) -> tuple[list | None, int]:
        """The response frame to ``frame``, as pieces to write in order, and the fetch budget it
        holds (to release once sent)."""
        try:
            request = protocol.decode_request(frame)
        except protocol.UnsupportedRequest as e:
            header = e.header
            self.side.stats.request(protocol.api_name(header.request_api_key))
            self.side.stats.error(protocol.api_name(header.request_api_key))
            if header.request_api_key == 18:  # KIP-511: the supported ranges, at v0
                log.info("%s (client %s): %s: answered with the supported versions", peer, header.client_id, e)
                return [protocol.api_versions_fallback(header.correlation_id)], 0
            log.warning("%s (client %s): %s: closing the connection", peer, header.client_id, e)
            raise _Close from None
        except protocol.MalformedRequest as e:
            self.side.stats.malformed_frames += 1
            log.warning("%s: %s: closing the connection", peer, e)
            raise _Close from None
        if not session.admits(request):
            raise _Close
        if request.API_KEY in auth.SASL_API_KEYS:
            try:
                return [protocol.frame_response(await session.answer(request), request.header.correlation_id)], 0
            except auth.CloseConnection as close:
                raise _Close(protocol.frame_response(close.response, request.header.correlation_id)) from None
        held = 0
        try:
            if request.API_KEY == FETCH_KEY and request.max_bytes > 0:
                # At most the grant is read; the response's real size is held until it is sent.
                held = await self.budget.reserve(min(request.max_bytes, FETCH_MAX_BYTES_CAP))
                request.max_bytes = held
            response = await self.side.answer(request)
            if response is None:
                return None, held
            if request.API_KEY == FETCH_KEY:
                framed = protocol.frame_fetch_response(response, request.header.correlation_id)
            else:
                framed = [protocol.frame_response(response, request.header.correlation_id)]
            if held:
                held = self.budget.charge(held, sum(len(piece) for piece in framed))
            return framed, held
        except BaseException as e:
            if held:
                self.budget.release(held)
            if isinstance(e, Exception):
                self.side.stats.error(protocol.api_name(request.API_KEY))
                log.exception("%s: %s v%d failed: closing the connection", peer, protocol.api_name(request.API_KEY), request.API_VERSION)
                raise _Close from None
            raise
