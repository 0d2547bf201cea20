"""Each service's declared port operations against its role in deploy/rbac, both ways.

Adding a call to a service means declaring the operation in its package's `access.py`
(the port refuses undeclared ones); declaring it without widening the role fails here, and
widening a role beyond what the service declares fails here too. The declarations are
collected by the composition root (`launch.access`); node agents share the `agent` account.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from launch.access import ACCOUNTS, DECLARED, GRANTS, READERS
from nodeward.kube import access
from nodeward.plugin import services
from sim.cluster import rbac
from tests.helpers.rbac import by_resource

RBAC_DIR = Path(__file__).resolve().parents[2] / "deploy" / "rbac"


@pytest.fixture(scope="module")
def objects() -> dict[str, list[dict[str, Any]]]:
    return by_resource(rbac.load_manifests([RBAC_DIR]))


def _identity(service: str) -> rbac.Identity:
    return rbac.service_account_identity(
        access.SERVICE_NAMESPACE, access.service_account(service), service
    )


def _request(p: access.Permission, namespace: str) -> rbac.Request:
    resource, _, sub = p.resource.partition("/")
    return rbac.Request(p.verb, p.group, resource, sub, namespace, "")


def test_every_service_has_a_service_account_and_nothing_else_does(
    objects: dict[str, list[dict[str, Any]]],
) -> None:
    accounts = {
        (a["metadata"]["namespace"], a["metadata"]["name"]) for a in objects["serviceaccounts"]
    }
    assert accounts == {(access.SERVICE_NAMESPACE, access.service_account(s)) for s in ACCOUNTS}


@pytest.mark.parametrize("service", sorted(ACCOUNTS))
def test_role_grants_every_call_the_service_makes(
    service: str, objects: dict[str, list[dict[str, Any]]]
) -> None:
    ident = _identity(service)
    missing = [
        p
        for p in sorted(ACCOUNTS[service].permissions())
        if not rbac.authorize(ident, _request(p, p.namespace or ""), objects)
    ]
    assert not missing, f"deploy/rbac/{service}.yaml does not grant: {missing}"


@pytest.mark.parametrize("service", sorted(ACCOUNTS))
def test_role_grants_nothing_the_service_does_not_call(
    service: str, objects: dict[str, list[dict[str, Any]]]
) -> None:
    account = access.service_account(service)
    needed = {(p.group, p.resource, p.verb, p.namespace) for p in ACCOUNTS[service].permissions()}
    granted: set[tuple[str, str, str, str | None]] = set()
    for kind, role_kind in (("clusterrolebindings", "ClusterRole"), ("rolebindings", "Role")):
        for binding in objects.get(kind, []):
            if not any(
                s.get("kind") == "ServiceAccount" and s.get("name") == account
                for s in binding["subjects"]
            ):
                continue
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace") if kind == "rolebindings" else None
            pool = (
                objects["clusterroles"]
                if ref["kind"] == "ClusterRole"
                else [
                    r
                    for r in objects.get("roles", [])
                    if r["metadata"].get("namespace") == namespace
                ]
            )
            assert ref["kind"] == role_kind or kind == "rolebindings"
            role = next(r for r in pool if r["metadata"]["name"] == ref["name"])
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], f"{service}: wildcard {field} in {ref['name']}"
                assert not rule.get("nonResourceURLs"), (
                    f"{service}: nonResourceURLs in {ref['name']}"
                )
                granted |= {
                    (g, r, v, namespace)
                    for g in rule["apiGroups"]
                    for r in rule["resources"]
                    for v in rule["verbs"]
                }
    extra = sorted(granted - needed, key=str)
    assert not extra, f"deploy/rbac/{service}.yaml grants more than {service} calls: {extra}"


def test_services_declare_only_known_operations_and_every_operation_is_a_method() -> None:
    for declared in DECLARED:
        assert declared.operations <= set(access.OPERATIONS), declared.account
    marked: set[str] = set()
    from nodeward.kube import (
        checkpoints,
        devices,
        events,
        leases,
        namespaces,
        netpol,
        nodes,
        notebooks,
        pods,
        reviews,
        secrets,
        workloads,
    )

    for module in (
        nodes,
        pods,
        events,
        secrets,
        notebooks,
        netpol,
        leases,
        checkpoints,
        namespaces,
        devices,
        reviews,
        workloads,
    ):
        for obj in vars(module).values():
            if isinstance(obj, type):
                for attr in vars(obj).values():
                    if name := getattr(attr, "__nodeward_operation__", None):
                        marked.add(name)
    assert marked == set(access.OPERATIONS), (
        "every operation is implemented by some port method, and only those"
    )


def test_a_call_outside_the_role_is_denied_like_a_real_cluster(
    objects: dict[str, list[dict[str, Any]]],
) -> None:
    ident = _identity("culler")
    req = rbac.Request("patch", "", "nodes", "", "", "gpu-1")
    assert not rbac.authorize(ident, req, objects)
    assert rbac.forbidden_message(ident, req) == (
        'nodes "gpu-1" is forbidden: User "system:serviceaccount:nodeward:nodeward-culler" cannot patch '
        'resource "nodes" in API group "" at the cluster scope'
    )
    lease = rbac.Request("update", "coordination.k8s.io", "leases", "", "ml-nlp", "x")
    assert not rbac.authorize(ident, lease, objects), (
        "the lease Role is only bound in the nodeward namespace"
    )


def test_roles_built_from_the_table_equal_the_deploy_files(
    objects: dict[str, list[dict[str, Any]]],
) -> None:
    """What the sim cluster uses when deploy/rbac is not at hand grants exactly the same."""
    built = by_resource(rbac.manifests_from_access(DECLARED))
    probes = [
        rbac.Request(verb, group, resource, sub, ns, "")
        for group, resource, sub in (
            ("", "nodes", ""),
            ("", "nodes", "status"),
            ("", "nodes", "proxy"),
            ("", "pods", ""),
            ("", "pods", "eviction"),
            ("", "secrets", ""),
            ("events.k8s.io", "events", ""),
            ("kubeflow.org", "notebooks", ""),
            ("networking.k8s.io", "networkpolicies", ""),
            ("coordination.k8s.io", "leases", ""),
            ("authentication.k8s.io", "tokenreviews", ""),
            ("resource.k8s.io", "resourceslices", ""),
            ("resource.k8s.io", "devicetaintrules", ""),
        )
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete")
        for ns in ("", "nodeward", "ml-nlp")
    ]
    for service in ACCOUNTS:
        ident = _identity(service)
        for probe in probes:
            assert rbac.authorize(ident, probe, objects) == rbac.authorize(ident, probe, built), (
                service,
                probe,
            )


def test_every_service_declares_its_access_under_the_name_it_runs_as() -> None:
    """A service added without an access.py (or not collected by launch.access) fails here."""
    plugins = {p.name: p for p in services()}
    assert set(GRANTS) == set(plugins) - READERS
    assert set(plugins) >= READERS
    for name, plugin in plugins.items():
        if plugin.access is None:
            assert name in READERS
            continue
        declared = plugin.load(plugin.access).ACCESS
        module = plugin.ref(plugin.standalone).split(":")[0]
        assert declared.account == importlib.import_module(module).NAME == name
        assert ACCOUNTS[name].operations == declared.operations
