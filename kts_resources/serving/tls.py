"""TLS for `kts serve` (Kafka's SSL and SASL_SSL listeners): the server's certificate chain and
private key, PEM files, loaded once at start. TLS 1.2 at least, Python's default ciphers; no client
certificates (clients authenticate with SASL, or not at all)."""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsConfigError(ValueError):
    """The certificate or key cannot be used: the text names the file and why."""


def server_context(certificate: Path, key: Path) -> ssl.SSLContext:
    for what, path in (("certificate", certificate), ("key", key)):
        if not path.is_file():
            raise TlsConfigError(f"TLS {what} {path}: no such file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(certificate), keyfile=str(key))
    except ssl.SSLError as e:
        raise TlsConfigError(f"TLS certificate {certificate} with key {key}: {e.reason or e}") from None
    except OSError as e:
        raise TlsConfigError(f"TLS certificate {certificate} or key {key}: {e.strerror or e}") from None
    return context
