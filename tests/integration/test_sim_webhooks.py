"""The sim cluster calls admission webhooks as kube-apiserver does (`sim.cluster.webhooks`).

Each test runs a real HTTPS webhook server (aiohttp, a certificate from the sim's own CA
helper) and registers it with a MutatingWebhookConfiguration or a
ValidatingWebhookConfiguration, by URL or, as the Helm chart does, by Service. Sources:
`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/` (`mutating/dispatcher.go`,
`generic/webhook.go`, `predicates/`, `errors/statuserror.go`, `request/admissionreview.go`)
and `pkg/apis/admissionregistration/{v1/defaults.go,validation/validation.go}`.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from sim.cluster import SimCluster, resources
from sim.cluster.tls import ServingCert, make_serving_cert
from tests.conftest import wait_for
from tests.integration.simkube import fast_admin_client, run_kubectl, sim_http

Obj = dict[str, Any]
Answer = Callable[[Obj], Obj | Awaitable[Obj]]
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
NS = "ml-nlp"
SERVICE = ("hooks", "nodeward-admission")  # namespace, name
PODS = resources.require("", "v1", "pods")
POD_CREATE = {
    "operations": ["CREATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
}


class Webhook:
    """A webhook server on loopback: `answers[path]` answers each AdmissionReview POSTed to
    `/<path>`; `reviews` keeps (path, review) of every one received."""

    def __init__(self, cert: ServingCert) -> None:
        self.cert = cert
        self.answers: dict[str, Answer] = {}
        self.reviews: list[tuple[str, Obj]] = []
        self.released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.cert.ca_pem).decode()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}/{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{path}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.cert.ssl_context())
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self.released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        review = await request.json()
        self.reviews.append((path, review))
        answer = self.answers[path](review)
        if inspect.isawaitable(answer):
            answer = await answer
        return web.json_response(answer)

    def seen(self, path: str) -> list[Obj]:
        return [r["request"] for p, r in self.reviews if p == path]


def allow(review: Obj, patch: list[Obj] | None = None, **response: Any) -> Obj:
    """An AdmissionReview answer allowing the request, with a JSONPatch if given."""
    out: Obj = {"uid": review["request"]["uid"], "allowed": True, **response}
    if patch is not None:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": out}


def deny(review: Obj, status: Obj) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": False, "status": status},
    }


def hook(name: str, client: Obj, *, rules: list[Obj] | None = None, **more: Any) -> Obj:
    return {
        "name": name,
        "clientConfig": client,
        "rules": rules if rules is not None else [POD_CREATE],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **more,
    }


def configuration(kind: str, name: str, *hooks: Obj) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": list(hooks),
    }


def pod(name: str, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    server = Webhook(make_serving_cert(f"{SERVICE[1]}.{SERVICE[0]}.svc"))
    await server.start()
    yield server
    await server.stop()


async def register(http: httpx.AsyncClient, path: str, body: Obj) -> Obj:
    made = await http.post(path, json=body)
    assert made.status_code == 201, made.text
    return dict(made.json())


async def mutating(http: httpx.AsyncClient, name: str, *hooks: Obj) -> Obj:
    """Register a MutatingWebhookConfiguration `name` of `hooks`; the object made."""
    return await register(
        http, MUTATING, configuration("MutatingWebhookConfiguration", name, *hooks)
    )


async def validating(http: httpx.AsyncClient, name: str, *hooks: Obj) -> Obj:
    """Register a ValidatingWebhookConfiguration `name` of `hooks`; the object made."""
    return await register(
        http, VALIDATING, configuration("ValidatingWebhookConfiguration", name, *hooks)
    )


def url_client(server: Webhook, path: str) -> Obj:
    return {"url": server.url(path), "caBundle": server.ca_bundle}


async def test_configurations_get_the_api_servers_defaults_and_validation(
    sim: SimCluster, webhook: Webhook, tmp_path: Path
) -> None:
    async with sim_http(sim) as http:
        made = await mutating(http, "defaults", hook("a.nodeward.test", url_client(webhook, "a")))
        h = made["webhooks"][0]
        assert (h["failurePolicy"], h["matchPolicy"], h["reinvocationPolicy"]) == (
            "Fail",
            "Equivalent",
            "Never",
        )
        assert (h["timeoutSeconds"], h["namespaceSelector"], h["objectSelector"]) == (10, {}, {})
        assert h["rules"][0]["scope"] == "*"
        service = {"service": {"namespace": "hooks", "name": "x"}}
        made = await validating(http, "svc", hook("b.nodeward.test", service))
        assert made["webhooks"][0]["clientConfig"]["service"]["port"] == 443
        assert "reinvocationPolicy" not in made["webhooks"][0]

        async def refused(body: Obj) -> Obj:
            answer = await http.post(MUTATING, json=body)
            assert answer.status_code == 422, answer.text
            return dict(answer.json())

        bad = hook("c.nodeward.test", url_client(webhook, "c"))
        del bad["sideEffects"]
        said = await refused(configuration("MutatingWebhookConfiguration", "bad", bad))
        assert said["message"] == (
            'MutatingWebhookConfiguration.admissionregistration.k8s.io "bad" is invalid: '
            "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"
        )
        assert said["details"]["causes"] == [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: must specify one of None, NoneOnDryRun",
                "field": "webhooks[0].sideEffects",
            }
        ]
        for change, field, message in (
            (
                {"timeoutSeconds": 31},
                "webhooks[0].timeoutSeconds",
                "Invalid value: 31: the timeout value must be between 1 and 30 seconds",
            ),
            (
                {"sideEffects": "Some"},
                "webhooks[0].sideEffects",
                'Unsupported value: "Some": supported values: "None", "NoneOnDryRun"',
            ),
            (
                {"admissionReviewVersions": []},
                "webhooks[0].admissionReviewVersions",
                "Required value: must specify one of v1, v1beta1",
            ),
            (
                {
                    "clientConfig": {
                        "url": webhook.url("c"),
                        "service": {"namespace": "a", "name": "b"},
                    }
                },
                "webhooks[0].clientConfig",
                "Required value: exactly one of url or service is required",
            ),
            (
                {"clientConfig": {"url": "http://127.0.0.1:1/x"}},
                "webhooks[0].clientConfig.url",
                "Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]",
            ),
            (
                {"name": "short"},
                "webhooks[0].name",
                'Invalid value: "short": should be a domain with at least three segments separated by dots',
            ),
        ):
            body = configuration(
                "MutatingWebhookConfiguration",
                "bad",
                hook("c.nodeward.test", url_client(webhook, "c")) | change,
            )
            said = await refused(body)
            assert [(c["field"], c["message"]) for c in said["details"]["causes"]] == [
                (field, message)
            ]
        twice = configuration(
            "MutatingWebhookConfiguration",
            "twice",
            hook("d.nodeward.test", url_client(webhook, "d")),
            hook("d.nodeward.test", url_client(webhook, "d")),
        )
        said = await refused(twice)
        assert said["details"]["causes"][0]["message"] == 'Duplicate value: "d.nodeward.test"'
        cel = hook(
            "e.nodeward.test",
            url_client(webhook, "e"),
            matchConditions=[{"name": "x", "expression": "true"}],
        )
        answer = await http.post(
            MUTATING, json=configuration("MutatingWebhookConfiguration", "cel", cel)
        )
        assert answer.status_code == 400 and "matchConditions (CEL)" in answer.json()["message"]
    rc, out, err = await run_kubectl(
        sim, tmp_path, "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations"
    )
    assert rc == 0, err
    rows = [line.split()[:2] for line in out.splitlines()]
    assert ["NAME", "WEBHOOKS"] in rows  # the API server's columns for them
    assert ["mutatingwebhookconfiguration.admissionregistration.k8s.io/defaults", "1"] in rows
    assert ["validatingwebhookconfiguration.admissionregistration.k8s.io/svc", "1"] in rows


async def test_a_pod_made_with_kubectl_and_with_the_python_client_gets_the_patch(
    sim: SimCluster, webhook: Webhook, tmp_path: Path
) -> None:
    def inject(review: Obj) -> Obj:
        labels = review["request"]["object"]["metadata"].get("labels")
        patch = [{"op": "add", "path": "/metadata/labels", "value": {}}] if not labels else []
        patch += [
            {"op": "add", "path": "/metadata/labels/injected", "value": "yes"},
            {
                "op": "add",
                "path": "/spec/containers/-",
                "value": {"name": "sidecar", "image": "sidecar:1"},
            },
        ]
        return allow(review, patch, warnings=["sidecar injected"])

    webhook.answers["inject"] = inject
    async with sim_http(sim) as http:
        await mutating(http, "inject", hook("inject.nodeward.test", url_client(webhook, "inject")))
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod("by-kubectl")))
    rc, _, err = await run_kubectl(sim, tmp_path, "create", "-n", NS, "-f", str(manifest))
    assert rc == 0, err
    assert "Warning: sidecar injected" in err
    client = fast_admin_client(sim, tmp_path, uuid.uuid4().hex[:6])
    try:
        created = await client.request(
            "POST", f"/api/v1/namespaces/{NS}/pods", body=pod("by-python", team="nlp")
        )
    finally:
        await client.close()
    assert created["metadata"]["labels"] == {"team": "nlp", "injected": "yes"}
    # the registry's PrepareForCreate after the webhooks: Pending, the QoS of both containers
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    for name in ("by-kubectl", "by-python"):
        stored = sim.store.get(PODS, NS, name)
        assert stored["metadata"]["labels"]["injected"] == "yes"
        sidecar = stored["spec"]["containers"][1]
        # defaulted again after the patch, as the server's scheme defaults do
        assert (
            sidecar["name"],
            sidecar["imagePullPolicy"],
            sidecar["terminationMessagePolicy"],
        ) == ("sidecar", "IfNotPresent", "File")
    request = webhook.seen("inject")[1]
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (
        request["requestKind"] == request["kind"]
        and request["requestResource"] == request["resource"]
    )
    assert (request["name"], request["namespace"], request["operation"]) == (
        "by-python",
        NS,
        "CREATE",
    )
    assert request["userInfo"]["username"] == sim.identities["admin"].user
    assert request["dryRun"] is False and request["oldObject"] is None
    assert request["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    obj = request["object"]
    # as a mutating webhook sees a pod on a cluster: before the registry's PrepareForCreate
    assert obj["metadata"]["creationTimestamp"] is None and "uid" not in obj["metadata"]
    assert obj["spec"]["serviceAccountName"] == "default"
    kubectl_request = webhook.seen("inject")[0]
    assert kubectl_request["options"]["fieldManager"] == "kubectl-create"


async def test_a_denial_is_the_api_servers_answer_and_kubectls_error(
    sim: SimCluster, webhook: Webhook, tmp_path: Path
) -> None:
    webhook.answers["deny"] = lambda review: deny(
        review, {"message": "pods named forbidden are not allowed"}
    )
    webhook.answers["deny-coded"] = lambda review: deny(
        review, {"code": 409, "reason": "Conflict", "message": "taken"}
    )
    async with sim_http(sim) as http:
        await mutating(http, "deny", hook("deny.nodeward.test", url_client(webhook, "deny")))
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("forbidden"))
        assert answer.status_code == 400
        # `ToStatusErr`: the webhook's status, its code at least 400, no reason given none
        assert answer.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'admission webhook "deny.nodeward.test" denied the request: pods named forbidden are not allowed',
            "code": 400,
        }
        manifest = tmp_path / "pod.json"
        manifest.write_text(json.dumps(pod("forbidden")))
        rc, _, err = await run_kubectl(sim, tmp_path, "create", "-n", NS, "-f", str(manifest))
        assert rc == 1
        assert err.strip() == (
            f'Error from server: error when creating "{manifest}": admission webhook '
            '"deny.nodeward.test" denied the request: pods named forbidden are not allowed'
        )
        await http.delete(f"{MUTATING}/deny")
        await validating(
            http, "coded", hook("coded.nodeward.test", url_client(webhook, "deny-coded"))
        )
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("forbidden"))
        assert answer.status_code == 409
        assert (
            answer.json()["message"]
            == 'admission webhook "coded.nodeward.test" denied the request: taken'
        )
        assert answer.json()["reason"] == "Conflict"
        assert (await http.get(f"/api/v1/namespaces/{NS}/pods/forbidden")).status_code == 404
        # the validating webhook saw the pod as it would be stored
        request = webhook.seen("deny-coded")[0]
        assert (
            request["object"]["metadata"]["uid"]
            and request["object"]["status"]["phase"] == "Pending"
        )


async def test_selectors_and_rules_decide_which_requests_a_webhook_sees(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["see"] = allow
    see = url_client(webhook, "see")
    everything = {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}
    async with sim_http(sim) as http:
        for name, labels in (("watched", {"webhooks": "on"}), ("quiet", {})):
            made = await http.post(
                "/api/v1/namespaces",
                json={
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels},
                },
            )
            assert made.status_code == 201
            # as the server sets it, what charts' namespaceSelectors exclude kube-system by
            assert made.json()["metadata"]["labels"]["kubernetes.io/metadata.name"] == name
        await mutating(
            http,
            "selectors",
            hook("ns.nodeward.test", see, namespaceSelector={"matchLabels": {"webhooks": "on"}}),
            hook(
                "obj.nodeward.test",
                see,
                objectSelector={
                    "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]
                },
            ),
            hook(
                "deploy.nodeward.test",
                see,
                rules=[
                    {
                        "operations": ["CREATE"],
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "resources": ["deployments"],
                    }
                ],
            ),
            hook(
                "status.nodeward.test",
                see,
                rules=[
                    {
                        "operations": ["UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods/status"],
                    }
                ],
            ),
            hook("cluster.nodeward.test", see, rules=[everything | {"scope": "Cluster"}]),
        )

        async def called_for(method: str, path: str, body: Obj | None = None) -> list[str]:
            before = len(sim.webhooks.calls)
            answer = await http.request(method, path, json=body)
            assert answer.status_code < 300, answer.text
            return [name for name, _ in list(sim.webhooks.calls)[before:]]

        assert await called_for("POST", "/api/v1/namespaces/watched/pods", pod("a")) == [
            "ns.nodeward.test"
        ]
        assert await called_for("POST", "/api/v1/namespaces/quiet/pods", pod("b")) == []
        assert await called_for("POST", "/api/v1/namespaces/quiet/pods", pod("c", app="web")) == [
            "obj.nodeward.test"
        ]
        # a namespace's own labels decide for its create; a cluster-scoped object always matches
        assert await called_for(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}},
        ) == ["cluster.nodeward.test"]
        status = (await http.get("/api/v1/namespaces/quiet/pods/b")).json()
        status["status"]["message"] = "hello"
        assert await called_for("PUT", "/api/v1/namespaces/quiet/pods/b/status", status) == [
            "status.nodeward.test"
        ]
        assert webhook.seen("see")[-1]["subResource"] == "status"
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": {"x": "y"}},
                "template": {
                    "metadata": {"labels": {"x": "y"}},
                    "spec": {"containers": [{"name": "m", "image": "busybox:1"}]},
                },
            },
        }
        assert await called_for(
            "POST", "/apis/apps/v1/namespaces/quiet/deployments", deployment
        ) == ["deploy.nodeward.test"]
        # a namespace that does not exist answers 404 once the rules match (`NamespaceLifecycle` first)
        answer = await http.post("/api/v1/namespaces/nowhere/pods", json=pod("d"))
        assert answer.status_code == 404


async def test_failure_policy_when_the_webhook_cannot_be_called(
    sim: SimCluster, webhook: Webhook
) -> None:
    await webhook.stop()  # nothing listens on its port any more
    down = url_client(webhook, "down")
    async with sim_http(sim) as http:
        await mutating(http, "down", hook("ignored.nodeward.test", down, failurePolicy="Ignore"))
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("goes-on"))
        assert made.status_code == 201, made.text
        await validating(http, "down", hook("failing.nodeward.test", down))
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("stopped"))
    assert answer.status_code == 500
    body = answer.json()
    message = (
        'failed calling webhook "failing.nodeward.test": failed to call webhook: Post '
        f'"{webhook.url("down")}?timeout=10s": dial tcp 127.0.0.1:{webhook.port}: connect: connection refused'
    )
    assert body["message"] == f"Internal error occurred: {message}"
    assert (body["reason"], body["details"]) == (
        "InternalError",
        {"causes": [{"message": message}]},
    )


async def test_a_webhook_past_its_timeout_fails_the_call(sim: SimCluster, webhook: Webhook) -> None:
    async def hang(review: Obj) -> Obj:
        await webhook.released.wait()
        return allow(review)

    webhook.answers["slow"] = hang
    async with sim_http(sim) as http:
        await mutating(
            http, "slow", hook("slow.nodeward.test", url_client(webhook, "slow"), timeoutSeconds=1)
        )
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("late"), timeout=20)
    assert answer.status_code == 500
    assert answer.json()["message"] == (
        'Internal error occurred: failed calling webhook "slow.nodeward.test": failed to call '
        f'webhook: Post "{webhook.url("slow")}?timeout=1s": context deadline exceeded'
    )


async def test_a_certificate_the_ca_bundle_does_not_sign_fails_tls(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["tls"] = allow
    other_ca = base64.b64encode(make_serving_cert("127.0.0.1").ca_pem).decode()
    async with sim_http(sim) as http:
        await mutating(
            http,
            "tls",
            hook("tls.nodeward.test", {"url": webhook.url("tls"), "caBundle": other_ca}),
        )
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("untrusted"))
    assert answer.status_code == 500
    assert answer.json()["message"].endswith(
        "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    )
    assert webhook.reviews == []


async def test_a_webhook_if_needed_is_called_again_after_a_later_change(
    sim: SimCluster, webhook: Webhook
) -> None:
    def first(review: Obj) -> Obj:
        labels = review["request"]["object"]["metadata"].get("labels") or {}
        seen = ",".join(sorted(labels))
        return allow(
            review, [{"op": "add", "path": "/metadata/annotations", "value": {"first-saw": seen}}]
        )

    def second(review: Obj) -> Obj:
        return allow(review, [{"op": "add", "path": "/metadata/labels/second", "value": "yes"}])

    webhook.answers |= {"first": first, "second": second}
    async with sim_http(sim) as http:
        await mutating(
            http,
            "a-first",
            hook(
                "first.nodeward.test",
                url_client(webhook, "first"),
                reinvocationPolicy="IfNeeded",
            ),
        )
        await mutating(
            http, "b-second", hook("second.nodeward.test", url_client(webhook, "second"))
        )
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("twice", app="x"))
        assert made.status_code == 201, made.text
        assert [p for p, _ in webhook.reviews] == ["first", "second", "first"]
        assert made.json()["metadata"]["annotations"] == {"first-saw": "app,second"}
        # Never: called once
        config = (await http.get(f"{MUTATING}/a-first")).json()
        config["webhooks"][0]["reinvocationPolicy"] = "Never"
        assert (await http.put(f"{MUTATING}/a-first", json=config)).status_code == 200
        webhook.reviews.clear()
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("once", app="x"))
        assert made.status_code == 201, made.text
    assert [p for p, _ in webhook.reviews] == ["first", "second"]
    assert made.json()["metadata"]["annotations"] == {"first-saw": "app"}


async def test_dry_run_asks_webhooks_without_side_effects_only(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["dry"] = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/labels", "value": {"dry": "seen"}}]
    )
    async with sim_http(sim) as http:
        await mutating(
            http,
            "dry",
            hook("dry.nodeward.test", url_client(webhook, "dry"), sideEffects="NoneOnDryRun"),
        )
        made = await http.post(f"/api/v1/namespaces/{NS}/pods?dryRun=All", json=pod("dry"))
        assert made.status_code == 201, made.text
        assert made.json()["metadata"]["labels"] == {"dry": "seen"}
        assert webhook.seen("dry")[0]["dryRun"] is True
        assert webhook.seen("dry")[0]["options"] == {
            "kind": "CreateOptions",
            "apiVersion": "meta.k8s.io/v1",
            "dryRun": ["All"],
        }
        assert (await http.get(f"/api/v1/namespaces/{NS}/pods/dry")).status_code == 404
        # `Some` is refused in v1 (422 above); a configuration stored before 1.22 in v1beta1
        # may still carry it: written here as such a server left it
        stored = sim.store.peek_one(
            resources.require(
                "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"
            ),
            "",
            "dry",
        )
        assert stored is not None
        stored["webhooks"][0]["sideEffects"] = "Some"
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods?dryRun=All", json=pod("dry"))
        assert answer.status_code == 400
        assert (
            answer.json()["message"]
            == 'admission webhook "dry.nodeward.test" does not support dry run'
        )
        assert len(webhook.seen("dry")) == 1
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("wet"))
        assert made.status_code == 201, made.text


async def test_a_patch_that_makes_an_invalid_pod_is_refused_with_422(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["break"] = lambda review: allow(
        review,
        [
            {"op": "remove", "path": "/spec/containers/0/image"},
            {"op": "add", "path": "/spec/bogus", "value": 1},
        ],
    )
    webhook.answers["prune"] = lambda review: allow(
        review, [{"op": "add", "path": "/spec/bogus", "value": 1}]
    )
    async with sim_http(sim) as http:
        await mutating(
            http,
            "patches",
            hook(
                "break.nodeward.test",
                url_client(webhook, "break"),
                objectSelector={"matchLabels": {"hook": "break"}},
            ),
            hook(
                "prune.nodeward.test",
                url_client(webhook, "prune"),
                objectSelector={"matchLabels": {"hook": "prune"}},
            ),
        )
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("broken", hook="break"))
        assert answer.status_code == 422
        assert (
            answer.json()["message"]
            == 'Pod "broken" is invalid: spec.containers[0].image: Required value'
        )
        # a field the struct does not have is dropped, silently, as decoding the patched JSON does
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("pruned", hook="prune"))
        assert made.status_code == 201, made.text
        assert "bogus" not in made.json()["spec"] and "Warning" not in made.headers


async def test_an_answer_for_another_request_fails_the_call(
    sim: SimCluster, webhook: Webhook
) -> None:
    def stranger(review: Obj) -> Obj:
        answer = allow(review)
        answer["response"]["uid"] = "not-" + review["request"]["uid"]
        return answer

    webhook.answers["uid"] = stranger
    async with sim_http(sim) as http:
        await mutating(http, "uid", hook("uid.nodeward.test", url_client(webhook, "uid")))
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("odd"))
    uid = webhook.seen("uid")[0]["uid"]
    assert answer.status_code == 500
    assert answer.json()["message"] == (
        'Internal error occurred: failed calling webhook "uid.nodeward.test": received invalid '
        f'webhook response: expected response.uid="{uid}", got "not-{uid}"'
    )


async def test_a_webhook_behind_a_service_as_the_helm_chart_registers_it(
    sim: SimCluster, webhook: Webhook
) -> None:
    namespace, name = SERVICE
    webhook.answers["mutate"] = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/labels", "value": {"via": "service"}}]
    )
    client = {
        "service": {"namespace": namespace, "name": name, "path": "/mutate"},
        "caBundle": webhook.ca_bundle,
    }
    async with sim_http(sim) as http:
        await mutating(http, "service", hook("service.nodeward.test", client))
        # no Service yet: kube-apiserver's ClusterIP resolver finds none
        shown = f"https://{name}.{namespace}.svc:443/mutate?timeout=10s"
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("early"))
        assert answer.status_code == 500
        assert answer.json()["message"].endswith(
            f'failed to call webhook: Post "{shown}": service "{name}" not found'
        )
        made = await http.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        assert made.status_code == 201
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"ports": [{"port": 443, "targetPort": 8443}], "selector": {"app": name}},
        }
        made = await http.post(f"/api/v1/namespaces/{namespace}/services", json=service)
        assert made.status_code == 201, made.text
        ip = made.json()["spec"]["clusterIP"]
        # a Service with no endpoints refuses the connection
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("early"))
        assert answer.json()["message"].endswith(f"dial tcp {ip}:443: connect: connection refused")
        sim.webhook_endpoints[SERVICE] = f"127.0.0.1:{webhook.port}"
        made = await http.post(f"/api/v1/namespaces/{NS}/pods", json=pod("served"))
        assert made.status_code == 201, made.text
        assert made.json()["metadata"]["labels"] == {"via": "service"}


async def test_validating_webhooks_see_updates_and_deletes(
    sim: SimCluster, webhook: Webhook
) -> None:
    def guard(review: Obj) -> Obj:
        request = review["request"]
        if (
            request["operation"] == "DELETE"
            and (request["oldObject"]["metadata"].get("labels") or {}).get("keep") == "true"
        ):
            return deny(review, {"code": 403, "reason": "Forbidden", "message": "kept"})
        return allow(review, warnings=[f"seen {request['operation']}"])

    webhook.answers["guard"] = guard
    rules = [
        {
            "operations": ["UPDATE", "DELETE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["configmaps"],
        }
    ]
    async with sim_http(sim) as http:
        await validating(
            http, "guard", hook("guard.nodeward.test", url_client(webhook, "guard"), rules=rules)
        )
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "labels": {"keep": "true"}},
            "data": {"a": "1"},
        }
        assert (await http.post(f"/api/v1/namespaces/{NS}/configmaps", json=cm)).status_code == 201
        patched = await http.patch(
            f"/api/v1/namespaces/{NS}/configmaps/c",
            content=json.dumps({"data": {"a": "2"}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        assert patched.headers.get_list("Warning") == ['299 - "seen UPDATE"']
        update = webhook.seen("guard")[0]
        assert (update["oldObject"]["data"], update["object"]["data"]) == ({"a": "1"}, {"a": "2"})
        assert update["options"]["kind"] == "UpdateOptions"
        gone = await http.delete(f"/api/v1/namespaces/{NS}/configmaps/c")
        assert gone.status_code == 403
        assert (
            gone.json()["message"]
            == 'admission webhook "guard.nodeward.test" denied the request: kept'
        )
        delete = webhook.seen("guard")[1]
        assert delete["object"] is None and delete["options"]["kind"] == "DeleteOptions"
        assert (await http.get(f"/api/v1/namespaces/{NS}/configmaps/c")).status_code == 200


async def test_a_patch_is_applied_again_when_the_object_changed_during_its_webhooks(
    sim: SimCluster, webhook: Webhook
) -> None:
    cms = resources.require("", "v1", "configmaps")

    def meanwhile(review: Obj) -> Obj:
        if len(webhook.seen("race")) == 1:  # another writer gets in while the webhook runs
            current = sim.store.get(cms, NS, "race")
            current["data"]["other"] = current["data"].get("other", "") + "x"
            sim.store.update(cms, NS, "race", current)
        return allow(review)

    webhook.answers["race"] = meanwhile
    rules = [
        {
            "operations": ["UPDATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["configmaps"],
        }
    ]
    async with sim_http(sim) as http:
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "race"},
            "data": {"a": "1"},
        }
        assert (await http.post(f"/api/v1/namespaces/{NS}/configmaps", json=cm)).status_code == 201
        await mutating(
            http, "race", hook("race.nodeward.test", url_client(webhook, "race"), rules=rules)
        )
        patched = await http.patch(
            f"/api/v1/namespaces/{NS}/configmaps/race",
            content=json.dumps({"data": {"a": "2"}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        # GuaranteedUpdate: the patch applied again to the object as the other writer left it
        assert patched.json()["data"] == {"a": "2", "other": "x"}
        assert len(webhook.seen("race")) == 2
        # an update naming the resourceVersion it read is a conflict instead
        stale = patched.json()
        webhook.reviews.clear()
        stale["data"]["a"] = "3"
        answer = await http.put(f"/api/v1/namespaces/{NS}/configmaps/race", json=stale)
        assert answer.status_code == 409, answer.text


async def test_an_eviction_is_admitted_as_a_create_of_pods_eviction(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["evict"] = lambda review: deny(
        review, {"code": 429, "reason": "TooManyRequests", "message": "not now"}
    )
    rules = [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods/eviction"],
        }
    ]
    async with sim_http(sim) as http:
        body = pod("evicted") | {"spec": pod("evicted")["spec"] | {"nodeName": "gpu-h100-01"}}
        assert (await http.post(f"/api/v1/namespaces/{NS}/pods", json=body)).status_code == 201
        await validating(
            http, "evict", hook("evict.nodeward.test", url_client(webhook, "evict"), rules=rules)
        )
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "evicted", "namespace": NS},
        }
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods/evicted/eviction", json=eviction)
        assert answer.status_code == 429
        assert (
            answer.json()["message"]
            == 'admission webhook "evict.nodeward.test" denied the request: not now'
        )
        assert (await http.get(f"/api/v1/namespaces/{NS}/pods/evicted")).json()["metadata"].get(
            "deletionTimestamp"
        ) is None
    [request] = webhook.seen("evict")
    assert request["kind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request["subResource"], request["name"], request["operation"]) == (
        "eviction",
        "evicted",
        "CREATE",
    )
    assert request["object"]["kind"] == "Eviction"


async def test_a_namespace_is_its_own_namespace_for_its_webhooks(
    sim: SimCluster, webhook: Webhook
) -> None:
    webhook.answers["ns"] = lambda review: deny(
        review, {"code": 403, "reason": "Forbidden", "message": "protected"}
    )
    rules = [
        {
            "operations": ["DELETE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["namespaces"],
        }
    ]
    async with sim_http(sim) as http:
        for name, labels in (("protected", {"protect": "yes"}), ("loose", {})):
            body = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels},
            }
            assert (await http.post("/api/v1/namespaces", json=body)).status_code == 201
        await validating(
            http,
            "ns",
            hook(
                "ns.nodeward.test",
                url_client(webhook, "ns"),
                rules=rules,
                namespaceSelector={"matchLabels": {"protect": "yes"}},
            ),
        )
        answer = await http.delete("/api/v1/namespaces/protected")
        assert answer.status_code == 403, answer.text
        assert (await http.delete("/api/v1/namespaces/loose")).status_code == 200
    [request] = webhook.seen("ns")
    assert (request["name"], request["namespace"]) == ("protected", "protected")


async def test_a_controllers_pods_are_admitted_and_a_refusal_is_its_failed_create_event(
    sim: SimCluster, webhook: Webhook
) -> None:
    """kube-controller-manager creates pods through the API server, so a StatefulSet's and a
    ReplicaSet's pods meet the webhooks as a user's do, as the controller's ServiceAccount; a
    refused create is the owner's Warning Event `FailedCreate`, and it is tried again."""
    refuse = {"on": True}

    def answer(review: Obj) -> Obj:
        obj = review["request"]["object"]
        if refuse["on"] and obj["metadata"].get("labels", {}).get("app") == "refused":
            return deny(review, {"message": "no pods for this app today"})
        return allow(review, [{"op": "add", "path": "/metadata/annotations", "value": {"x": "1"}}])

    webhook.answers["ctl"] = answer
    template = {
        "metadata": {"labels": {"app": "nb"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }
    async with sim_http(sim) as http:
        await mutating(http, "ctl", hook("ctl.nodeward.test", url_client(webhook, "ctl")))
        sts = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "nb"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "nb"}},
                "template": template,
            },
        }
        made = await http.post(f"/apis/apps/v1/namespaces/{NS}/statefulsets", json=sts)
        assert made.status_code == 201, made.text
        refused = {**template, "metadata": {"labels": {"app": "refused"}}}
        rs = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "refused"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "refused"}},
                "template": refused,
            },
        }
        made = await http.post(f"/apis/apps/v1/namespaces/{NS}/replicasets", json=rs)
        assert made.status_code == 201, made.text

        async def nb_pod() -> Obj | None:
            return sim.store.find(PODS, NS, "nb-0")

        found = await wait_for(nb_pod, timeout=5, what="nb-0 admitted")
        assert found["metadata"]["annotations"] == {"x": "1"}
        request = next(r for r in webhook.seen("ctl") if r["name"] == "nb-0")
        assert request["userInfo"]["username"] == (
            "system:serviceaccount:kube-system:statefulset-controller"
        )

        async def failed_create() -> list[Obj]:
            listed = await http.get(f"/api/v1/namespaces/{NS}/events")
            return [
                e
                for e in listed.json()["items"]
                if e["reason"] == "FailedCreate" and e["involvedObject"]["name"] == "refused"
            ]

        events = await wait_for(failed_create, timeout=5, what="FailedCreate")
        assert events[0]["type"] == "Warning"
        assert events[0]["message"] == (
            'Error creating: admission webhook "ctl.nodeward.test" denied the request: '
            "no pods for this app today"
        )
        assert not [
            p for p in sim.store.list(PODS, NS) if p["metadata"]["name"].startswith("refused")
        ]
        refuse["on"] = False  # the controller tries again (after its back-off) and succeeds

        async def two() -> bool:
            pods = [
                p for p in sim.store.list(PODS, NS) if p["metadata"]["name"].startswith("refused")
            ]
            return len(pods) == 2

        await wait_for(two, timeout=10, what="two pods once allowed")
        # exactly two: no create was made twice while one was being admitted
        assert (
            len(
                [p for p in sim.store.list(PODS, NS) if p["metadata"]["name"].startswith("refused")]
            )
            == 2
        )
