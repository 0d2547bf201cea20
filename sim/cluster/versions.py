"""The Kubernetes version the sim cluster claims, and exactly the group-versions it serves.

A real API server serves a resource in a group-version when its release has it and its
configuration enables it (`kube-apiserver`'s `DefaultAPIResourceConfigSource` in
`pkg/controlplane/apiserver/options`, `--runtime-config`, `--feature-gates`). Since 1.24 a
beta group-version introduced after it is off by default (KEP-3136), and alpha ones always
are. `SERVED` writes, for each (group, version, resource) the sim can serve, the minor
releases that have it and what must be enabled for it to be served; `Apis` answers for one
release and one set of enabled names, and makes the discovery documents from it.

Sources, by entry: the API's `zz_generated.prerelease-lifecycle.go` (introduced and removed
releases) and the release notes' deprecation guide (policy/v1beta1 PodDisruptionBudget
removed in 1.25; admissionregistration.k8s.io/v1 webhook configurations GA in 1.16;
authentication.k8s.io/v1beta1 TokenReview removed in 1.22, its
SelfSubjectReview off by default from 1.29); DRA's KEP-4381
(resource.k8s.io/v1 GA and on in 1.34, v1beta1 (1.32) and v1beta2 (1.33) beta and off by
default) and KEP-5055 (DeviceTaintRule: v1alpha3 from 1.33, v1beta2 from 1.36, both behind
the `DRADeviceTaints` gate; the 1.37 API, as the client's release-1.37 models have it, adds
it to v1, still gated).

The sim's object schemas remain those of the installed `kubernetes` client's models, whose
release is the default version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sim.cluster.resources import RESOURCES, ResourceType, resource_entry, sub_entries

OLDEST = 20
"""The oldest minor release the sim will claim (kubectl 1.20 is the oldest client tested)."""

DRA_TAINTS = "DRADeviceTaints"
DEFAULT_ENABLED = frozenset({DRA_TAINTS})
"""What the sim's cluster is configured with beyond a release's defaults: the device-taint
gate, as a GPU platform that quarantines single DRA devices runs. Its alpha and beta
versions still need their runtime-config (`resource.k8s.io/v1alpha3`, ...)."""


@dataclass(frozen=True)
class Served:
    """One resource in one group-version: the minor releases that have it (inclusive), and
    the feature gates and runtime-config group-versions it needs besides."""

    group: str
    version: str
    resource: str
    since: int = 0
    until: int | None = None
    needs: tuple[str, ...] = ()

    def in_release(self, minor: int) -> bool:
        return self.since <= minor and (self.until is None or minor <= self.until)


def _always(group: str, version: str, *names: str, since: int = 0) -> list[Served]:
    return [Served(group, version, n, since) for n in names]


SERVED: tuple[Served, ...] = (
    *_always(
        "",
        "v1",
        "namespaces",
        "nodes",
        "pods",
        "events",
        "secrets",
        "serviceaccounts",
        "configmaps",
        "services",
    ),
    *_always("apps", "v1", "daemonsets", "deployments", "replicasets", "statefulsets", since=9),
    *_always("batch", "v1", "jobs"),
    Served("policy", "v1", "poddisruptionbudgets", 21),
    Served("policy", "v1beta1", "poddisruptionbudgets", 5, until=24),
    Served("events.k8s.io", "v1", "events", 19),
    Served("coordination.k8s.io", "v1", "leases", 14),
    Served("networking.k8s.io", "v1", "networkpolicies", 7),
    Served("resource.k8s.io", "v1", "resourceslices", 34),
    Served("resource.k8s.io", "v1beta2", "resourceslices", 33, needs=("resource.k8s.io/v1beta2",)),
    Served(
        "resource.k8s.io",
        "v1",
        "devicetaintrules",
        37,
        needs=(DRA_TAINTS,),
    ),
    Served(
        "resource.k8s.io",
        "v1beta2",
        "devicetaintrules",
        36,
        needs=(DRA_TAINTS, "resource.k8s.io/v1beta2"),
    ),
    Served(
        "resource.k8s.io",
        "v1alpha3",
        "devicetaintrules",
        33,
        needs=(DRA_TAINTS, "resource.k8s.io/v1alpha3"),
    ),
    *_always(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
        since=8,
    ),
    *_always(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        since=16,
    ),
    *_always("kubeflow.org", "v1", "notebooks"),  # a CRD: served wherever it is installed
    *_always("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "selfsubjectrulesreviews"),
    Served("authentication.k8s.io", "v1", "selfsubjectreviews", 28),
    Served("authentication.k8s.io", "v1beta1", "selfsubjectreviews", 27, until=28),
    Served("authentication.k8s.io", "v1", "tokenreviews", 6),
    Served("authentication.k8s.io", "v1beta1", "tokenreviews", 3, until=21),
)


def client_release() -> int:
    """The minor release of the installed `kubernetes` client's models (client 37.x is
    Kubernetes 1.37): the sim's default, since its schemas come from those models."""
    import kubernetes

    return int(str(kubernetes.__version__).split(".")[0])


def parse_version(text: str) -> int:
    """The minor release of `1.33`, `v1.33` or `v1.33.2`; ValueError otherwise or when the
    sim cannot claim it."""
    m = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?", text.strip())
    if m is None:
        raise ValueError(f"not a Kubernetes version: {text!r} (expected e.g. 1.33)")
    minor, newest = int(m.group(1)), client_release()
    if not OLDEST <= minor <= newest:
        raise ValueError(
            f"the sim cluster serves Kubernetes 1.{OLDEST} to 1.{newest} (its client's "
            f"models), not 1.{minor}"
        )
    return minor


class Apis:
    """What an API server of release `1.<minor>` with `enabled` gates and runtime-config
    serves, and its discovery documents."""

    def __init__(self, minor: int | None = None, enabled: Iterable[str] | None = None) -> None:
        self.minor = client_release() if minor is None else minor
        self.enabled = DEFAULT_ENABLED if enabled is None else frozenset(enabled)
        on = {
            (s.group, s.version, s.resource)
            for s in SERVED
            if s.in_release(self.minor) and all(n in self.enabled for n in s.needs)
        }
        self._on = frozenset(on)
        # (type, version) pairs served, in RESOURCES' order: a version's preferred first
        self.served: tuple[tuple[ResourceType, str], ...] = tuple(
            (rt, v) for rt in RESOURCES for v in rt.versions if (rt.group, v, rt.resource) in on
        )
        self.groups: dict[str, tuple[str, ...]] = {}
        for rt, v in self.served:
            if rt.group and v not in self.groups.get(rt.group, ()):
                self.groups[rt.group] = (*self.groups.get(rt.group, ()), v)

    @property
    def git_version(self) -> str:
        return f"v1.{self.minor}.0"

    def serves(self, group: str, version: str, resource: str) -> bool:
        return (group, version, resource) in self._on

    def version_info(self) -> dict[str, str]:
        """`/version`, as `version.Info`."""
        return {
            "major": "1",
            "minor": str(self.minor),
            "emulationMajor": "1",
            "emulationMinor": str(self.minor),
            "minCompatibilityMajor": "1",
            "minCompatibilityMinor": str(self.minor - 1),
            "gitVersion": self.git_version,
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-08-26T00:00:00Z",
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        """`APIResourceList` for one group version, or None if not served."""
        items = [rt for rt, v in self.served if rt.group == group and v == version]
        if not items:
            return None
        listed: list[dict[str, Any]] = []
        for rt in items:
            listed.append(resource_entry(rt))
            listed.extend(sub_entries(rt))
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": listed,
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.groups.get(group)
        if not versions:
            return None
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": gvs,
            "preferredVersion": gvs[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [g for g in (self.api_group(name) for name in self.groups) if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
