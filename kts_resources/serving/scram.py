"""SCRAM-SHA-256 (RFC 5802, RFC 7677), the server's side, as Kafka's broker speaks it: the salted
credential a user is kept as, and the exchange that proves a client knows the password.

Only the credential is stored, never the password: the salt, the iteration count, StoredKey =
H(ClientKey) and ServerKey, where ClientKey = HMAC(SaltedPassword, "Client Key"), ServerKey =
HMAC(SaltedPassword, "Server Key") and SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, i).
The client proves ClientKey without sending it (ClientProof = ClientKey XOR HMAC(StoredKey,
AuthMessage)); the server proves ServerKey back (ServerSignature). Kafka's own limits are kept:
at least 4,096 iterations (RFC 7677's minimum), at most 16,384.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from kts_resources.metadata.credentials import ScramCredential

MECHANISM = "SCRAM-SHA-256"
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
SALT_BYTES = 32


class ScramError(ValueError):
    """The exchange failed: a malformed message, an unknown user or a wrong proof. The text is for
    the server's log; the client learns only that authentication failed."""


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def credential(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> ScramCredential:
    """The credential ``password`` is kept as (a fresh random salt unless one is given)."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations {iterations}: SCRAM-SHA-256 takes {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return ScramCredential(salt, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"), iterations)


def _attributes(message: str) -> dict[str, str]:
    """``a=1,b=2`` → {"a": "1", "b": "2"} (a value may itself hold '=')."""
    out = {}
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if not sep or len(name) != 1:
            raise ScramError(f"malformed SCRAM attribute {part!r}")
        out[name] = value
    return out


def _saslname(text: str) -> str:
    """RFC 5802's saslname: ',' and '=' arrive as '=2C' and '=3D'; any other '=' is malformed."""
    if "=" in text.replace("=2C", "").replace("=3D", ""):
        raise ScramError(f"malformed SCRAM user name {text!r}")
    return text.replace("=2C", ",").replace("=3D", "=")


class ScramServerExchange:
    """One client's exchange: :meth:`client_first` → the server-first message, :meth:`client_final`
    → the server-final message (ScramError for anything refused). ``lookup(user)`` gives the
    user's credential or None; an unknown user goes through the same steps with a made-up salt and
    fails at the proof, so a client cannot tell an unknown user from a wrong password."""

    def __init__(self, lookup, decoy_key: bytes) -> None:
        self._lookup = lookup
        self._decoy_key = decoy_key
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def client_first(self, message: bytes) -> bytes:
        text = _decode(message)
        # gs2-header: channel binding flag ("n" or "y"; "p" binds a channel, which Kafka does not
        # offer), an optional authzid, then the bare message.
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise ScramError(f"unsupported SCRAM GS2 header {text[:40]!r}")
        attributes = _attributes(bare)
        if "n" not in attributes or "r" not in attributes or not attributes["r"]:
            raise ScramError("the SCRAM client-first message lacks a user name or a nonce")
        if "m" in attributes:
            raise ScramError("SCRAM mandatory extensions are not supported")
        self.user = _saslname(attributes["n"])
        if authzid and _saslname(authzid[2:]) != self.user:
            raise ScramError(f"authorization id {authzid[2:]!r} is not the user {self.user!r}")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._credential = self._lookup(self.user)
        known = self._credential
        salt = known.salt if known else _hmac(self._decoy_key, self.user.encode())
        iterations = known.iterations if known else DEFAULT_ITERATIONS
        self._nonce = attributes["r"] + secrets.token_urlsafe(24)
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self._server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        text = _decode(message)
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("the SCRAM client-final message has no proof")
        attributes = _attributes(without_proof)
        if attributes.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise ScramError("the SCRAM channel binding does not match the GS2 header")
        if attributes.get("r") != self._nonce:
            raise ScramError("the SCRAM nonce is not the server's")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise ScramError("the SCRAM proof is not base64") from None
        known = self._credential
        if known is None:
            raise ScramError(f"unknown user {self.user!r}")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(known.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError(f"invalid credentials for user {self.user!r}")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), known.stored_key):
            raise ScramError(f"invalid credentials for user {self.user!r}")
        return f"v={base64.b64encode(_hmac(known.server_key, auth_message)).decode()}".encode()


def _decode(message: bytes) -> str:
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("a SCRAM message that is not UTF-8") from None
