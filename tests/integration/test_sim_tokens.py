"""The sim cluster issues and reviews ServiceAccount tokens as kube-apiserver does.

Sources: `pkg/registry/core/serviceaccount/storage/token.go` (`TokenREST.Create`),
`pkg/apis/authentication/validation` (`ValidateTokenRequest`), `pkg/serviceaccount/claims.go`
(`Claims`, `validator.Validate`) and `jwt.go` (`jwtTokenAuthenticator`),
`pkg/registry/authentication/tokenreview/storage.go`, `staging/src/k8s.io/apiserver/pkg/
authentication/serviceaccount/util.go` (the user's groups and extra), the bearer-token
authenticator (`invalid bearer token`) and kube-apiserver's 10 s token success cache.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from kubernetes import client, config

from sim.cluster import SimCluster, tokens
from sim.cluster.kubelet import EXITS_AFTER
from tests.conftest import wait_for
from tests.helpers.kube import manifest
from tests.integration.simkube import run_kubectl, sim_http

T = TypeVar("T")
NS = "ml-nlp"
NODE = "gpu-h100-01"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
PODS = f"/api/v1/namespaces/{NS}/pods"
NO_CACHE = pytest.mark.sim_cluster(token_cache_ttl=0)


def _token_path(account: str = "default", namespace: str = NS) -> str:
    return f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"


def _pod(name: str, *, account: str | None = None, exits: float | None = None) -> Any:
    meta: dict[str, Any] = {"name": name}
    if exits is not None:
        meta["annotations"] = {EXITS_AFTER: str(exits)}
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "containers": [{"name": "main", "image": "busybox:1.36"}],
    }
    if account:
        spec["serviceAccountName"] = account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _request(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def _pod_ref(name: str, uid: str | None = None) -> dict[str, Any]:
    ref = {"kind": "Pod", "apiVersion": "v1", "name": name}
    return ref | {"uid": uid} if uid else ref


def _decode(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def _claims(token: str) -> dict[str, Any]:
    return _decode(token.split(".")[1])  # type: ignore[no-any-return]


def _as(sim: SimCluster, token: str) -> httpx.AsyncClient:
    """HTTPS to the sim with `token` as the bearer."""
    context = ssl.create_default_context(cadata=sim.tls.ca_pem.decode())
    return httpx.AsyncClient(
        base_url=sim.url, verify=context, headers={"Authorization": f"Bearer {token}"}
    )


async def _make_pod(http: httpx.AsyncClient, name: str, **kw: Any) -> dict[str, Any]:
    made = await http.post(PODS, json=_pod(name, **kw))
    assert made.status_code == 201, made.text
    return made.json()  # type: ignore[no-any-return]


async def _token(http: httpx.AsyncClient, account: str = "default", **spec: Any) -> str:
    answer = await http.post(_token_path(account), json=_request(**spec))
    assert answer.status_code == 201, answer.text
    return str(answer.json()["status"]["token"])


async def _review(
    http: httpx.AsyncClient, token: str, audiences: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    answer = await http.post(REVIEWS, json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"] == spec
    return answer.json()["status"]  # type: ignore[no-any-return]


async def _gone(http: httpx.AsyncClient, path: str) -> bool:
    return (await http.get(path)).status_code == 404


async def test_a_pod_bound_token_reviews_as_its_account_pod_and_node(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        pod = await _make_pod(http, "agent")
        account = (await http.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")).json()
        node = (await http.get(f"/api/v1/nodes/{NODE}")).json()
        answer = await http.post(
            _token_path(),
            json=_request(audiences=["nats"], boundObjectRef=_pod_ref("agent")),
        )
        assert answer.status_code == 201, answer.text
        issued = answer.json()
        token = issued["status"]["token"]
        status = await _review(http, token, ["nats"])
    assert issued["kind"] == "TokenRequest"
    assert issued["apiVersion"] == "authentication.k8s.io/v1"
    meta = issued["metadata"]
    assert (meta["name"], meta["namespace"]) == ("default", NS)
    assert meta["uid"] == account["metadata"]["uid"]
    assert issued["spec"] == {
        "audiences": ["nats"],
        "expirationSeconds": 3600,
        "boundObjectRef": _pod_ref("agent"),
    }
    header_part, payload_part, signature_part = token.split(".")
    header, claims = _decode(header_part), _decode(payload_part)
    # a real JWT: RS256, the key id the API server derives, a signature the key verifies
    assert header == {"alg": "RS256", "kid": sim.tokens.kid}
    public = serialization.load_pem_public_key(sim.tokens.public_key_pem())
    assert isinstance(public, rsa.RSAPublicKey)
    public.verify(
        base64.urlsafe_b64decode(signature_part + "=" * (-len(signature_part) % 4)),
        f"{header_part}.{payload_part}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    assert list(claims) == sorted(claims), "go-jose writes the merged claims as a map"
    assert claims["iss"] == tokens.ISSUER
    assert claims["sub"] == f"system:serviceaccount:{NS}:default"
    assert claims["aud"] == ["nats"]
    assert claims["exp"] - claims["iat"] == 3600 and claims["nbf"] == claims["iat"]
    assert len(claims["jti"]) == 36
    assert claims["kubernetes.io"] == {
        "namespace": NS,
        "serviceaccount": {"name": "default", "uid": account["metadata"]["uid"]},
        "pod": {"name": "agent", "uid": pod["metadata"]["uid"]},
        "node": {"name": NODE, "uid": node["metadata"]["uid"]},
    }
    assert issued["status"]["expirationTimestamp"].endswith("Z")
    assert status == {
        "authenticated": True,
        "user": {
            "username": f"system:serviceaccount:{NS}:default",
            "uid": account["metadata"]["uid"],
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NS}",
                "system:authenticated",
            ],
            "extra": {
                "authentication.kubernetes.io/credential-id": [f"JTI={claims['jti']}"],
                "authentication.kubernetes.io/node-name": [NODE],
                "authentication.kubernetes.io/node-uid": [node["metadata"]["uid"]],
                "authentication.kubernetes.io/pod-name": ["agent"],
                "authentication.kubernetes.io/pod-uid": [pod["metadata"]["uid"]],
            },
        },
        "audiences": ["nats"],
    }


async def test_a_token_for_another_audience_is_not_authenticated(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _make_pod(http, "agent")
        token = await _token(http, audiences=["nats"], boundObjectRef=_pod_ref("agent"))
        wrong = await _review(http, token, ["vault", "consul"])
        implicit = await _review(http, token)  # the API server's own audience
        api_token = await _token(http, boundObjectRef=_pod_ref("agent"))
        for_api = await _review(http, api_token)
    assert wrong == {
        "user": {},
        "error": 'token audiences ["nats"] is invalid for the target audiences ["vault" "consul"]',
    }
    assert implicit["error"] == (
        f'token audiences ["nats"] is invalid for the target audiences ["{tokens.ISSUER}"]'
    )
    assert "authenticated" not in implicit, "false is left out, as Go's omitempty does"
    assert for_api["authenticated"] is True and for_api["audiences"] == [tokens.ISSUER]


async def test_the_token_of_a_deleted_pod_is_refused_once_the_cache_lets_go(
    sim: SimCluster,
) -> None:
    """kube-apiserver caches a token that authenticated for 10 s: its pod's removal is seen
    when that lapses (here the sim's token clock is moved on past it)."""
    async with sim_http(sim) as http:
        await _make_pod(http, "agent", exits=0.05)
        token = await _token(http, audiences=["nats"], boundObjectRef=_pod_ref("agent"))
        assert (await _review(http, token, ["nats"]))["authenticated"] is True
        assert (await http.delete(f"{PODS}/agent")).status_code == 200
        await wait_for(lambda: _gone(http, f"{PODS}/agent"), timeout=20, what="the kubelet")
        cached = await _review(http, token, ["nats"])
        assert cached["authenticated"] is True, "the success cached within 10 s"
        sim.tokens.advance(tokens.CACHE_TTL)
        refused = await _review(http, token, ["nats"])
    assert refused == {"user": {}, "error": "service account token has been invalidated"}


@NO_CACHE
async def test_a_terminating_pod_keeps_its_token_for_a_minute_past_its_deletion(
    sim: SimCluster,
) -> None:
    """`validator.Validate`: a bound pod whose deletionTimestamp is more than 60 s past."""
    async with sim_http(sim) as http:
        await _make_pod(http, "slow", exits=30)
        token = await _token(http, audiences=["nats"], boundObjectRef=_pod_ref("slow"))
        deleting = await http.delete(f"{PODS}/slow")
        assert deleting.json()["metadata"]["deletionGracePeriodSeconds"] == 30
        assert (await http.get(f"{PODS}/slow")).status_code == 200, "Terminating"
        assert (await _review(http, token, ["nats"]))["authenticated"] is True
        sim.tokens.advance(30 + 50)  # 50 s past the deletionTimestamp
        assert (await _review(http, token, ["nats"]))["authenticated"] is True
        sim.tokens.advance(15)
        refused = await _review(http, token, ["nats"])
        await http.delete(f"{PODS}/slow", params={"gracePeriodSeconds": "0"})
    assert refused["error"] == "service account token has been invalidated"


@NO_CACHE
async def test_a_pod_made_again_under_the_same_name_does_not_inherit_the_token(
    sim: SimCluster,
) -> None:
    async with sim_http(sim) as http:
        first = await _make_pod(http, "agent")
        token = await _token(http, audiences=["nats"], boundObjectRef=_pod_ref("agent"))
        await http.delete(f"{PODS}/agent", params={"gracePeriodSeconds": "0"})
        second = await _make_pod(http, "agent")
        refused = await _review(http, token, ["nats"])
    old, new = first["metadata"]["uid"], second["metadata"]["uid"]
    assert old != new
    assert refused == {
        "user": {},
        "error": f"pod UID ({new}) does not match service account pod ref claim ({old})",
    }


@NO_CACHE
async def test_an_expired_token_is_refused_after_the_leeway(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _make_pod(http, "agent")
        token = await _token(
            http, audiences=["nats"], expirationSeconds=600, boundObjectRef=_pod_ref("agent")
        )
        claims = _claims(token)
        assert claims["exp"] - claims["iat"] == 600
        sim.tokens.advance(630)  # expired, within go-jose's 60 s leeway
        assert (await _review(http, token, ["nats"]))["authenticated"] is True
        sim.tokens.advance(60)
        refused = await _review(http, token, ["nats"])
        async with _as(sim, token) as holder:
            unauthorized = await holder.get(PODS)
    assert refused == {"user": {}, "error": "service account token has expired"}
    assert unauthorized.status_code == 401
    assert unauthorized.json()["reason"] == "Unauthorized"


async def test_token_requests_are_refused_as_the_api_server_refuses_them(
    sim: SimCluster,
) -> None:
    async with sim_http(sim) as http:
        pod = await _make_pod(http, "agent")
        await http.post(
            f"/api/v1/namespaces/{NS}/serviceaccounts",
            json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot"}},
        )
        await _make_pod(http, "robots", account="robot")

        async def ask(body: dict[str, Any], account: str = "default") -> httpx.Response:
            return await http.post(_token_path(account), json=body)

        short = await ask(_request(expirationSeconds=599))
        huge = await ask(_request(expirationSeconds=(1 << 32) + 1))
        missing_pod = await ask(_request(boundObjectRef=_pod_ref("ghost")))
        other_account = await ask(_request(boundObjectRef=_pod_ref("robots")))
        stale_uid = await ask(_request(boundObjectRef=_pod_ref("agent", "not-its-uid")))
        config_map = await ask(
            _request(boundObjectRef={"kind": "ConfigMap", "apiVersion": "v1", "name": "x"})
        )
        deployment = await ask(
            _request(boundObjectRef={"kind": "Deployment", "apiVersion": "apps/v1", "name": "x"})
        )
        no_account = await ask(_request(), account="nobody")
        renamed = await ask(_request() | {"metadata": {"name": "other"}})
        right_uid = await ask(_request(boundObjectRef=_pod_ref("agent", pod["metadata"]["uid"])))
        read = await http.get(_token_path())
    assert short.status_code == 422
    assert short.json()["message"] == (
        'TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid '
        "value: 599: may not specify a duration less than 10 minutes"
    )
    assert short.json()["details"] == {
        "group": "authentication.k8s.io",
        "kind": "TokenRequest",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 599: may not specify a duration less than 10 minutes",
                "field": "spec.expirationSeconds",
            }
        ],
    }
    assert huge.status_code == 422
    assert "may not specify a duration larger than 2^32 seconds" in huge.json()["message"]
    assert missing_pod.status_code == 404
    assert missing_pod.json()["message"] == 'pods "ghost" not found'
    assert missing_pod.json()["details"] == {"name": "ghost", "kind": "pods"}
    assert other_account.status_code == 400
    assert other_account.json()["message"] == (
        'cannot bind token for serviceaccount "default" to pod running with different '
        "serviceaccount name."
    )
    assert stale_uid.status_code == 409
    assert stale_uid.json()["message"] == (
        'Operation cannot be fulfilled on Pod "agent": the UID in the bound object reference '
        "(not-its-uid) does not match the UID in record. The object might have been deleted "
        "and then recreated"
    )
    assert config_map.status_code == 400
    assert config_map.json()["message"] == "cannot bind token to object of type /v1, Kind=ConfigMap"
    assert deployment.json()["message"] == (
        "cannot bind token to object of type apps/v1, Kind=Deployment"
    )
    assert no_account.status_code == 404
    assert no_account.json()["message"] == 'serviceaccounts "nobody" not found'
    assert renamed.status_code == 422
    assert renamed.json()["message"] == (
        'TokenRequest.authentication.k8s.io "default" is invalid: metadata.name: Invalid '
        'value: "other": must match the service account name if specified'
    )
    assert right_uid.status_code == 201
    assert read.status_code == 405


async def test_a_pods_own_token_is_its_account_against_the_api(sim: SimCluster) -> None:
    """The bearer authenticator takes the sim's ServiceAccount tokens, and RBAC decides:
    TokenReview needs `create` on `tokenreviews`, as anything else."""
    async with sim_http(sim) as http:
        await _make_pod(http, "agent")
        token = sim.pod_token(NS, "agent")
        async with _as(sim, token) as agent:
            pods = await agent.get(PODS)
            denied = await agent.post(REVIEWS, json={"spec": {"token": token}})
            mint = await agent.post(_token_path(), json=_request())
            whoami = await agent.post(
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )
            binding = manifest(
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                "agent-delegates",
                roleRef={
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                subjects=[{"kind": "ServiceAccount", "name": "default", "namespace": NS}],
            )
            granted = await http.post(
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", json=binding
            )
            assert granted.status_code == 201, granted.text
            allowed = await agent.post(REVIEWS, json={"spec": {"token": token}})
    user = f"system:serviceaccount:{NS}:default"
    assert pods.status_code == 403
    assert pods.json()["message"] == (
        f'pods is forbidden: User "{user}" cannot list resource "pods" in API group "" in the '
        f'namespace "{NS}"'
    )
    assert denied.status_code == 403
    assert denied.json()["message"] == (
        f'tokenreviews.authentication.k8s.io is forbidden: User "{user}" cannot create '
        'resource "tokenreviews" in API group "authentication.k8s.io" at the cluster scope'
    )
    assert mint.status_code == 403
    assert 'cannot create resource "serviceaccounts/token"' in mint.json()["message"]
    info = whoami.json()["status"]["userInfo"]
    assert info["username"] == user
    assert info["extra"]["authentication.kubernetes.io/pod-name"] == ["agent"]
    assert info["extra"]["authentication.kubernetes.io/node-name"] == [NODE]
    assert allowed.status_code == 201
    assert allowed.json()["status"]["user"]["username"] == user


async def test_the_kubelets_token_lives_a_year_with_a_warning_after_an_hour(
    sim: SimCluster,
) -> None:
    """`--service-account-extend-token-expiration`: a pod-bound token for the API server
    asking 3607 s (the `kube-api-access` volume) lives a year, with `warnafter`."""
    async with sim_http(sim) as http:
        await _make_pod(http, "agent")
        kubelets = _claims(sim.pod_token(NS, "agent"))
        projected = _claims(sim.pod_token(NS, "agent", audience="nats"))
        answer = await http.post(
            _token_path(), json=_request(expirationSeconds=3607, boundObjectRef=_pod_ref("agent"))
        )
    assert kubelets["exp"] - kubelets["iat"] == tokens.EXTENDED_EXPIRATION
    assert kubelets["kubernetes.io"]["warnafter"] == kubelets["iat"] + 3607
    assert projected["exp"] - projected["iat"] == 3600
    assert "warnafter" not in projected["kubernetes.io"]
    assert answer.json()["spec"]["expirationSeconds"] == 3607, "the status says what was asked"


@NO_CACHE
async def test_tokens_bound_to_a_node_a_secret_or_nothing(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        joined = await http.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "j"}}
        )
        secret = await http.post(
            f"/api/v1/namespaces/{NS}/secrets",
            json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
        )
        on_node = await _token(
            http, boundObjectRef={"kind": "Node", "apiVersion": "v1", "name": "j"}
        )
        on_secret = await _token(
            http, boundObjectRef={"kind": "Secret", "apiVersion": "v1", "name": "s"}
        )
        unbound = await _token(http)
        node_user = (await _review(http, on_node))["user"]
        secret_user = (await _review(http, on_secret))["user"]
        unbound_user = (await _review(http, unbound))["user"]
        await http.delete("/api/v1/nodes/j")
        await http.delete(f"/api/v1/namespaces/{NS}/secrets/s")
        node_gone = await _review(http, on_node)
        secret_gone = await _review(http, on_secret)
        still = await _review(http, unbound)
    node_uid = joined.json()["metadata"]["uid"]
    assert _claims(on_node)["kubernetes.io"]["node"] == {"name": "j", "uid": node_uid}
    assert _claims(on_secret)["kubernetes.io"]["secret"] == {
        "name": "s",
        "uid": secret.json()["metadata"]["uid"],
    }
    assert set(node_user["extra"]) == {
        "authentication.kubernetes.io/credential-id",
        "authentication.kubernetes.io/node-name",
        "authentication.kubernetes.io/node-uid",
    }
    assert node_user["extra"]["authentication.kubernetes.io/node-uid"] == [node_uid]
    assert (
        set(secret_user["extra"])
        == set(unbound_user["extra"])
        == {"authentication.kubernetes.io/credential-id"}
    )
    assert node_gone["error"] == secret_gone["error"] == tokens.INVALIDATED
    assert still["authenticated"] is True


@NO_CACHE
async def test_a_deleted_or_remade_account_and_a_forged_token(sim: SimCluster) -> None:
    accounts = f"/api/v1/namespaces/{NS}/serviceaccounts"
    robot = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot"}}
    async with sim_http(sim) as http:
        await http.post(accounts, json=robot)
        token = await _token(http, "robot")
        await http.delete(f"{accounts}/robot")
        deleted = await _review(http, token)
        remade = (await http.post(accounts, json=robot)).json()
        recreated = await _review(http, token)
        old_uid = _claims(token)["kubernetes.io"]["serviceaccount"]["uid"]
        header, payload, signature = (await _token(http, "robot")).split(".")
        tampered = f"{header}.{payload}.{signature[:-6]}AAAAAA"
        # the same issuer, another key: what a token of another cluster is
        other = tokens.Tokens(sim.store, sim.apis.minor)
        foreign = other.request(NS, "robot", {"spec": {}})["status"]["token"]
        garbage = await _review(http, "not-a-token")
        forged = await _review(http, tampered)
        unknown_key = await _review(http, foreign)
        admin = await _review(http, sim.identities["admin"].token)
    assert deleted == {"user": {}, "error": 'serviceaccounts "robot" not found'}
    assert recreated["error"] == (
        f"service account UID ({remade['metadata']['uid']}) does not match claim ({old_uid})"
    )
    assert garbage == {"user": {}, "error": "invalid bearer token"}
    assert forged["error"] == "go-jose/go-jose: error in cryptographic primitive"
    assert unknown_key["error"] == "invalid signature, no keys found"
    assert admin["authenticated"] is True
    assert admin["user"]["username"] == "nodeward-admin"


async def test_discovery_lists_the_token_subresource_and_tokenreviews(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        core = (await http.get("/api/v1")).json()["resources"]
        authn = (await http.get("/apis/authentication.k8s.io/v1")).json()["resources"]

    def listed(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
        return next(r for r in resources if r["name"] == name)

    def create_only(name: str, singular: str, kind: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "singularName": singular, "kind": kind, "verbs": ["create"], **more}

    assert listed(core, "serviceaccounts/token") == create_only(
        "serviceaccounts/token",
        "",
        "TokenRequest",
        namespaced=True,
        group="authentication.k8s.io",
        version="v1",
    )
    assert listed(authn, "tokenreviews") == create_only(
        "tokenreviews", "tokenreview", "TokenReview", namespaced=False
    )


@pytest.mark.sim_cluster(kube_version="1.29")
async def test_a_1_29_server_issues_no_jti_and_no_node(sim: SimCluster) -> None:
    """JTI and the pod's node in its token: beta, on by default, from 1.30 (KEP-4193)."""
    async with sim_http(sim) as http:
        await _make_pod(http, "agent")
        token = await _token(http, boundObjectRef=_pod_ref("agent"))
        status = await _review(http, token)
        on_node = await http.post(
            _token_path(), json=_request(boundObjectRef={"kind": "Node", "name": NODE})
        )
    assert "jti" not in _claims(token) and "node" not in _claims(token)["kubernetes.io"]
    assert set(status["user"]["extra"]) == {
        "authentication.kubernetes.io/pod-name",
        "authentication.kubernetes.io/pod-uid",
    }
    assert on_node.status_code == 400
    assert on_node.json()["message"] == (
        'cannot bind token to a Node object as the "ServiceAccountTokenNodeBinding" '
        "feature-gate is disabled"
    )


@pytest.mark.sim_cluster(kube_version="1.21")
async def test_a_1_21_server_still_serves_the_beta_token_review(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        token = await _token(http)
        beta = await http.post(
            "/apis/authentication.k8s.io/v1beta1/tokenreviews",
            json={"apiVersion": "authentication.k8s.io/v1beta1", "spec": {"token": token}},
        )
    assert beta.status_code == 201
    assert beta.json()["apiVersion"] == "authentication.k8s.io/v1beta1"
    assert beta.json()["status"]["authenticated"] is True


async def _call(fn: Callable[[], T]) -> T:
    """The official client is synchronous; the sim runs on this loop."""
    return await asyncio.to_thread(fn)


async def test_the_official_client_requests_and_reviews_tokens(
    sim: SimCluster, tmp_path: Path
) -> None:
    async with sim_http(sim) as http:
        pod = await _make_pod(http, "agent")
    path = str(sim.write_kubeconfig(tmp_path / "kc"))
    api = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
    core, authn = client.CoreV1Api(api), client.AuthenticationV1Api(api)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=["nats"],
            expiration_seconds=1200,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name="agent"
            ),
        )
    )
    issued: Any = await _call(
        lambda: core.create_namespaced_service_account_token("default", NS, request)
    )
    review = client.V1TokenReview(
        spec=client.V1TokenReviewSpec(token=issued.status.token, audiences=["nats"])
    )
    reviewed: Any = await _call(lambda: authn.create_token_review(review))
    refused: Any = await _call(
        lambda: authn.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=issued.status.token))
        )
    )
    assert issued.spec.expiration_seconds == 1200
    assert issued.status.expiration_timestamp is not None
    assert reviewed.status.authenticated is True
    assert reviewed.status.user.extra["authentication.kubernetes.io/pod-uid"] == [
        pod["metadata"]["uid"]
    ]
    assert not refused.status.authenticated
    assert "is invalid for the target audiences" in refused.status.error


async def test_kubectl_create_token(sim: SimCluster, tmp_path: Path) -> None:
    async with sim_http(sim) as http:
        pod = await _make_pod(http, "agent")

    async def create_token(*flags: str) -> tuple[int, str, str]:
        return await run_kubectl(sim, tmp_path, "create", "token", "default", "-n", NS, *flags)

    rc, out, err = await create_token()
    assert rc == 0, err
    plain = _claims(out.strip())
    bound_to = ("--bound-object-kind", "Pod", "--bound-object-name")
    rc, out, err = await create_token("--duration", "20m", "--audience", "nats", *bound_to, "agent")
    assert rc == 0, err
    bound = _claims(out.strip())
    too_short = await create_token("--duration", "5m")
    ghost = await create_token(*bound_to, "ghost")
    assert plain["aud"] == [tokens.ISSUER] and plain["exp"] - plain["iat"] == 3600
    assert bound["aud"] == ["nats"] and bound["exp"] - bound["iat"] == 1200
    assert bound["kubernetes.io"]["pod"] == {"name": "agent", "uid": pod["metadata"]["uid"]}
    assert bound["kubernetes.io"]["node"]["name"] == NODE
    assert too_short[0] != 0
    assert "may not specify a duration less than 10 minutes" in too_short[2]
    assert ghost[0] != 0 and 'pods "ghost" not found' in ghost[2]
