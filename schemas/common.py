"""Value objects shared by several event types, and the Kubernetes name rules.

Node, namespace and pod names become subject tokens and KV keys, so they are checked here,
at the contract, with the Kubernetes rules (RFC 1123): a node or pod name is a DNS
subdomain (at most 253 characters of `[a-z0-9.-]`, dot-separated labels that start and end
with a letter or digit), a namespace a DNS label (at most 63 of `[a-z0-9-]`). An event
naming anything else (`gpu-*`, `>`, `a b`) is refused by `nodeward publish` and
dead-lettered as invalid on the bus, never half-processed.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

from schemas.base import EventData, Model
from schemas.tokens import subject

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL = re.compile(DNS_LABEL_PATTERN)
_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)


def _kubernetes_name(value: str, most: int, rule: re.Pattern[str], says: str) -> str:
    """`value` if it has at most `most` characters and matches `rule`, else ValueError."""
    if len(value) <= most and rule.match(value):
        return value
    raise ValueError(f"{value[:80]!r} is not a Kubernetes name (RFC 1123 {says})")


def dns_label(value: str) -> str:
    """`value` if it is an RFC 1123 DNS label (a Kubernetes namespace), else ValueError."""
    says = "label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit"
    return _kubernetes_name(value, 63, _LABEL, says)


def dns_subdomain(value: str) -> str:
    """`value` if it is an RFC 1123 DNS subdomain (a node or pod name), else ValueError."""
    says = (
        "subdomain: at most 253 of a-z, 0-9, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit"
    )
    return _kubernetes_name(value, 253, _SUBDOMAIN, says)


# Validated with a one-line message; the JSON Schema carries the same rule as a pattern.
K8sName = Annotated[
    str,
    AfterValidator(dns_subdomain),
    Field(json_schema_extra={"pattern": DNS_SUBDOMAIN_PATTERN, "maxLength": 253}),
]
Namespace = Annotated[
    str,
    AfterValidator(dns_label),
    Field(json_schema_extra={"pattern": DNS_LABEL_PATTERN, "maxLength": 63}),
]
NodeName = K8sName
PodName = K8sName
# An action's target, built by a service from the API server's own objects (never from a
# publisher's words); any kind, so only bounded. Its subject token is sanitised.
ObjectName = Annotated[str, StringConstraints(min_length=1, max_length=253)]
NonNegFloat = Annotated[float, Field(ge=0)]


class PodRef(Model):
    """A pod (and optionally one container) an event concerns."""

    namespace: Namespace
    name: PodName
    container: str | None = None
    uid: str | None = None


class ObjectRef(Model):
    """Any Kubernetes object an action targets."""

    kind: str = Field(min_length=1)
    name: ObjectName
    namespace: str | None = None
    api_version: str | None = None

    def key(self) -> str:
        """`kind/namespace/name`, or `kind/name` for cluster-scoped objects."""
        parts = [self.kind.lower(), self.namespace, self.name]
        return "/".join(p for p in parts if p)


class PodEventData(EventData):
    """Base of an event about one pod on one node: published on `SUBJECT_PATTERN`, which
    ends `.<node>.<ns>.<pod>`; its CloudEvents subject is `pod/<ns>/<pod>`."""

    namespace: Namespace
    pod: PodName
    node: NodeName

    def nats_subject(self) -> str:
        prefix = self.SUBJECT_PATTERN.removesuffix(".<node>.<ns>.<pod>")
        return subject(prefix, self.node, self.namespace, self.pod)

    def about(self) -> str:
        return f"pod/{self.namespace}/{self.pod}"
