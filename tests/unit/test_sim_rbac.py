"""The sim cluster's RBAC: where its roles come from, and the rules review it answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.cluster import rbac
from tests.helpers.rbac import by_resource

REPO = Path(__file__).resolve().parents[2]


def _objects(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return by_resource(docs, ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"))


def test_the_source_trees_deploy_rbac_is_the_default() -> None:
    assert rbac.default_rbac_dir() == REPO / "deploy" / "rbac"


def test_rules_review_of_a_service_account() -> None:
    objects = _objects(rbac.bootstrap_manifests() + rbac.load_manifests([REPO / "deploy" / "rbac"]))
    cordon = rbac.service_account_identity("nodeward", "nodeward-cordon", "cordon")
    status = rbac.review_status(cordon, "nodeward", objects)
    assert status["incomplete"] is False
    assert {
        "verbs": ["get", "list", "patch", "watch"],
        "apiGroups": [""],
        "resources": ["nodes"],
    } in status["resourceRules"]
    assert not any("secrets" in r["resources"] for r in status["resourceRules"])
    assert {
        "verbs": ["create"],
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["selfsubjectreviews"],
    } in status["resourceRules"]
    urls = {u for r in status["nonResourceRules"] for u in r["nonResourceURLs"]}
    assert {"/api", "/apis/*", "/openapi/*", "/healthz", "/version"} <= urls


def test_role_bindings_count_in_their_namespace_only() -> None:
    objects = _objects(rbac.load_manifests([REPO / "deploy" / "rbac"]))
    creds = rbac.service_account_identity("nodeward", "nodeward-credentials", "credentials")
    lease = rbac.Request("update", "coordination.k8s.io", "leases", "", "nodeward", "")
    assert rbac.authorize(creds, lease, objects)
    elsewhere = rbac.Request("update", "coordination.k8s.io", "leases", "", "ml-nlp", "")
    assert not rbac.authorize(creds, elsewhere, objects)
    in_ns = rbac.review_status(creds, "nodeward", objects)["resourceRules"]
    cluster_wide = rbac.review_status(creds, "", objects)["resourceRules"]
    assert any("leases" in r["resources"] for r in in_ns)
    assert not any("leases" in r["resources"] for r in cluster_wide)


def test_non_resource_urls_match_exactly_or_by_prefix() -> None:
    objects = _objects(rbac.bootstrap_manifests())
    anyone = rbac.service_account_identity("nodeward", "nodeward-notifier", "notifier")
    assert rbac.authorize_path(anyone, "get", "/api", objects)
    assert rbac.authorize_path(anyone, "get", "/apis/apps/v1", objects)
    assert rbac.authorize_path(anyone, "get", "/openapi/v3/api/v1", objects)
    assert not rbac.authorize_path(anyone, "post", "/api", objects)
    assert not rbac.authorize_path(anyone, "get", "/metrics", objects)
    assert rbac.authorize_path(rbac.admin_identity(), "get", "/metrics", objects)


def test_the_admin_is_listed_with_cluster_admin() -> None:
    objects = _objects(rbac.bootstrap_manifests())
    status = rbac.review_status(rbac.admin_identity(), "default", objects)
    assert {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]} in status["resourceRules"]
    assert {"verbs": ["*"], "nonResourceURLs": ["*"]} in status["nonResourceRules"]
