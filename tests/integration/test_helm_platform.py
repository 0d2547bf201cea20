"""Fitting the platform the chart is installed into: NATS egress peers, TLS to NATS,
scheduling and extra volumes per component, resources, the Prometheus operator's kinds only
where its API is served, and NOTES.txt saying what is on, off and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.helm_chart import (
    MONITORING_API,
    by_kind,
    minimal,
    named,
    notes,
    pod_specs,
    refusal,
    render,
    rendered_config,
)

TLS_DIR = "/var/run/secrets/nodeward.io/nats-tls"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


# --- NATS egress --------------------------------------------------------------------------


def test_nats_egress_defaults_to_the_official_chart_in_namespace_nats(tmp_path: Path) -> None:
    policy = named(render(tmp_path, minimal()), "NetworkPolicy", "nw-default")["spec"]
    _dns, nats = policy["egress"]
    assert nats == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nats"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}},
            }
        ],
        "ports": [{"port": 4222, "protocol": "TCP"}],
    }


def test_nats_egress_peers_and_ports_are_the_values(tmp_path: Path) -> None:
    peers = [
        {"namespaceSelector": {"matchLabels": {"team": "messaging"}}},
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
    ]
    docs = render(
        tmp_path, minimal({"networkPolicies": {"natsEgress": {"to": peers, "ports": [4222, 7422]}}})
    )
    _dns, nats = named(docs, "NetworkPolicy", "nw-default")["spec"]["egress"]
    assert nats["to"] == peers
    assert nats["ports"] == [{"port": 4222, "protocol": "TCP"}, {"port": 7422, "protocol": "TCP"}]
    assert not [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "nw-nats"]


def test_no_nats_egress_peers_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, minimal({"networkPolicies": {"natsEgress": {"to": []}}}))
    assert "networkPolicies.natsEgress.to: empty" in error


# --- TLS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["callout", "passwords"])
def test_tls_files_are_mounted_in_every_pod_and_named_in_therendered_config(
    tmp_path: Path, mode: str
) -> None:
    values = minimal(
        {
            "bus": {
                "tls": {
                    "enabled": True,
                    "ca": {"configMapName": "trust-bundle", "key": "root.pem"},
                    "clientCert": {"secretName": "nodeward-client"},
                }
            }
        }
    )
    if mode == "passwords":
        values["natsAuth"] = {"mode": "passwords", "passwords": {"generate": True}}
    docs = render(tmp_path, values)
    assert {k: v for k, v in rendered_config(docs)["bus"].items() if k.startswith("tls_")} == {
        "tls_ca_file": f"{TLS_DIR}/ca.crt",
        "tls_cert_file": f"{TLS_DIR}/tls.crt",
        "tls_key_file": f"{TLS_DIR}/tls.key",
    }
    workloads = pod_specs(docs)
    assert len(workloads) >= 7
    for name, pod in workloads.items():
        (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-tls"]
        assert volume["projected"]["sources"] == [
            {
                "configMap": {
                    "name": "trust-bundle",
                    "items": [{"key": "root.pem", "path": "ca.crt"}],
                }
            },
            {
                "secret": {
                    "name": "nodeward-client",
                    "items": [
                        {"key": "tls.crt", "path": "tls.crt"},
                        {"key": "tls.key", "path": "tls.key"},
                    ],
                }
            },
        ]
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            assert mounts[TLS_DIR] == {
                "name": "nats-tls",
                "mountPath": TLS_DIR,
                "readOnly": True,
            }, f"{name}/{container['name']}"


def test_a_ca_alone_names_no_client_certificate(tmp_path: Path) -> None:
    docs = render(
        tmp_path, minimal({"bus": {"tls": {"enabled": True, "ca": {"secretName": "ca"}}}})
    )
    bus = rendered_config(docs)["bus"]
    assert bus["tls_ca_file"] == f"{TLS_DIR}/ca.crt"
    assert "tls_cert_file" not in bus and "tls_key_file" not in bus


def test_tls_off_mounts_nothing(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal())
    assert not [k for k in rendered_config(docs)["bus"] if k.startswith("tls")]
    for pod in pod_specs(docs).values():
        assert "nats-tls" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize(
    ("tls", "error"),
    [
        ({"enabled": True}, "bus.tls.enabled: give bus.tls.ca.secretName"),
        (
            {"enabled": True, "ca": {"secretName": "a", "configMapName": "b"}},
            "bus.tls.ca: secretName or configMapName, not both",
        ),
    ],
)
def test_tls_without_files_is_refused(tmp_path: Path, tls: dict[str, Any], error: str) -> None:
    assert error in refusal(tmp_path, minimal({"bus": {"tls": tls}}))


# --- scheduling, extra volumes, resources --------------------------------------------------

GPU_POOL = {"pool": "system"}
TOLERATE = [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]
ZONE = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]
        }
    }
}


def test_service_defaults_schedule_every_non_agent_pod_and_each_may_override(
    tmp_path: Path,
) -> None:
    values = minimal(
        {
            "serviceDefaults": {
                "nodeSelector": GPU_POOL,
                "tolerations": TOLERATE,
                "affinity": ZONE,
                "priorityClassName": "infra",
            },
            "services": {
                "cordon": {"nodeSelector": {"pool": "critical"}, "priorityClassName": "top"}
            },
            "console": {"tolerations": []},
            "natsAuth": {"callout": {"priorityClassName": "system-cluster-critical"}},
        }
    )
    workloads = pod_specs(render(tmp_path, values))
    for name, pod in workloads.items():
        if name == "nw-agent":
            continue
        assert pod["tolerations"] == TOLERATE
        assert pod["affinity"] == ZONE, name
    cordon, culler = workloads["nw-cordon"], workloads["nw-culler"]
    assert cordon["nodeSelector"] == {"pool": "critical"} and cordon["priorityClassName"] == "top"
    assert culler["nodeSelector"] == GPU_POOL and culler["priorityClassName"] == "infra"
    assert workloads["nw-auth-callout"]["priorityClassName"] == "system-cluster-critical"
    assert workloads["nw-provision"]["nodeSelector"] == GPU_POOL
    assert workloads["nw-console"]["priorityClassName"] == "infra"
    agent = workloads["nw-agent"]
    assert "nodeSelector" not in agent and "priorityClassName" not in agent


def test_without_values_only_the_callout_is_spread_and_nothing_else_is_scheduled(
    tmp_path: Path,
) -> None:
    workloads = pod_specs(render(tmp_path, minimal()))
    for name, pod in workloads.items():
        assert "nodeSelector" not in pod and "priorityClassName" not in pod, name
        if name not in {"nw-agent", "nw-auth-callout"}:
            assert "affinity" not in pod and "tolerations" not in pod, name
    callout = workloads["nw-auth-callout"]["affinity"]
    assert set(callout) == {"podAntiAffinity"}


def test_agents_scheduling(tmp_path: Path) -> None:
    pod_affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "trainer"}},
                }
            ]
        }
    }
    values = minimal(
        {
            "agents": {
                "nodeSelector": {"gpu": "yes"},
                "affinity": pod_affinity,
                "priorityClassName": "system-node-critical",
            }
        }
    )
    agent = pod_specs(render(tmp_path, values))["nw-agent"]
    assert agent["nodeSelector"] == {"gpu": "yes"}
    assert agent["priorityClassName"] == "system-node-critical"
    # The GPU node terms stay, beside the affinity given.
    terms = agent["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    assert agent["affinity"]["podAntiAffinity"] == pod_affinity["podAntiAffinity"]
    # A nodeAffinity of one's own replaces the GPU node terms.
    own = pod_specs(render(tmp_path / "own", minimal({"agents": {"affinity": ZONE}})))["nw-agent"]
    assert own["affinity"] == ZONE


def test_extra_volumes_and_mounts_reach_each_component(tmp_path: Path) -> None:
    def vol(name: str) -> dict[str, Any]:
        return {"name": name, "configMap": {"name": name}}

    def mnt(name: str) -> dict[str, Any]:
        return {"name": name, "mountPath": f"/etc/{name}", "readOnly": True}

    values = minimal(
        {
            "extraVolumes": [vol("corp-ca")],
            "extraVolumeMounts": [mnt("corp-ca")],
            "serviceDefaults": {"extraVolumes": [vol("svc")], "extraVolumeMounts": [mnt("svc")]},
            "services": {
                "credentials": {
                    "enabled": True,
                    "extraVolumes": [vol("krb5")],
                    "extraVolumeMounts": [
                        {"name": "krb5", "mountPath": "/etc/krb5.conf", "subPath": "krb5.conf"}
                    ],
                }
            },
            "agents": {"extraVolumes": [vol("agent")], "extraVolumeMounts": [mnt("agent")]},
            "console": {"extraVolumes": [vol("console")], "extraVolumeMounts": [mnt("console")]},
        }
    )
    workloads = pod_specs(render(tmp_path, values))
    expected = {
        "nw-credentials": ["corp-ca", "svc", "krb5"],
        "nw-cordon": ["corp-ca", "svc"],
        "nw-auth-callout": ["corp-ca", "svc"],
        "nw-console": ["corp-ca", "console"],
        "nw-provision": ["corp-ca"],
        "nw-agent": ["corp-ca", "agent"],
    }
    chart_volumes = {
        "config",
        "tmp",
        "state",
        "seed",
        "pod-resources",
        "cgroup",
        "powercap",
        "token",
        "nats-credentials",
        "nats-tls",
    }
    for name, extra in expected.items():
        pod = workloads[name]
        assert [v["name"] for v in pod["volumes"] if v["name"] not in chart_volumes] == extra
        for container in pod["containers"]:
            names = [m["name"] for m in container["volumeMounts"] if m["name"] not in chart_volumes]
            assert names == extra, f"{name}/{container['name']}"


def test_resources_keep_their_defaults(tmp_path: Path) -> None:
    workloads = pod_specs(render(tmp_path, minimal()))
    service = {"requests": {"cpu": "50m", "memory": "112Mi"}, "limits": {"memory": "384Mi"}}
    for name in ("nw-cordon", "nw-console", "nw-auth-callout", "nw-provision"):
        (container,) = workloads[name]["containers"]
        assert container["resources"] == service, name
    agent = {c["name"]: c["resources"] for c in workloads["nw-agent"]["containers"]}
    assert agent == {
        "gpu": {"requests": {"cpu": "20m", "memory": "80Mi"}, "limits": {"memory": "256Mi"}},
        "energy": {"requests": {"cpu": "20m", "memory": "80Mi"}, "limits": {"memory": "256Mi"}},
        "idle": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "192Mi"}},
    }
    own = {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
    docs = render(
        tmp_path / "own",
        minimal({"natsAuth": {"callout": {"resources": own}}, "provision": {"resources": own}}),
    )
    for name in ("nw-auth-callout", "nw-provision"):
        (container,) = pod_specs(docs)[name]["containers"]
        assert container["resources"] == own


# --- monitoring ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "api", "rendered"),
    [
        ("auto", False, False),
        ("auto", True, True),
        (True, False, True),
        (False, True, False),
    ],
)
def test_prometheus_operator_kinds_only_where_the_api_is_served(
    tmp_path: Path, setting: Any, api: bool, rendered: bool
) -> None:
    values = minimal({"monitoring": {"serviceMonitors": setting, "prometheusRules": setting}})
    docs = render(tmp_path, values, api_versions=[MONITORING_API] if api else [])
    kinds = {d["kind"] for d in docs}
    assert (kinds >= OPERATOR_KINDS) is rendered
    assert bool(OPERATOR_KINDS & kinds) is rendered
    assert "nw-dashboard-operations" in {c["metadata"]["name"] for c in by_kind(docs, "ConfigMap")}


def test_the_auth_callout_is_scraped_too(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal(), api_versions=[MONITORING_API])
    monitor = named(docs, "ServiceMonitor", "nw-auth-callout")
    service = named(docs, "Service", "nw-auth-callout-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_a_bad_monitoring_setting_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, minimal({"monitoring": {"serviceMonitors": "yes"}}))
    assert 'monitoring.serviceMonitors: "yes"; true, false or auto' in error


# --- NOTES.txt ----------------------------------------------------------------------------


def test_notes_say_what_is_on_off_and_why(tmp_path: Path) -> None:
    text = notes(tmp_path, minimal())
    on, off = text.split("\nOff, and what turning each on requires:\n")
    off, monitoring = off.split("\nMonitoring:\n")
    assert "natsAuth.mode=callout" in on
    assert "kubectl -n nodeward create token nw-operator --audience nats" in on
    assert "service culler, in DRY RUN" in on
    for feature, needs in {
        "recovery (services.recovery.enabled)": "Kured run with --reboot-sentinel-command",
        "maintenance moves and checkpoints": "CRIU",
        "Falco response and its ingest": "Falcosidekick's webhook",
        "credentials renewal": "krb5.conf",
    }.items():
        assert feature in off and needs in off
    assert "nodeward.io/cuda-checkpoint=true" in off
    assert monitoring.count("SKIPPED, this cluster does not serve monitoring.coreos.com/v1") == 2


def test_notes_follow_the_values(tmp_path: Path) -> None:
    values = minimal(
        {
            "services": {"recovery": {"enabled": True}, "checkpoint": {"enabled": True}},
            "config": {"services": {"culler": {"dry_run": False}}},
            "monitoring": {"prometheusRules": False},
        }
    )
    text = notes(tmp_path, values, api_versions=[MONITORING_API])
    on, off = text.split("\nOff, and what turning each on requires:\n")
    assert "service recovery" in on and "recovery (services.recovery.enabled)" not in off
    assert "maintenance moves" not in off
    assert "DRY RUN" not in on
    assert "ServiceMonitors and the agents' PodMonitor: rendered" in off
    assert "the PrometheusRule (alerts): off (monitoring.prometheusRules=false)" in off


def test_notes_of_the_other_modes(tmp_path: Path) -> None:
    nkeys = minimal({"natsAuth": {"mode": "nkeys", "nkeys": {"publicKeys": {}}}})
    # NOTES render after the manifests: a valid nkeys render first.
    from tests.integration.helm_chart import nkeys_values

    nkeys["natsAuth"] = nkeys_values(
        ["accounting", "capacity", "cordon", "culler", "notifier", "admin", "operator", "console"]
    )
    text = notes(tmp_path, nkeys)
    assert "natsAuth.mode=nkeys" in text and "nw-nkey-cordon" in text and "nw-nkey-admin" in text
    assert "nw-nkey-operator" not in text  # people hold the operator's seed, no pod mounts it
