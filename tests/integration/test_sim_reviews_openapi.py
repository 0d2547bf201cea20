"""The sim cluster's self reviews and OpenAPI, through the official Python client and plain HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

from sim.cluster import SimCluster, openapi
from sim.cluster.resources import require
from tests.integration.simkube import sim_http

T = TypeVar("T")


def _api(sim: SimCluster, tmp_path: Path, identity: str = "admin") -> client.ApiClient:
    path = sim.write_kubeconfig(tmp_path / f"kubeconfig-{identity}", identity=identity)
    return config.new_client_from_config(config_file=str(path))


async def _call(fn: Callable[[], T]) -> T:
    """The official client is synchronous; the sim runs on this loop."""
    return await asyncio.to_thread(fn)


async def test_rules_review_lists_what_rbac_grants(sim: SimCluster, tmp_path: Path) -> None:
    auth = client.AuthorizationV1Api(_api(sim, tmp_path, "cordon"))
    review = client.V1SelfSubjectRulesReview(
        spec=client.V1SelfSubjectRulesReviewSpec(namespace="nodeward")
    )
    result = await _call(lambda: auth.create_self_subject_rules_review(review))
    assert result.status.incomplete is False
    rules = {
        (tuple(r.api_groups), tuple(r.resources)): r.verbs for r in result.status.resource_rules
    }
    assert rules[(("",), ("nodes",))] == ["get", "list", "patch", "watch"]
    assert not any("secrets" in resources for _, resources in rules)
    # the attribute's Python name differs between client versions; its JSON name does not
    attr = next(
        a for a, j in client.V1NonResourceRule.attribute_map.items() if j == "nonResourceURLs"
    )
    urls = {u for r in result.status.non_resource_rules for u in getattr(r, attr)}
    assert {"/api", "/openapi/*", "/version"} <= urls


async def test_self_subject_review_names_the_caller(sim: SimCluster, tmp_path: Path) -> None:
    authn = client.AuthenticationV1Api(_api(sim, tmp_path, "culler"))
    result = await _call(lambda: authn.create_self_subject_review(client.V1SelfSubjectReview()))
    user = result.status.user_info
    assert user.username == "system:serviceaccount:nodeward:nodeward-culler"
    assert user.groups == [
        "system:serviceaccounts",
        "system:serviceaccounts:nodeward",
        "system:authenticated",
    ]
    account = sim.store.find(require("", "v1", "serviceaccounts"), "nodeward", "nodeward-culler")
    assert account is not None and user.uid == account["metadata"]["uid"]
    async with sim_http(sim, "culler") as http:  # off by default from 1.29
        beta = await http.post(
            "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1beta1", "kind": "SelfSubjectReview"},
        )
    assert beta.status_code == 404


@pytest.mark.sim_cluster(kube_version="1.28")
async def test_a_1_28_server_answers_the_beta_review_kubectl_1_27_asks(sim: SimCluster) -> None:
    """authentication.k8s.io/v1beta1 SelfSubjectReview: beta in 1.27, served to 1.28."""
    async with sim_http(sim, "culler") as http:
        beta = await http.post(
            "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1beta1", "kind": "SelfSubjectReview"},
        )
    assert beta.status_code == 201
    assert beta.json()["apiVersion"] == "authentication.k8s.io/v1beta1"
    user = beta.json()["status"]["userInfo"]["username"]
    assert user == "system:serviceaccount:nodeward:nodeward-culler"


async def test_access_review_of_a_non_resource_url(sim: SimCluster) -> None:
    async with sim_http(sim, "cordon") as http:

        async def can(verb: str, path: str) -> dict[str, Any]:
            r = await http.post(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                json={"spec": {"nonResourceAttributes": {"verb": verb, "path": path}}},
            )
            assert r.status_code == 201, r.text
            return r.json()["status"]  # type: ignore[no-any-return]

        allowed = await can("get", "/openapi/v2")
        assert allowed["allowed"] is True
        assert allowed["reason"] == (
            'RBAC: allowed by ClusterRoleBinding "system:discovery" of ClusterRole '
            '"system:discovery" to Group "system:authenticated"'
        )
        assert (await can("post", "/api"))["allowed"] is False
        neither = await http.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json={"spec": {}}
        )
    assert neither.status_code == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes" in neither.json()["message"]


async def test_reviews_and_discovery_follow_the_rbac_in_the_store(sim: SimCluster) -> None:
    async with sim_http(sim) as admin, sim_http(sim, "cordon") as cordon:
        review = {"spec": {"namespace": "nodeward"}}
        rules_url = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
        assert (await cordon.post(rules_url, json=review)).status_code == 201
        # a binding to a role that is not there: the list says it may be incomplete
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "dangling", "namespace": "nodeward"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gone"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "nodeward-cordon", "namespace": "nodeward"}
            ],
        }
        created = await admin.post(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/nodeward/rolebindings", json=binding
        )
        assert created.status_code == 201, created.text
        status = (await cordon.post(rules_url, json=review)).json()["status"]
        assert status["incomplete"] is True
        assert 'role.rbac.authorization.k8s.io "gone" not found' in status["evaluationError"]
        # without the default bindings, a service account may neither review nor discover
        for name in ("system:basic-user", "system:discovery"):
            gone = await admin.delete(
                f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}"
            )
            assert gone.status_code == 200, gone.text
        denied = await cordon.post(rules_url, json=review)
        assert denied.status_code == 403
        assert 'cannot create resource "selfsubjectrulesreviews"' in denied.json()["message"]
        hidden = await cordon.get("/openapi/v2")
        assert hidden.status_code == 403
        assert hidden.json()["message"] == (
            'forbidden: User "system:serviceaccount:nodeward:nodeward-cordon" cannot get path '
            '"/openapi/v2"'
        )
        assert (await cordon.get("/version")).status_code == 200
        assert (await admin.get("/apis")).status_code == 200


async def test_openapi_v2_is_negotiated_and_cached(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        as_json = await http.get("/openapi/v2", headers={"Accept": "application/json"})
        assert as_json.status_code == 200
        assert as_json.headers["Content-Type"] == "application/json"
        doc = as_json.json()
        assert doc["swagger"] == "2.0"
        pod = doc["definitions"]["io.k8s.api.core.v1.Pod"]
        assert pod["x-kubernetes-group-version-kind"] == [
            {"group": "", "kind": "Pod", "version": "v1"}
        ]
        # kubectl asks for protobuf only, with its own spelling of the media type
        as_pb = await http.get("/openapi/v2", headers={"Accept": openapi.V2_PROTOBUF_ASKED})
        assert as_pb.status_code == 200
        assert as_pb.headers["Content-Type"] == openapi.V2_PROTOBUF
        assert as_pb.content[:5] == b"\x0a\x032.0"  # Document.swagger = "2.0"
        assert (await http.get("/openapi/v2", headers={"Accept": "text/html"})).status_code == 406
        etag = as_json.headers["ETag"]
        again = await http.get(
            "/openapi/v2", headers={"Accept": "application/json", "If-None-Match": etag}
        )
        assert again.status_code == 304


async def test_openapi_v3_documents_by_hash(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        index = (await http.get("/openapi/v3")).json()["paths"]
        url = index["apis/policy/v1"]["serverRelativeURL"]
        doc = await http.get(url)
        assert doc.status_code == 200
        assert doc.headers["Cache-Control"] == "public, immutable"
        schemas = doc.json()["components"]["schemas"]
        assert "io.k8s.api.policy.v1.PodDisruptionBudget" in schemas
        stale = await http.get("/openapi/v3/apis/policy/v1?hash=0123")
        assert stale.status_code == 301
        assert stale.headers["Location"] == url
        assert (await http.get("/openapi/v3/apis/nothing/v1")).status_code == 404


async def test_a_second_request_during_the_build_waits_for_it(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        first, second = await asyncio.gather(http.get("/openapi/v3"), http.get("/openapi/v2"))
    assert (first.status_code, second.status_code) == (200, 200)


async def test_a_metadata_only_list_as_client_gos_metadata_client_asks(
    sim: SimCluster, tmp_path: Path
) -> None:
    """`Accept: application/json;as=PartialObjectMetadataList;...` gets the list's metadata
    alone; the breaker counts nodes with it (`Nodes.count`)."""
    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster
    from nodeward.kube.client import METADATA_LIST, KubeClient

    async with sim_http(sim) as http:
        full = (await http.get("/api/v1/nodes")).json()
        reply = await http.get("/api/v1/nodes", headers={"Accept": METADATA_LIST})
    assert reply.status_code == 200
    body = reply.json()
    assert (body["kind"], body["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert [i["metadata"]["name"] for i in body["items"]] == [
        i["metadata"]["name"] for i in full["items"]
    ]
    assert all(set(i) == {"kind", "apiVersion", "metadata"} for i in body["items"])
    assert {i["kind"] for i in body["items"]} == {"PartialObjectMetadata"}
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig-cordon", identity="cordon")
    cluster = Cluster(KubeClient.from_settings(ClusterSettings(kubeconfig=kubeconfig)))
    try:
        gpu = "nvidia.com/gpu.present=true"
        assert await cluster.nodes.count(label_selector=gpu) == len(
            await cluster.nodes.list(label_selector=gpu)
        )
        assert await cluster.nodes.count() == len(full["items"])
    finally:
        await cluster.close()


async def test_a_metadata_only_watch_sends_no_secret_data(sim: SimCluster, tmp_path: Path) -> None:
    """A watch with `Accept: application/json;as=PartialObjectMetadata;...` (client-go's
    metadata informer, the admission webhook's Secret cache) gets each object as its metadata
    alone, as kube-apiserver transforms watch events: a Secret's data never travels."""
    from nodeward.config import ClusterSettings
    from nodeward.kube.client import METADATA_ONLY, KubeClient

    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig-watch")
    client = KubeClient.from_settings(ClusterSettings(kubeconfig=kubeconfig))
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "cc", "namespace": "default", "labels": {"k": "v"}},
        "stringData": {"krb5cc": "the-ticket-itself"},
    }
    seen: list[dict[str, Any]] = []
    try:
        listed = await client.request("GET", "/api/v1/namespaces/default/secrets")
        rv = listed["metadata"]["resourceVersion"]
        await client.request("POST", "/api/v1/namespaces/default/secrets", body=secret)
        stream = client.stream(
            "/api/v1/namespaces/default/secrets",
            query={"watch": "true", "resourceVersion": rv},
            read_timeout=10,
            accept=METADATA_ONLY,
        )
        async for event in stream:
            seen.append(event)
            if event["object"]["metadata"].get("name") == "cc":
                break
    finally:
        await client.close()
    obj = seen[-1]["object"]
    assert (seen[-1]["type"], obj["kind"], obj["apiVersion"]) == (
        "ADDED",
        "PartialObjectMetadata",
        "meta.k8s.io/v1",
    )
    assert set(obj) == {"kind", "apiVersion", "metadata"}
    assert obj["metadata"]["labels"] == {"k": "v"}
    assert "the-ticket-itself" not in str(seen) and "dGhlLXRpY2tldC" not in str(seen)
