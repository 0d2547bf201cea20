"""One builder for the Kubernetes objects the tests create."""

from __future__ import annotations

from typing import Any


def manifest(api_version: str, kind: str, name: str, **fields: Any) -> dict[str, Any]:
    """An object of `kind` named `name` (`fields`: its spec, roleRef...)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **fields}
