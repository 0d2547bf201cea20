"""The auth callout's keys: the issuer (an account key whose public half is the server's
`auth_callout.issuer`), the callout's own NATS user, and the curve key requests are sealed
to (`auth_callout.xkey`)."""

from __future__ import annotations

import os
from pathlib import Path

import nkeys

from nodeward.callout import xkey
from nodeward.nats_auth import write_seed


def write_keys(directory: Path) -> tuple[str, str, str]:
    """`issuer.nk`, `user.nk` and `xkey.nk` in `directory` (mode 0600), never over existing
    files: their public keys (A..., U..., X...)."""
    issuer = write_seed(directory / "issuer.nk", nkeys.PREFIX_BYTE_ACCOUNT)
    user = write_seed(directory / "user.nk", nkeys.PREFIX_BYTE_USER)
    seed = xkey.new_seed()
    fd = os.open(directory / "xkey.nk", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(seed + "\n")
    return issuer, user, xkey.public_key(xkey.decode_seed(seed))
