"""Signing in to NATS with a token file that is rotated in place (a projected
ServiceAccount token, for the NATS auth callout).

nats-py reads the token at every (re)connect (`TokenFile.read`). The callout's grant ends
when the token it was given ends, and the server then closes the connection, which nats-py
does not reopen. So `TokenFile.keep_fresh` reconnects first: from `refresh_before` ahead of
the end of the token in use, it watches the file, and once the kubelet has written a newer
token there (it does at 80 % of a token's life) it reconnects with that one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from pathlib import Path
from typing import Any

POLL_S = 5.0
"""How often the file is read once the token in use is near its end."""


def expiry(token: str) -> float | None:
    """The `exp` of a JWT (unverified: the server's side checks it), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class TokenFile:
    """The token file a daemon signs in with, and when the token it used last ends."""

    def __init__(self, path: Path, refresh_before: float) -> None:
        self.path = path
        self.refresh_before = refresh_before
        self.in_use: float | None = None
        """When the token handed to the last (re)connect expires."""
        self.handed = asyncio.Event()
        """Set when a (re)connect has read the file."""

    def _current(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""  # the server refuses the connection; the next attempt reads again

    def read(self) -> str:
        """The token now in the file (nats-py calls this at every (re)connect)."""
        token = self._current()
        self.in_use = expiry(token)
        self.handed.set()
        return token

    async def keep_fresh(self, nc: Any, log: Any) -> None:
        """Until cancelled: reconnect with the file's newer token before the one in use ends."""
        while True:
            ends = self.in_use
            if ends is None:
                return  # a token that does not end (or not a JWT): nothing to renew
            await asyncio.sleep(max(0.0, ends - self.refresh_before - time.time()))
            newer = expiry(self._current())
            if newer is not None and newer > ends and self.in_use == ends:
                log.info("nats.token_renewed", expires_in=round(newer - time.time()))
                self.handed.clear()
                await nc.force_reconnect()
                await self.handed.wait()  # the reconnect has read the file
            elif time.time() >= ends:
                log.warning("nats.token_expired", path=str(self.path))
                return
            else:
                await asyncio.sleep(min(POLL_S, max(0.0, ends - time.time())))
