"""The chart's admission webhook: its Deployment with the TLS Secret mounted whole, its Service,
the certificate (made by the chart and kept, or cert-manager's) and the
MutatingWebhookConfiguration, the same as `services.admission.webhook.configuration()`."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from services.admission.settings import AdmissionSettings
from services.admission.webhook import configuration
from sim.cluster import SimCluster
from tests.integration.helm_chart import (
    CHART,
    by_kind,
    find_helm,
    merged,
    minimal,
    named,
    refusal,
    render,
    validation_errors,
)
from tests.integration.simkube import sim_http

ON = {"services": {"admission": {"enabled": True, "certificate": {"generate": True}}}}


def webhook_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [found] = by_kind(docs, "MutatingWebhookConfiguration")
    return found


def test_off_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal())
    assert not by_kind(docs, "MutatingWebhookConfiguration")
    assert not [d for d in docs if "admission" in d["metadata"]["name"]]


def test_the_webhook_its_service_certificate_and_configuration(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal(ON))
    deployment = named(docs, "Deployment", "nw-admission")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert {"name": "webhook", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NODEWARD_SERVICES__ADMISSION__TLS_CERT_FILE"] == "/etc/nodeward-admission/tls.crt"
    assert env["NODEWARD_SERVICES__ADMISSION__FAILURE_POLICY"] == "Ignore"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "admission-tls"]
    assert "subPath" not in mount  # a rotated certificate reaches the pod
    [volume] = [v for v in pod["volumes"] if v["name"] == "admission-tls"]
    assert volume["secret"]["secretName"] == "nw-admission-tls"
    assert {i["key"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}  # no CA key

    service = named(docs, "Service", "nw-admission")
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    policy = named(docs, "NetworkPolicy", "nw-admission-webhook")
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]

    secret = named(docs, "Secret", "nw-admission-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "nw-admission.nodeward.svc" in names.get_values_for_type(x509.DNSName)
    leaf.verify_directly_issued_by(ca)
    not_after = int(secret["metadata"]["annotations"]["nodeward.io/not-after"])
    assert abs(not_after - leaf.not_valid_after_utc.timestamp()) < 3600

    hook = webhook_of(docs)
    expected = configuration(
        ca_pem, service=("nodeward", "nw-admission"), settings=AdmissionSettings()
    )
    assert hook["webhooks"] == expected["webhooks"]
    assert hook["metadata"]["name"] == "nw-admission"
    [only] = hook["webhooks"]
    assert only["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "nodeward"]
    assert (only["failurePolicy"], only["sideEffects"]) == ("Ignore", "None")
    assert only["reinvocationPolicy"] == "IfNeeded" and only["admissionReviewVersions"] == ["v1"]
    assert not validation_errors(docs, "1.33.0")


def test_fail_and_the_timeout_are_selectable_and_checked(tmp_path: Path) -> None:
    values = merged(
        minimal(ON), {"services": {"admission": {"failurePolicy": "Fail", "timeoutSeconds": 10}}}
    )
    docs = render(tmp_path, values)
    [only] = webhook_of(docs)["webhooks"]
    assert (only["failurePolicy"], only["timeoutSeconds"]) == ("Fail", 10)
    env = {
        e["name"]: e.get("value")
        for e in named(docs, "Deployment", "nw-admission")["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert env["NODEWARD_SERVICES__ADMISSION__TIMEOUT_SECONDS"] == "10"
    bad = merged(minimal(ON), {"services": {"admission": {"failurePolicy": "Sometimes"}}})
    assert "failurePolicy" in refusal(tmp_path / "bad", bad)
    short = merged(minimal(ON), {"services": {"admission": {"timeoutSeconds": 1}}})
    assert "timeoutSeconds" in refusal(tmp_path / "short", short)


def test_a_certificate_is_required_and_yours_is_used_as_given(tmp_path: Path) -> None:
    bare = minimal({"services": {"admission": {"enabled": True}}})
    assert "no certificate" in refusal(tmp_path / "none", bare)
    no_ca = merged(bare, {"services": {"admission": {"certificate": {"secretName": "mine"}}}})
    assert "caBundle" in refusal(tmp_path / "no-ca", no_ca)
    pem = "-----BEGIN CERTIFICATE-----\nTUlORQ==\n-----END CERTIFICATE-----\n"
    yours = merged(no_ca, {"services": {"admission": {"certificate": {"caBundle": pem}}}})
    docs = render(tmp_path / "yours", yours)
    assert not [s for s in by_kind(docs, "Secret") if "admission" in s["metadata"]["name"]]
    pod = named(docs, "Deployment", "nw-admission")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "admission-tls"]
    assert volume["secret"]["secretName"] == "mine"
    [hook] = webhook_of(docs)["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == pem


def test_cert_manager_issues_the_certificate_and_injects_the_ca(tmp_path: Path) -> None:
    values = merged(minimal(ON), {"services": {"admission": {"certManager": {"enabled": True}}}})
    docs = render(tmp_path, values)
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "nw-admission-tls"]
    certificate = named(docs, "Certificate", "nw-admission")
    assert certificate["spec"]["secretName"] == "nw-admission-tls"
    assert "nw-admission.nodeward.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == "nw-admission-selfsigned"
    named(docs, "Issuer", "nw-admission-selfsigned")
    hook = webhook_of(docs)
    assert hook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "nodeward/nw-admission"
    }
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    theirs = merged(
        values,
        {
            "services": {
                "admission": {
                    "certManager": {"issuerRef": {"name": "corp", "kind": "ClusterIssuer"}}
                }
            }
        },
    )
    docs = render(tmp_path / "theirs", theirs)
    assert not by_kind(docs, "Issuer")
    assert named(docs, "Certificate", "nw-admission")["spec"]["issuerRef"]["name"] == "corp"


async def test_the_certificate_is_kept_on_upgrade_and_renewed_near_its_end(
    sim: SimCluster, tmp_path: Path
) -> None:
    """`helm upgrade --install` into the sim cluster, where `lookup` finds the release's
    Secret as on a real upgrade (helm template never looks anything up)."""
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(minimal(ON)))

    async def upgrade() -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            find_helm(),
            "upgrade",
            "--install",
            "nw",
            str(CHART),
            "-n",
            "nodeward",
            "-f",
            str(values),
            "--no-hooks",
            "--disable-openapi-validation",
            "--kubeconfig",
            str(kubeconfig),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        async with sim_http(sim) as client:
            reply = await client.get("/api/v1/namespaces/nodeward/secrets/nw-admission-tls")
            assert reply.status_code == 200, reply.text
            found: dict[str, Any] = reply.json()
            return found

    first = await upgrade()
    kept = await upgrade()
    assert kept["data"] == first["data"]  # same CA, same serving pair: nothing rotates

    soon = int((dt.datetime.now(dt.UTC) + dt.timedelta(days=10)).timestamp())
    async with sim_http(sim) as client:
        reply = await client.patch(
            "/api/v1/namespaces/nodeward/secrets/nw-admission-tls",
            json={"metadata": {"annotations": {"nodeward.io/not-after": str(soon)}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert reply.status_code == 200, reply.text
    renewed = await upgrade()
    assert renewed["data"]["ca.crt"] == first["data"]["ca.crt"]  # the caBundle stays valid
    assert renewed["data"]["tls.crt"] != first["data"]["tls.crt"]
    assert int(renewed["metadata"]["annotations"]["nodeward.io/not-after"]) > soon
    leaf = x509.load_pem_x509_certificate(base64.b64decode(renewed["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(renewed["data"]["ca.crt"]))
    leaf.verify_directly_issued_by(ca)
