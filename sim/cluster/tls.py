"""A throwaway CA and serving certificate, so clients send bearer tokens (kubectl will not over HTTP)."""

from __future__ import annotations

import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nodeward import certs


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d) / "tls.crt", Path(d) / "tls.key"
            cert.write_bytes(self.cert_pem + self.ca_pem)
            key.write_bytes(self.key_pem)
            key.chmod(0o600)
            ctx.load_cert_chain(cert, key)
        return ctx


def make_serving_cert(host: str) -> ServingCert:
    """A CA and a certificate for `host`, `localhost` and `127.0.0.1`, valid for a year."""
    ca = certs.authority("nodeward-sim-ca")
    cert_pem, key_pem, _ = certs.issue(
        ca, ["localhost", "127.0.0.1", host], common="kube-apiserver", days=365
    )
    return ServingCert(ca.pem, cert_pem, key_pem)
