"""NATS JWTs (`ed25519-nkey`), as nats-io/jwt v2 encodes and checks them.

A token is `header.payload.signature`, each part base64url without padding; the header is
`{"typ":"JWT","alg":"ed25519-nkey"}`; the signature is the issuer's ed25519 signature of
`header.payload`; `jti` is the base32 (no padding) SHA-512/256 of the claims' standard
fields with `jti` empty, as `ClaimsData.hash` makes it; `nats.version` is 2. The auth
callout reads the server's authorization request with `decode` and answers with two of
these: the user's claims inside the authorization response's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
# The standard fields in nats-io/jwt's ClaimsData order (`json.Marshal` of the struct).
_STANDARD = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")


class JwtError(ValueError):
    """A token that is not a NATS JWT, or whose signature or times do not hold."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"not base64url: {exc}") from None


def public_key_bytes(public: str) -> tuple[int, bytes]:
    """The prefix byte and raw 32-byte key of an encoded nkey public key (A..., N..., U...)."""
    try:
        raw = base64.b32decode(public.encode())
    except (binascii.Error, ValueError):
        raise JwtError(f"{public[:8]}... is not an nkey public key") from None
    if len(raw) != 35 or nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        raise JwtError(f"{public[:8]}... is not an nkey public key (bad length or checksum)")
    return raw[0], bytes(raw[1:33])


def _hash(claims: dict[str, Any]) -> str:
    standard = {
        k: claims[k] for k in _STANDARD if k != "jti" and claims.get(k) not in (None, "", 0)
    }
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode())
    return base64.b32encode(digest.digest()).rstrip(b"=").decode()


def encode(claims: dict[str, Any], signer: nkeys.KeyPair, *, now: float | None = None) -> str:
    """`claims` signed by `signer`: `iss` (its public key), `iat` and `jti` are set here."""
    body = dict(claims)
    body["iss"] = signer.public_key.decode()
    body["iat"] = int(time.time() if now is None else now)
    body.pop("jti", None)
    body["jti"] = _hash(body)
    nats = dict(body.get("nats") or {})
    nats["version"] = 2
    body["nats"] = nats
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = signer.sign(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{_b64(signature)}"


def decode(token: str, *, now: float | None = None) -> dict[str, Any]:
    """The claims of `token`, after checking its header, its issuer's signature and its
    `exp`/`nbf`; who the issuer must be is the caller's check (`iss`)."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("expected 3 chunks")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except ValueError as exc:
        raise JwtError(f"not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unexpected header {header!r}")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise JwtError("no issuer")
    _, key = public_key_bytes(claims["iss"])
    try:
        nacl.signing.VerifyKey(key).verify(f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2]))
    except nacl.exceptions.BadSignatureError:
        raise JwtError("claim failed V2 signature verification") from None
    moment = time.time() if now is None else now
    if int(claims.get("exp") or 0) and moment > int(claims["exp"]):
        raise JwtError("claim is expired")
    if int(claims.get("nbf") or 0) and int(claims["nbf"]) > moment:
        raise JwtError("claim is not yet valid")
    return claims
