"""GitOps: two renders of the same values are byte-identical (Argo CD and Flux see no drift),
nothing is random unless asked, and every name follows the release."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helm_chart import (
    CONSOLE_TOKEN,
    MONITORING_API,
    NODE_KEYS,
    TLS_VALUES,
    by_kind,
    merged,
    minimal,
    named,
    refusal,
    render,
    render_text,
    representative_values,
)

HASH = "$2a$11$" + "B" * 53


def _scenarios() -> dict[str, dict[str, Any]]:
    every = representative_values(NODE_KEYS, "passwords")
    identities = [*every["services"], "admin", "operator", "console"]
    inline = merged(every, {"natsAuth": {"passwords": {"generate": False}}})
    inline["natsAuth"]["passwords"].update({i: f"{i}-pw" for i in identities})
    existing = merged(
        every, {"natsAuth": {"passwords": {"generate": False, "existingSecret": "pw"}}}
    )
    existing["natsAuth"]["passwords"] = {
        "existingSecret": "pw",
        "hashes": dict.fromkeys(identities, HASH),
    }
    return {
        "callout": representative_values(NODE_KEYS, "callout"),
        "callout-defaults": minimal(),
        "nkeys": representative_values(NODE_KEYS, "nkeys"),
        "passwords-inline": inline,
        "passwords-existing-secret": existing,
        "tls": merged(representative_values(NODE_KEYS, "callout"), TLS_VALUES),
        "own-token-secrets": minimal(
            {
                "console": {"token": "", "tokenSecret": "console-token"},
                "services": {"falco": {"enabled": True, "ingest": {"tokenSecret": "falco"}}},
            }
        ),
    }


SCENARIOS = _scenarios()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("prometheus", [False, True], ids=["no-prometheus", "prometheus"])
def test_two_renders_of_the_same_values_are_byte_identical(
    tmp_path: Path, scenario: str, prometheus: bool
) -> None:
    values = SCENARIOS[scenario]
    apis = [MONITORING_API] if prometheus else []
    first = render_text(tmp_path / "1", values, api_versions=apis)
    second = render_text(tmp_path / "2", values, api_versions=apis)
    assert first == second
    assert len(first) > 10_000


@pytest.mark.parametrize(
    "over",
    [
        {"natsAuth": {"mode": "passwords", "passwords": {"generate": True}}},
        {"console": {"token": "", "generateToken": True}},
        {"services": {"falco": {"enabled": True, "ingest": {"generateToken": True}}}},
    ],
    ids=["nats-passwords", "console-token", "falco-token"],
)
def test_random_only_when_asked(tmp_path: Path, over: dict[str, Any]) -> None:
    """The control: with `generate`, two renders differ (no cluster to look the old up in)."""
    values = minimal(over)
    assert render_text(tmp_path / "1", values) != render_text(tmp_path / "2", values)


def test_supplied_tokens_are_the_secrets(tmp_path: Path) -> None:
    values = minimal({"services": {"falco": {"enabled": True, "ingest": {"token": "f" * 40}}}})
    docs = render(tmp_path, values)
    console = named(docs, "Secret", "nw-console-token")["data"]["token"]
    assert base64.b64decode(console).decode() == CONSOLE_TOKEN
    falco = named(docs, "Secret", "nw-falco-ingest")["data"]["token"]
    assert base64.b64decode(falco).decode() == "f" * 40


def test_own_token_secrets_are_used_and_none_rendered(tmp_path: Path) -> None:
    docs = render(tmp_path, SCENARIOS["own-token-secrets"])
    assert {s["metadata"]["name"] for s in by_kind(docs, "Secret")} == {"nw-nats-auth"}
    console = named(docs, "Deployment", "nw-console")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in console["volumes"]}["token"]["secret"]["secretName"] == (
        "console-token"
    )


def _names(doc: dict[str, Any]) -> list[str]:
    """Every object name a manifest refers to: its own, Secrets, ConfigMaps, ServiceAccounts."""
    found = [doc["metadata"]["name"]]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"secretName", "serviceAccountName"} and isinstance(value, str):
                    found.append(value)
                elif key in {"configMap", "secret", "secretKeyRef", "roleRef"} and isinstance(
                    value, dict
                ):
                    if "name" in value:
                        found.append(value["name"])
                    walk(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc.get("spec", {}))
    walk(doc.get("roleRef", {}))
    for subject in doc.get("subjects", []):
        found.append(subject["name"])
    return found


@pytest.mark.parametrize("scenario", ["callout", "nkeys", "passwords-inline"])
def test_every_name_follows_the_release(tmp_path: Path, scenario: str) -> None:
    text = render_text(tmp_path, SCENARIOS[scenario], "prod-gpu", api_versions=[MONITORING_API])
    assert "nodeward-nats-auth" not in text
    from tests.integration.helm_chart import DIRECTORY_LDAP, parse_manifests

    docs = parse_manifests(text)
    # the runtime class is the cluster's; the admission webhook's certificate Secret the user's
    outside = {"nvidia", "admission-tls"}
    # the directory's LDAP bind Secret and CA ConfigMap are the user's
    outside |= {DIRECTORY_LDAP["bindSecret"], DIRECTORY_LDAP["caConfigMap"]}
    for doc in docs:
        for name in _names(doc):
            assert name.startswith("prod-gpu-") or name in outside, (
                f"{doc['kind']}/{doc['metadata']['name']} names {name}"
            )
    assert named(docs, "Secret", "prod-gpu-nats-auth")


def test_the_server_secret_goes_where_nats_runs(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal({"natsAuth": {"serverNamespace": "nats"}}))
    assert named(docs, "Secret", "nw-nats-auth")["metadata"]["namespace"] == "nats"
    default = render(tmp_path / "default", minimal())
    assert named(default, "Secret", "nw-nats-auth")["metadata"]["namespace"] == "nodeward"


def test_every_namespaced_object_names_its_namespace(tmp_path: Path) -> None:
    """Argo CD applies manifests as rendered: none may rely on kubectl's current namespace."""
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
    for doc in render(tmp_path, SCENARIOS["callout"], api_versions=[MONITORING_API]):
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == "nodeward", doc["metadata"]["name"]


def test_an_empty_bus_url_is_refused_in_one_line(tmp_path: Path) -> None:
    assert refusal(tmp_path, minimal({"bus": {"url": ""}})).endswith(
        "bus.url: empty; set the NATS client URL, e.g. nats://nats.nats.svc:4222 "
        "(docs/deploying.md)"
    )


def test_the_default_url_is_the_official_nats_chart_in_namespace_nats(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal())
    for doc in by_kind(docs, "Deployment") + by_kind(docs, "DaemonSet"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["NODEWARD_BUS__URL"] == "nats://nats.nats.svc:4222"
