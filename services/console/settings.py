"""`services.console` in the config file."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field

from nodeward.config import Section


class ConsoleSettings(Section):
    """Where the console listens, who may read it, and how much of the feeds it keeps."""

    host: str = "127.0.0.1"
    """loopback by default; elsewhere a token"""
    port: int = Field(default=8480, ge=0, le=65535, description="0 picks a free port")
    token_file: Path | None = None
    """the viewers' token (one line, at least 16 characters); required off loopback"""
    actions: int = Field(default=500, ge=10, description="audit records kept for the Actions view")
    alerts: int = Field(default=200, ge=10, description="Falco alerts kept for the Security view")
    dead_letters: int = Field(default=50, ge=1, description="newest dead letters shown")
    refresh_s: float = Field(
        default=30.0, gt=0, description="the whole picture is read again at least this often"
    )
    settle_s: float = Field(
        default=0.3, ge=0, description="after a change, how long to gather more before re-reading"
    )
    detail_limit: int = Field(
        default=1000,
        ge=1,
        description="past this many nodes shown, quiet nodes are one cell each, not one per GPU",
    )
    viewer_queue: int = Field(default=2000, ge=10, description="updates held for a slow viewer")
    trend_wait_s: float = Field(
        default=5.0,
        ge=0,
        description="how long a page waits for its trend's read before it is drawn as read so far",
    )
    trend_messages: int = Field(
        default=1_000_000,
        ge=100,
        description="past this many stored messages, a trend's first read takes only the newest",
    )
    culler_actor: str = Field(
        default="service/culler", description="whose audited warnings are the sessions warned"
    )


def loopback(host: str) -> bool:
    """Whether a bind address is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
