"""RBAC manifests grouped the way the sim cluster's authorizer reads them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def by_resource(
    docs: Iterable[dict[str, Any]], kinds: Iterable[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """`docs` by their resource (`ClusterRoleBinding` under `clusterrolebindings`...); only
    those of `kinds` where given."""
    wanted = None if kinds is None else set(kinds)
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        if wanted is None or doc.get("kind") in wanted:
            out.setdefault(doc["kind"].lower() + "s", []).append(doc)
    return out
