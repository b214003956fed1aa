"""SASL on a `kts serve` connection, as Kafka's broker does it (KIP-43, KIP-152): SaslHandshake v1
names the mechanism, then SaslAuthenticate carries the SCRAM messages (serving/scram.py) against
the users of the metadata store (``kts users``).

With SASL on, a connection is served nothing but ApiVersions, SaslHandshake and SaslAuthenticate
until it has authenticated; any other request closes it (one log line), as Kafka's
SaslServerAuthenticator does. A refused login gets SASL_AUTHENTICATION_FAILED in the
SaslAuthenticate response and the connection is closed once that response is sent. Without SASL, a
SaslHandshake gets ILLEGAL_SASL_STATE, as a broker's plaintext listener answers it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from concurrent.futures import Executor
from typing import Callable

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse

from kts_resources.metadata.credentials import ScramCredential
from kts_resources.serving import scram

log = logging.getLogger(__name__)

SASL_API_KEYS = (SaslHandshakeRequest.API_KEY, SaslAuthenticateRequest.API_KEY)
API_VERSIONS_KEY = 18
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = (scram.MECHANISM,)
# Kafka's message for a refused SCRAM login: the client is told no more than that.
FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"


class CloseConnection(Exception):
    """End the connection, after sending ``response`` when there is one (already logged)."""

    def __init__(self, response=None):
        super().__init__()
        self.response = response


class Sasl:
    """The server's SASL settings: the mechanisms on offer and where a user's credential is looked up
    (``lookup(user, mechanism)``, blocking: it runs in ``pool``)."""

    def __init__(self, lookup: Callable[[str, str], ScramCredential | None], pool: Executor) -> None:
        self.lookup, self.pool = lookup, pool
        # Salts for users that do not exist (the same for a user all along), so an unknown user's
        # exchange looks like a known one's until the proof fails.
        self.decoy_key = secrets.token_bytes(32)

    def session(self, peer: str) -> "SaslSession":
        return SaslSession(self, peer)


class SaslSession:
    """One connection's SASL state: ``authenticated`` once a login succeeded (at once without SASL)."""

    def __init__(self, sasl: Sasl | None, peer: str) -> None:
        self.sasl, self.peer = sasl, peer
        self.authenticated = sasl is None
        self.user: str | None = None
        self._exchange: scram.ScramServerExchange | None = None
        self._step = "handshake"

    def admits(self, request) -> bool:
        """Whether ``request`` may be served now; False closes the connection (logged here)."""
        if self.authenticated or request.API_KEY in SASL_API_KEYS or request.API_KEY == API_VERSIONS_KEY:
            return True
        log.warning("%s (client %s): API key %d before SASL authentication: closing the connection",
                    self.peer, request.header.client_id, request.API_KEY)
        return False

    async def answer(self, request):
        """The response to a SaslHandshake or SaslAuthenticate; CloseConnection when the
        connection ends with it."""
        if request.API_KEY == SaslHandshakeRequest.API_KEY:
            return self._handshake(request)
        return await self._authenticate(request)

    def _handshake(self, request):
        def response(error: int):
            return SaslHandshakeResponse(version=request.API_VERSION, error_code=error, mechanisms=list(MECHANISMS if self.sasl else ()))

        if self.sasl is None:
            return response(ILLEGAL_SASL_STATE)
        if self._step != "handshake":
            log.warning("%s: a second SaslHandshake: closing the connection", self.peer)
            raise CloseConnection(response(ILLEGAL_SASL_STATE))
        if request.mechanism not in MECHANISMS:
            log.warning("%s (client %s): SASL mechanism %r is not enabled (%s is): closing the connection",
                        self.peer, request.header.client_id, request.mechanism, ", ".join(MECHANISMS))
            raise CloseConnection(response(UNSUPPORTED_SASL_MECHANISM))
        self._exchange = scram.ScramServerExchange(lambda user: self.sasl.lookup(user, scram.MECHANISM), self.sasl.decoy_key)
        self._step = "client-first"
        return response(0)

    async def _authenticate(self, request):
        def response(error: int, message: str | None = None, auth_bytes: bytes = b""):
            return SaslAuthenticateResponse(version=request.API_VERSION, error_code=error, error_message=message,
                                            auth_bytes=auth_bytes, session_lifetime_ms=0)

        if self._step not in ("client-first", "client-final"):
            log.warning("%s: SaslAuthenticate %s: closing the connection", self.peer,
                        "after authentication" if self.authenticated else "before a SaslHandshake")
            raise CloseConnection(response(ILLEGAL_SASL_STATE, "SaslAuthenticate out of turn"))
        token = bytes(request.auth_bytes)
        try:
            if self._step == "client-first":
                # The credential is read from the store: off the event loop.
                reply = await asyncio.get_running_loop().run_in_executor(self.sasl.pool, self._exchange.client_first, token)
                self._step = "client-final"
                return response(0, None, reply)
            reply = self._exchange.client_final(token)
        except scram.ScramError as e:
            log.warning("%s: SASL/%s authentication failed: %s: closing the connection", self.peer, scram.MECHANISM, e)
            raise CloseConnection(response(SASL_AUTHENTICATION_FAILED, FAILED)) from None
        self._step, self.authenticated, self.user = "done", True, self._exchange.user
        log.info("%s: authenticated as %s (SASL/%s)", self.peer, self.user, scram.MECHANISM)
        return response(0, None, reply)
