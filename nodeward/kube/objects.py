"""Read-only views of API objects as the port returns them (plain JSON dicts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodView:
    """A pod object: its namespace, name and UID."""

    pod: dict[str, Any]

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str | None:
        uid = self.pod["metadata"].get("uid")
        return str(uid) if uid else None
