"""The MutatingWebhookConfiguration this webhook needs, as one dict: the chart renders the
same (tests/integration/test_helm_chart.py compares them), `nodeward up` and the tests
install it."""

from __future__ import annotations

import base64
from typing import Any

from schemas.directory import ADMISSION, DISABLED, ENABLED
from services.admission.settings import AdmissionSettings

NAME = "nodeward-admission"
WEBHOOK = "credentials.admission.nodeward.io"
"""the webhook's name inside the configuration (a qualified name, as the API requires)"""


def configuration(
    ca_bundle: bytes | str,
    *,
    service: tuple[str, str] | None = None,
    url: str | None = None,
    port: int = 443,
    path: str | None = None,
    settings: AdmissionSettings | None = None,
    name: str = NAME,
    exempt: tuple[str, ...] = ("kube-system", "nodeward"),
) -> dict[str, Any]:
    """The `admissionregistration.k8s.io/v1` MutatingWebhookConfiguration.

    `ca_bundle`: the PEM of the CA that signed the webhook's certificate (bytes or text; it
    is base64-encoded here). Exactly one of `service` (namespace, name; with `port` and
    `path`) or `url` (`https://host:port/path`, for an API server outside the cluster, as
    the sim's). `exempt`: namespaces never sent to it (kube-system and nodeward's own).
    `timeoutSeconds` and `failurePolicy` come from `settings`.
    """
    if (service is None) == (url is None):
        raise ValueError("give exactly one of service or url")
    config = settings or AdmissionSettings()
    pem = ca_bundle.encode() if isinstance(ca_bundle, str) else ca_bundle
    client: dict[str, Any] = {"caBundle": base64.b64encode(pem).decode()}
    if service is not None:
        client["service"] = {
            "namespace": service[0],
            "name": service[1],
            "path": path or config.path,
            "port": port,
        }
    else:
        client["url"] = url
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "nodeward"}},
        "webhooks": [
            {
                "name": WEBHOOK,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchLabels": {ADMISSION: ENABLED},
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(exempt),
                        }
                    ],
                },
                "objectSelector": {
                    "matchExpressions": [
                        {"key": ADMISSION, "operator": "NotIn", "values": [DISABLED]}
                    ]
                },
                "sideEffects": "None",
                "timeoutSeconds": config.timeout_seconds,
                "failurePolicy": config.failure_policy,
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }
