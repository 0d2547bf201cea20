"""Curve keys (`X...`, seeds `SX...`) and the `xkv1` box of nats-io/nkeys, for an auth callout
whose server encrypts its requests (`auth_callout { xkey: X... }`).

The server seals each request to the callout's public curve key with its own key (sent in
the `Nats-Server-Xkey` header); the callout opens it and seals its answer back the same way.
A sealed message is `xkv1`, a 24-byte nonce, and NaCl's box (X25519, XSalsa20-Poly1305).
"""

from __future__ import annotations

import base64
import binascii
import os

import nacl.exceptions
import nacl.public
import nkeys

PREFIX_BYTE_CURVE = 23 << 3  # base32 'X'
VERSION = b"xkv1"
NONCE_LEN = 24
HEADER = "Nats-Server-Xkey"


class XkeyError(ValueError):
    """A curve key or a sealed message that is not what nkeys makes."""


def _b32decode(text: str) -> bytes:
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise XkeyError("not base32") from None


def _checked(raw: bytes) -> bytes:
    body, crc = raw[:-2], raw[-2:]
    if nkeys.crc16(bytearray(body)) != int.from_bytes(crc, "little"):
        raise XkeyError("bad checksum")
    return body


def encode_seed(private: bytes) -> str:
    """A curve seed (`SX...`) for a 32-byte private key, as nkeys `EncodeSeed` writes it."""
    prefix = bytes(
        [nkeys.PREFIX_BYTE_SEED | (PREFIX_BYTE_CURVE >> 5), (PREFIX_BYTE_CURVE & 31) << 3]
    )
    body = prefix + private
    crc = nkeys.crc16(bytearray(body)).to_bytes(2, "little")
    return base64.b32encode(body + crc).decode().rstrip("=")


def decode_seed(seed: str) -> bytes:
    """The 32-byte private key of a curve seed (`SX...`)."""
    body = _checked(_b32decode(seed.strip()))
    prefix = ((body[0] & 7) << 5) | ((body[1] & 248) >> 3)
    if body[0] & 248 != nkeys.PREFIX_BYTE_SEED or prefix != PREFIX_BYTE_CURVE or len(body) != 34:
        raise XkeyError("not a curve seed (SX...)")
    return bytes(body[2:])


def public_key(private: bytes) -> str:
    """The `X...` public key of a curve private key."""
    raw = bytes([PREFIX_BYTE_CURVE]) + bytes(nacl.public.PrivateKey(private).public_key)
    crc = nkeys.crc16(bytearray(raw)).to_bytes(2, "little")
    return base64.b32encode(raw + crc).decode().rstrip("=")


def _public_bytes(key: str) -> bytes:
    body = _checked(_b32decode(key.strip()))
    if body[0] != PREFIX_BYTE_CURVE or len(body) != 33:
        raise XkeyError(f"{key[:8]}... is not a curve public key (X...)")
    return bytes(body[1:])


def new_seed() -> str:
    return encode_seed(os.urandom(32))


def seal(message: bytes, private: bytes, recipient: str) -> bytes:
    """`message` sealed to `recipient` (X...) by `private`."""
    box = nacl.public.Box(
        nacl.public.PrivateKey(private), nacl.public.PublicKey(_public_bytes(recipient))
    )
    nonce = os.urandom(NONCE_LEN)
    return VERSION + nonce + box.encrypt(message, nonce).ciphertext


def open_sealed(sealed: bytes, private: bytes, sender: str) -> bytes:
    """What `sender` (X...) sealed to `private`."""
    if len(sealed) <= len(VERSION) + NONCE_LEN or not sealed.startswith(VERSION):
        raise XkeyError("not an xkv1 sealed message")
    nonce = sealed[len(VERSION) : len(VERSION) + NONCE_LEN]
    box = nacl.public.Box(
        nacl.public.PrivateKey(private), nacl.public.PublicKey(_public_bytes(sender))
    )
    try:
        return bytes(box.decrypt(sealed[len(VERSION) + NONCE_LEN :], nonce))
    except nacl.exceptions.CryptoError:
        raise XkeyError("the sealed message does not open with this key") from None
