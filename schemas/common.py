"""Value objects shared by several event types."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from schemas.base import Model

# Kubernetes object names: DNS subdomains (253) or labels (63). Validated loosely here,
# strictly by the API server; the subject builder makes any value a safe token.
K8sName = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Namespace = Annotated[str, StringConstraints(min_length=1, max_length=63)]
NonNegFloat = Annotated[float, Field(ge=0)]


class PodRef(Model):
    """A pod (and optionally one container) an event concerns."""

    namespace: Namespace
    name: K8sName
    container: str | None = None
    uid: str | None = None


class ObjectRef(Model):
    """Any Kubernetes object an action targets."""

    kind: str = Field(min_length=1)
    name: K8sName
    namespace: str | None = None
    api_version: str | None = None

    def key(self) -> str:
        """`kind/namespace/name`, or `kind/name` for cluster-scoped objects."""
        parts = [self.kind.lower(), self.namespace, self.name]
        return "/".join(p for p in parts if p)
