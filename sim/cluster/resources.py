"""The resource types the sim cluster serves, and the discovery documents that describe them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_RW = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives, its kind, and what it supports."""

    group: str
    versions: tuple[str, ...]
    resource: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    fields: frozenset[str] = field(default_factory=frozenset)
    categories: tuple[str, ...] = ()
    custom: bool = False
    storage: tuple[str, str] | None = None  # another resource whose store this one shares
    verbs: tuple[str, ...] = _RW

    @property
    def version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        v = version or self.version
        return f"{self.group}/{v}" if self.group else v

    @property
    def key(self) -> tuple[str, str]:
        return self.storage or (self.group, self.resource)


_POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
_NEW_EVENT_FIELDS = frozenset(
    {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "reason",
        "reportingController",
        "type",
    }
)

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        ("v1",),
        "namespaces",
        "Namespace",
        False,
        ("ns",),
        ("status",),
        frozenset({"status.phase"}),
    ),
    ResourceType(
        "",
        ("v1",),
        "nodes",
        "Node",
        False,
        ("no",),
        ("status", "proxy"),
        frozenset({"spec.unschedulable"}),
    ),
    ResourceType(
        "", ("v1",), "pods", "Pod", True, ("po",), ("status", "eviction"), _POD_FIELDS, ("all",)
    ),
    ResourceType(
        "",
        ("v1",),
        "events",
        "Event",
        True,
        ("ev",),
        (),
        _EVENT_FIELDS,
        storage=("events.k8s.io", "events"),
    ),
    ResourceType("", ("v1",), "secrets", "Secret", True, (), (), frozenset({"type"})),
    ResourceType("", ("v1",), "serviceaccounts", "ServiceAccount", True, ("sa",), ("token",)),
    ResourceType("", ("v1",), "configmaps", "ConfigMap", True, ("cm",)),
    ResourceType(
        "", ("v1",), "services", "Service", True, ("svc",), ("status",), categories=("all",)
    ),
    ResourceType(
        "apps", ("v1",), "daemonsets", "DaemonSet", True, ("ds",), ("status",), categories=("all",)
    ),
    ResourceType(
        "apps",
        ("v1",),
        "deployments",
        "Deployment",
        True,
        ("deploy",),
        ("status",),
        categories=("all",),
    ),
    ResourceType(
        "apps",
        ("v1",),
        "replicasets",
        "ReplicaSet",
        True,
        ("rs",),
        ("status",),
        categories=("all",),
    ),
    ResourceType(
        "apps",
        ("v1",),
        "statefulsets",
        "StatefulSet",
        True,
        ("sts",),
        ("status",),
        categories=("all",),
    ),
    ResourceType(
        "batch",
        ("v1",),
        "jobs",
        "Job",
        True,
        (),
        ("status",),
        frozenset({"status.successful"}),
        categories=("all",),
    ),
    ResourceType(
        "policy",
        ("v1", "v1beta1"),
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ("pdb",),
        ("status",),
    ),
    ResourceType("events.k8s.io", ("v1",), "events", "Event", True, ("ev",), (), _NEW_EVENT_FIELDS),
    ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease", True),
    ResourceType(
        "networking.k8s.io", ("v1",), "networkpolicies", "NetworkPolicy", True, ("netpol",)
    ),
    # resource.k8s.io (DRA): ResourceSlices in v1 (and v1beta2, the same shape),
    # DeviceTaintRules in v1, v1beta2 and v1alpha3; which of them a release serves, and with
    # what enabled, is `versions.SERVED`'s. Both cluster-scoped.
    ResourceType(
        "resource.k8s.io",
        ("v1", "v1beta2"),
        "resourceslices",
        "ResourceSlice",
        False,
        (),
        (),
        frozenset({"spec.nodeName", "spec.driver"}),
    ),
    ResourceType(
        "resource.k8s.io",
        ("v1", "v1beta2", "v1alpha3"),
        "devicetaintrules",
        "DeviceTaintRule",
        False,
        (),
        ("status",),
    ),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "clusterroles", "ClusterRole", False),
    ResourceType(
        "rbac.authorization.k8s.io", ("v1",), "clusterrolebindings", "ClusterRoleBinding", False
    ),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "roles", "Role", True),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "rolebindings", "RoleBinding", True),
    # dynamic admission (`sim.cluster.webhooks`): v1 since 1.16
    ResourceType(
        "admissionregistration.k8s.io",
        ("v1",),
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        ("v1",),
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
    ),
    ResourceType(
        "kubeflow.org", ("v1",), "notebooks", "Notebook", True, (), ("status",), custom=True
    ),
    ResourceType(
        "authorization.k8s.io",
        ("v1",),
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        False,
        verbs=("create",),
    ),
    ResourceType(
        "authorization.k8s.io",
        ("v1",),
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        False,
        verbs=("create",),
    ),
    # v1beta1 too: kubectl 1.27 (`auth whoami` in beta) asks for it.
    ResourceType(
        "authentication.k8s.io",
        ("v1", "v1beta1"),
        "selfsubjectreviews",
        "SelfSubjectReview",
        False,
        verbs=("create",),
    ),
    # v1beta1 too: served up to 1.21.
    ResourceType(
        "authentication.k8s.io",
        ("v1", "v1beta1"),
        "tokenreviews",
        "TokenReview",
        False,
        verbs=("create",),
    ),
)
REVIEWS = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"})


def lookup(group: str, version: str, resource: str) -> ResourceType | None:
    for rt in RESOURCES:
        if rt.group == group and rt.resource == resource and version in rt.versions:
            return rt
    return None


def by_key(key: tuple[str, str]) -> ResourceType | None:
    """The served resource stored under `key` (group, resource)."""
    exact = (rt for rt in RESOURCES if (rt.group, rt.resource) == key)
    return next(exact, None) or next((rt for rt in RESOURCES if rt.key == key), None)


def require(group: str, version: str, resource: str) -> ResourceType:
    """The resource type, which must be served."""
    rt = lookup(group, version, resource)
    if rt is None:
        raise KeyError(f"{group}/{version}/{resource} is not served")
    return rt


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    group, _, version = api_version.rpartition("/")
    for rt in RESOURCES:
        if rt.group == group and rt.kind == kind and version in rt.versions:
            return rt
    return None


def resource_entry(rt: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": rt.resource,
        "singularName": rt.kind.lower(),
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    return entry


def _sub_entry(
    name: str, namespaced: bool, kind: str, verbs: list[str], group: str = ""
) -> dict[str, Any]:
    """A subresource's discovery entry; `group` names another group's kind (its v1)."""
    entry: dict[str, Any] = {"name": name, "singularName": "", "namespaced": namespaced}
    if group:
        entry |= {"group": group, "version": "v1"}
    return entry | {"kind": kind, "verbs": verbs}


def sub_entries(rt: ResourceType) -> list[dict[str, Any]]:
    out = []
    for sub in rt.subresources:
        if sub == "status":
            verbs = ["get", "patch", "update"]
            out.append(_sub_entry(f"{rt.resource}/status", rt.namespaced, rt.kind, verbs))
        elif sub == "eviction":
            out.append(_sub_entry("pods/eviction", True, "Eviction", ["create"], "policy"))
        elif sub == "token":
            group = "authentication.k8s.io"
            out.append(_sub_entry("serviceaccounts/token", True, "TokenRequest", ["create"], group))
        elif sub == "proxy":
            verbs = ["create", "delete", "get", "patch", "update"]
            out.append(_sub_entry("nodes/proxy", False, "NodeProxyOptions", verbs))
    return out


def api_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }
