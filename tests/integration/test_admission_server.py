"""The admission webhook's real HTTPS server, its cache fed by the sim cluster's watches as the
admission ServiceAccount: reviews POSTed with httpx, the test's own CA verified."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import structlog
import structlog.testing
from cryptography import x509
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from nodeward import certs
from nodeward.aio import within
from nodeward.kube import Cluster, Forbidden
from services.admission.cache import ClusterCache
from services.admission.server import AdmissionServer
from services.admission.service import app, up_certificate
from services.admission.settings import AdmissionSettings
from services.admission.webhook import configuration
from sim.cluster import SimCluster
from tests.conftest import wait_for
from tests.integration.simkube import PortFactory, service_settings

ROOT = "/var/run/secrets/nodeward.io"


@dataclass
class Webhook:
    server: AdmissionServer
    cache: ClusterCache
    http: httpx.AsyncClient
    ca: certs.Authority
    registry: CollectorRegistry
    admin: Cluster
    namespace: str
    tmp: Path

    async def review(self, obj: dict[str, Any], **over: Any) -> dict[str, Any]:
        reply = await self.http.post(self.server.url, json=review(obj, self.namespace, **over))
        assert reply.status_code == 200, reply.text
        answer: dict[str, Any] = reply.json()["response"]
        return answer

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def review(obj: dict[str, Any], namespace: str, **over: Any) -> dict[str, Any]:
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": obj,
        "dryRun": False,
    } | over
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-"},
        "spec": {"containers": [{"name": "main", "image": "python:3.12"}]} | spec,
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in answer:
        return []
    assert answer["patchType"] == "JSONPatch"
    found: list[dict[str, Any]] = json.loads(base64.b64decode(answer["patch"]))
    return found


def secret(name: str, namespace: str, kind: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"nodeward.io/credential": kind},
        },
        "stringData": data,
    }


@pytest.fixture
async def webhook(sim: SimCluster, port_for: PortFactory, tmp_path: Path) -> AsyncIterator[Webhook]:
    admin = port_for()
    ns = f"team-{uuid.uuid4().hex[:6]}"
    labels = {
        "nodeward.io/admission": "enabled",
        "nodeward.io/owner": "ada",
        "nodeward.io/owner-uid": "1234",
        "nodeward.io/owner-gid": "500",
    }
    await admin.client.request(
        "POST",
        "/api/v1/namespaces",
        body={
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "labels": labels,
                "annotations": {"nodeward.io/owner-groups": "physics=500,gpu=700"},
            },
        },
    )
    for body in (
        secret("krb", ns, "kerberos", {"krb5cc": "TICKET-VALUE-never-logged"}),
        secret("token", ns, "oauth2", {"access_token": "AT", "refresh_token": "RT-secret"}),
        secret("plain", ns, "something-else", {"x": "y"}),
    ):
        await admin.client.request("POST", f"/api/v1/namespaces/{ns}/secrets", body=body)

    ca = certs.authority("test CA")
    cert_file, key_file = tmp_path / "tls" / "tls.crt", tmp_path / "tls" / "tls.key"
    certs.serving(ca, ["127.0.0.1", "localhost"], cert_file, key_file)
    settings = AdmissionSettings(
        host="127.0.0.1",
        port=0,
        tls_cert_file=cert_file,
        tls_key_file=key_file,
        tls_check_interval="50ms",
        max_body_bytes=64 * 1024,
    )
    cache = ClusterCache()
    own = port_for("admission")  # guarded by what the service declares: its RBAC role
    feeds = [
        asyncio.create_task(cache.feed_namespaces(own, retry_s=0.1)),
        asyncio.create_task(cache.feed_secrets(own, retry_s=0.1)),
    ]
    registry = CollectorRegistry()
    server = AdmissionServer(settings, cache, registry=registry)
    await server.start()
    context = ssl.create_default_context(cadata=ca.pem.decode())
    http = httpx.AsyncClient(verify=context, timeout=10)
    try:
        await within(cache.wait_synced(), 10)
        await wait_for(
            lambda: len(cache.credentials_in(ns)) == 2 and cache.namespace(ns) is not None
        )
        yield Webhook(server, cache, http, ca, registry, admin, ns, tmp_path)
    finally:
        await http.aclose()
        await server.stop()
        for feed in feeds:
            feed.cancel()
        await asyncio.gather(*feeds, return_exceptions=True)


async def test_a_pod_gets_its_credentials_and_identity_and_a_second_review_changes_nothing(
    webhook: Webhook,
) -> None:
    obj = pod()
    with structlog.testing.capture_logs() as logs:
        answer = await webhook.review(obj)
    assert answer["allowed"] is True
    patch = patch_of(answer)
    [said] = [line for line in logs if line["event"] == "admission.mutated"]
    assert said["pod"] == f"{webhook.namespace}/train-*"
    assert "/spec/volumes" in said["paths"] and said["dry_run"] is False
    assert "TICKET-VALUE" not in repr(logs) and "RT-secret" not in repr(logs)
    after = jsonpatch.apply_patch(obj, patch)
    spec = after["spec"]
    assert {v["name"] for v in spec["volumes"]} == {"nodeward-cred-krb", "nodeward-cred-token"}
    assert spec["securityContext"] == {
        "runAsUser": 1234,
        "runAsGroup": 500,
        "fsGroup": 500,
        "supplementalGroups": [500, 700],
    }
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env == {
        "KRB5CCNAME": f"FILE:{ROOT}/krb/krb5cc",
        "OAUTH2_TOKEN_FILE": f"{ROOT}/token/access_token",
    }
    assert "RT-secret" not in json.dumps(answer) and "TICKET-VALUE" not in json.dumps(answer)
    # reinvocation (IfNeeded): the pod as patched comes back and is left as it is
    again = await webhook.review(after)
    assert again["allowed"] is True and "patch" not in again
    assert webhook.metric("nodeward_admission_reviews_total", outcome="mutated", dry_run="false")
    assert webhook.metric("nodeward_admission_mutations_total", kind="volume") == 2
    assert webhook.metric("nodeward_admission_reviews_total", outcome="unchanged", dry_run="false")


async def test_the_cache_follows_secrets_and_namespaces(webhook: Webhook) -> None:
    ns = webhook.namespace
    await webhook.admin.client.request(
        "POST", f"/api/v1/namespaces/{ns}/secrets", body=secret("aaa", ns, "kerberos", {})
    )
    await wait_for(
        lambda: [c.name for c in webhook.cache.credentials_in(ns)] == ["aaa", "krb", "token"]
    )
    env = patch_of(await webhook.review(pod()))
    krb5 = next(op for op in env if op["path"] == "/spec/containers/0/env")["value"][0]
    assert krb5 == {"name": "KRB5CCNAME", "value": f"FILE:{ROOT}/aaa/krb5cc"}
    await webhook.admin.client.request("DELETE", f"/api/v1/namespaces/{ns}/secrets/aaa")
    await wait_for(lambda: len(webhook.cache.credentials_in(ns)) == 2)
    # the namespace opts out: pods are left alone
    await webhook.admin.client.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        body={"metadata": {"labels": {"nodeward.io/admission": "off"}}},
        content_type="application/merge-patch+json",
    )
    await wait_for(lambda: not webhook.cache.namespaces[ns].opted_in)
    answer = await webhook.review(pod())
    assert answer["allowed"] is True and "patch" not in answer


async def test_another_uid_is_refused_with_a_clear_message(webhook: Webhook) -> None:
    answer = await webhook.review(pod(securityContext={"runAsUser": 0}))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert "asks runAsUser 0" in answer["status"]["message"]
    assert webhook.metric("nodeward_admission_refusals_total", reason="uid") == 1


async def test_malformed_requests_get_one_line_and_the_server_keeps_serving(
    webhook: Webhook,
) -> None:
    url = webhook.server.url
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"content": b"{nope", "headers": {"Content-Type": "application/json"}}, 400, "not JSON"),
        ({"json": {"apiVersion": "v1", "kind": "Pod"}}, 400, "expected apiVersion"),
        (
            {"json": {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}},
            400,
            "no request",
        ),
        ({"json": review(pod(), "x", uid="")}, 400, "no uid"),
        (
            {"content": b"x" * (70 * 1024), "headers": {"Content-Type": "application/json"}},
            400,
            "at most",
        ),
        ({"content": b"{}", "headers": {"Content-Type": "text/plain"}}, 415, "application/json"),
    ]
    for kwargs, status, said in cases:
        reply = await webhook.http.post(url, **kwargs)
        assert reply.status_code == status, reply.text
        assert said in reply.text and reply.text.count("\n") == 1
        answer = await webhook.review(pod())  # the next good review is answered
        assert answer["allowed"] is True and patch_of(answer)
    assert (await webhook.http.get(url)).status_code == 405
    assert (await webhook.http.post(url.replace("/mutate", "/other"), json={})).status_code == 404
    assert (
        webhook.metric("nodeward_admission_reviews_total", outcome="malformed", dry_run="false")
        == 6
    )


async def test_a_dry_run_is_answered_the_same_and_not_counted_as_a_mutation(
    webhook: Webhook,
) -> None:
    answer = await webhook.review(pod(), dryRun=True)
    assert answer["allowed"] is True and patch_of(answer)
    assert (
        webhook.metric("nodeward_admission_reviews_total", outcome="mutated", dry_run="true") == 1
    )
    assert webhook.metric("nodeward_admission_mutations_total", kind="volume") == 0
    # no side effects: nothing was written to the cluster
    listed = await webhook.admin.client.request(
        "GET", f"/api/v1/namespaces/{webhook.namespace}/pods"
    )
    assert listed["items"] == []


async def test_not_synced_is_503(webhook: Webhook, tmp_path: Path) -> None:
    settings = webhook.server.settings.model_copy()
    registry = CollectorRegistry()
    cold = AdmissionServer(settings, ClusterCache(), registry=registry)
    await cold.start()
    try:
        reply = await webhook.http.post(cold.url, json=review(pod(), webhook.namespace))
        assert reply.status_code == 503 and "not synced" in reply.text
        reply = await webhook.http.post(webhook.server.url, json=review(pod(), "unknown-ns"))
        assert reply.status_code == 503 and "not in the cache" in reply.text
    finally:
        await cold.stop()


async def test_a_rotated_certificate_is_presented_at_the_next_handshake(
    webhook: Webhook,
) -> None:
    async def presented() -> bytes:
        context = ssl.create_default_context(cadata=webhook.ca.pem.decode())
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", webhook.server.port, ssl=context
        )
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        return der

    first = x509.load_der_x509_certificate(await presented())
    settings = webhook.server.settings
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    # the same CA signs the next one; a kept connection is not dropped by the swap
    kept = httpx.AsyncClient(verify=ssl.create_default_context(cadata=webhook.ca.pem.decode()))
    assert (
        await kept.post(webhook.server.url, json=review(pod(), webhook.namespace))
    ).status_code == 200
    new = certs.serving(webhook.ca, ["127.0.0.1"], settings.tls_cert_file, settings.tls_key_file)
    assert new.serial_number != first.serial_number
    seen: list[int] = []

    async def rotated() -> None:
        while True:
            serial = x509.load_der_x509_certificate(await presented()).serial_number
            seen.append(serial)
            if serial == new.serial_number:
                return
            await asyncio.sleep(0.02)

    await within(rotated(), 10)
    assert (
        await kept.post(webhook.server.url, json=review(pod(), webhook.namespace))
    ).status_code == 200
    await kept.aclose()
    assert webhook.metric("nodeward_admission_tls_reloads_total", result="loaded") >= 1
    answer = await webhook.review(pod())
    assert answer["allowed"] is True


async def test_the_configuration_names_the_server_and_its_ca(webhook: Webhook) -> None:
    config = configuration(webhook.ca.pem, url=webhook.server.url)
    hook = config["webhooks"][0]
    assert hook["clientConfig"]["url"] == webhook.server.url
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == webhook.ca.pem
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"


async def test_the_daemon_is_ready_once_synced_and_serves_metrics_on_its_own_port(
    sim: SimCluster, nats_url: str, tmp_path: Path
) -> None:

    ca = certs.authority("daemon CA")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    certs.serving(ca, ["127.0.0.1"], cert_file, key_file)
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", identity="admission")
    settings = service_settings(
        nats_url,
        kubeconfig,
        "admission",
        {
            "host": "127.0.0.1",
            "port": 0,
            "tls_cert_file": str(cert_file),
            "tls_key_file": str(key_file),
        },
        daemon={"port": 0, "shutdown_timeout": "4s"},
    )
    built = await app.assemble(settings)
    daemon = built.daemon
    await daemon.start()
    try:
        async with httpx.AsyncClient(base_url=daemon.url) as plain:
            await wait_for_status(plain, "/readyz", 200)
            # Before any review: every outcome it can count, each refusal reason and each
            # certificate reload result, at 0.
            before = at_zero_series((await plain.get("/metrics")).text)
            dry_runnable = ("mutated", "unchanged", "skipped", "refused", "not_ready")
            assert before["nodeward_admission_reviews_total"] == {
                *(f"dry_run=false,outcome={o}" for o in (*dry_runnable, "malformed", "timeout")),
                *(f"dry_run=true,outcome={o}" for o in dry_runnable),
            }
            assert before["nodeward_admission_refusals_total"] == {
                "reason=uid",
                "reason=secret_ref",
                "reason=owner_unknown",
            }
            assert before["nodeward_admission_tls_reloads_total"] == {
                "result=loaded",
                "result=failed",
            }
            url = built.service.server.url
            async with httpx.AsyncClient(
                verify=ssl.create_default_context(cadata=ca.pem.decode())
            ) as https:
                reply = await https.post(url, json=review(pod(), "default"))
                assert reply.status_code == 200
                assert reply.json()["response"]["allowed"] is True
            metrics = (await plain.get("/metrics")).text
            assert "nodeward_admission_reviews_total" in metrics
            assert (await plain.get("/healthz")).status_code == 200
    finally:
        await daemon.stop()


def at_zero_series(text: str) -> dict[str, set[str]]:
    """Per counter family of a scrape, its series at 0, each as `label=value,...` sorted."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_total") and s.value == 0.0:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                found.setdefault(s.name, set()).add(labels)
    return found


async def wait_for_status(client: httpx.AsyncClient, path: str, status: int) -> None:
    async def wait() -> None:
        while (await client.get(path)).status_code != status:
            await asyncio.sleep(0.05)

    await within(wait(), 15)


def test_nodeward_up_makes_its_certificate_once(tmp_path: Path) -> None:
    ca_file, cert_file, key_file = up_certificate(tmp_path)
    made = cert_file.read_bytes()
    assert up_certificate(tmp_path) == (ca_file, cert_file, key_file)
    assert cert_file.read_bytes() == made  # kept across restarts of `up`
    assert key_file.stat().st_mode & 0o077 == 0
    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    leaf = x509.load_pem_x509_certificate(made)
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)


async def test_the_sim_cluster_calls_it_and_stores_the_pod_as_patched(webhook: Webhook) -> None:
    """The configuration installed (by URL: the sim's API server runs outside any cluster
    network), pods created through the API server itself: mutated, refused, left alone."""
    config = configuration(webhook.ca.pem, url=webhook.server.url)
    await webhook.admin.client.request(
        "POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", body=config
    )
    ns = webhook.namespace
    created = await webhook.admin.client.request(
        "POST", f"/api/v1/namespaces/{ns}/pods", body=pod() | {"metadata": {"name": "train"}}
    )
    spec = created["spec"]
    assert {v["name"] for v in spec["volumes"]} >= {"nodeward-cred-krb", "nodeward-cred-token"}
    assert spec["securityContext"]["runAsUser"] == 1234
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["KRB5CCNAME"] == f"FILE:{ROOT}/krb/krb5cc"
    with pytest.raises(Forbidden, match="asks runAsUser 0") as refused:
        await webhook.admin.client.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body=pod(securityContext={"runAsUser": 0}) | {"metadata": {"name": "root"}},
        )
    assert "denied the request" in str(refused.value)
    opted_out = pod() | {
        "metadata": {"name": "plain", "labels": {"nodeward.io/admission": "disabled"}}
    }
    left = await webhook.admin.client.request(
        "POST", f"/api/v1/namespaces/{ns}/pods", body=opted_out
    )
    assert "volumes" not in left["spec"] or not any(
        v["name"].startswith("nodeward-cred-") for v in left["spec"]["volumes"]
    )
    dry = await webhook.admin.client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body=pod() | {"metadata": {"name": "dry"}},
        query={"dryRun": "All"},
    )
    assert any(v["name"] == "nodeward-cred-krb" for v in dry["spec"]["volumes"])
    stored = await webhook.admin.client.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert sorted(p["metadata"]["name"] for p in stored["items"]) == ["plain", "train"]
