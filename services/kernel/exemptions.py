"""Opt-out: `nodeward.io/exempt=true` on a node, a pod or a pod's namespace exempts it;
and namespaces a service never acts in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from schemas.remediation import Outcome
from services.kernel.proposal import Proposal, Stage, Verdict

EXEMPT_LABEL = "nodeward.io/exempt"

NamespaceLabels = Callable[[str], Awaitable[dict[str, str]]]


def is_exempt(obj: dict[str, Any] | None) -> bool:
    """True if the object carries the exempt label with value `true`."""
    if not obj:
        return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(EXEMPT_LABEL, "")).lower() == "true"


class Exemptions:
    """A guard: skips any action on an exempt target (or a pod in an exempt namespace).

    Pods are checked against their namespace only when `namespace_labels` is given (the
    service then needs `namespaces.get`).
    """

    name = "exempt"
    stage = Stage.EXEMPTIONS

    def __init__(self, namespace_labels: NamespaceLabels | None = None) -> None:
        self.namespace_labels = namespace_labels

    async def exempt_reason(self, obj: dict[str, Any] | None) -> str | None:
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        kind = obj.get("kind", "object")
        if is_exempt(obj):
            return f"{kind} {meta.get('name')} is labelled {EXEMPT_LABEL}=true"
        namespace = meta.get("namespace")
        if namespace and self.namespace_labels is not None:
            labels = await self.namespace_labels(namespace)
            if str(labels.get(EXEMPT_LABEL, "")).lower() == "true":
                return f"namespace {namespace} is labelled {EXEMPT_LABEL}=true"
        return None

    async def check(self, proposal: Proposal) -> Verdict | None:
        reason = await self.exempt_reason(proposal.obj)
        if reason is None:
            return None
        return Verdict(self.name, f"skipped: {reason}", Outcome.SKIPPED)


class SkippedNamespaces:
    """A guard: skips every protective action on an object in one of `namespaces`
    (the platform's own: kube-system, nodeward, ...), whatever its labels say."""

    name = "skipped_namespace"
    stage = Stage.EXEMPTIONS

    def __init__(self, namespaces: Iterable[str], *, setting: str) -> None:
        self.namespaces = frozenset(namespaces)
        self.setting = setting

    async def check(self, proposal: Proposal) -> Verdict | None:
        namespace = proposal.target.namespace
        if not proposal.protective or namespace not in self.namespaces:
            return None
        return Verdict(
            self.name, f"skipped: namespace {namespace} is in {self.setting}", Outcome.SKIPPED
        )
