"""The auth callout's two keys: the issuer (an account key whose public half is the
server's `auth_callout.issuer`) and the callout's own NATS user."""

from __future__ import annotations

from pathlib import Path

import nkeys

from nodeward.nats_auth import write_seed


def write_keys(directory: Path) -> tuple[str, str]:
    """`issuer.nk` and `user.nk` in `directory`, never over existing files: (issuer public
    key A..., user public key U...)."""
    issuer = write_seed(directory / "issuer.nk", nkeys.PREFIX_BYTE_ACCOUNT)
    user = write_seed(directory / "user.nk", nkeys.PREFIX_BYTE_USER)
    return issuer, user
