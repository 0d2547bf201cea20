"""deploy/helm/nodeward rendered with the real helm, and every manifest checked.

The chart has no dependency: the real chart directory is rendered and linted offline. The
NATS modes, GitOps determinism, platform values, upgrades, the Kubernetes version matrix and
a real nats-server have their own files (tests/integration/test_helm_*.py).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from launch.access import AGENT_GRANTS, GRANTS
from launch.observability.dashboards import EXPORTERS
from nodeward.nats_auth import node_agent_nkey, operator, reader, service_user
from tests.integration.helm_chart import (
    CHART,
    DEFAULT_SERVICES,
    FALCO_TOKEN,
    MONITORING_API,
    ROOT,
    SERVICES,
    auth_conf,
    by_kind,
    helm,
    minimal,
    named,
    new_nkey,
    refusal,
    render,
    representative_values,
    validation_errors,
)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
# Prometheus operator kinds: no schema in kubernetes-validate; checked below another way.
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
NODES = ("gpu-node-01", "dgx-a100.rack7")


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {node: new_nkey()[1] for node in NODES}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> list[dict[str, Any]]:
    """natsAuth.mode=passwords (per-node and per-service users in auth.conf), every service
    on, on a cluster with the Prometheus operator."""
    return render(
        tmp_path_factory.mktemp("chart"),
        representative_values(keys),
        api_versions=[MONITORING_API],
    )


@pytest.mark.parametrize("mode", ["callout", "nkeys", "passwords"])
def test_helm_lint_passes_on_the_real_chart(
    tmp_path: Path, keys: dict[str, str], mode: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(representative_values(keys, mode)))
    done = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_chart_has_no_dependency_and_renders_offline() -> None:
    """No bundled NATS: nothing to fetch into charts/ before `helm template` or `install`."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert "dependencies" not in meta
    assert not (CHART / "charts").exists() and not (CHART / "Chart.lock").exists()
    assert "nats" not in yaml.safe_load((CHART / "values.yaml").read_text())
    done = helm("template", "nw", str(CHART), "-f", "/dev/null")  # the default values
    assert "missing in charts/" not in done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_kubernetes(
    docs: list[dict[str, Any]], version: str
) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "NetworkPolicy", "Secret", "Job"} <= kinds
    errors = validation_errors(docs, version)
    assert not errors, "\n".join(errors)


def test_prometheus_rules_are_the_chart_files_and_pass_promtool(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian package prometheus; scripts/system-deps.sh)")
    rules = {r["metadata"]["name"]: r for r in by_kind(docs, "PrometheusRule")}
    assert set(rules) == {"nw-recording", "nw-alerts"}
    used: set[str] = set()
    for kind in ("recording", "alerts"):
        rule = rules[f"nw-{kind}"]
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["spec"] == yaml.safe_load(
            (CHART / "files" / "rules" / f"{kind}.yaml").read_text()
        )
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(rule["spec"]))
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        used |= set().union(
            *(_metric_names(r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"])
        )
    alerts = {
        r["alert"]: r["expr"] for g in rules["nw-alerts"]["spec"]["groups"] for r in g["rules"]
    }
    assert "nodeward_events_dead_lettered_total" in alerts["NodewardDeadLettersGrowing"]
    assert "nodeward_breaker_tripped" in alerts["NodewardBreakerOpen"]
    assert 'up{job="agent"}' in alerts["NodewardAgentMissing"]
    missing = used - _defined_metrics()
    assert not missing, f"rules use metrics no code defines: {sorted(missing)}"


def test_without_agents_no_alert_waits_for_them(tmp_path: Path) -> None:
    values = minimal({"agents": {"enabled": False}})
    docs = render(tmp_path, values, api_versions=[MONITORING_API])
    alerts = named(docs, "PrometheusRule", "nw-alerts")["spec"]["groups"]
    names = {r["alert"] for g in alerts for r in g["rules"]}
    assert "NodewardAgentsAbsent" not in names and "NodewardServiceDown" in names
    assert not by_kind(docs, "PodMonitor")


def test_monitors_select_the_pods_that_serve_metrics(docs: list[dict[str, Any]]) -> None:
    monitors = by_kind(docs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {f"nw-{s}" for s in (*SERVICES, "console")}
    services = by_kind(docs, "Service")
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
        # the workload's own namespace and pod labels (accounting's) win over the target's
        assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    daemonset = named(docs, "DaemonSet", "nw-agent")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    scraped = {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]}
    served = {
        p["name"] for c in daemonset["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert scraped == served == {"metrics", "energy-metrics", "idle-metrics"}


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["containers"]}


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def _pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every workload rendered."""
    specs = []
    for doc in docs:
        if doc["kind"] in {"DaemonSet", "Deployment", "StatefulSet", "Job"}:
            specs.append(
                (f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
            )
    return specs


def test_no_container_sets_an_env_name_twice(docs: list[dict[str, Any]]) -> None:
    """The API server keeps the last of two equal names: one silently loses."""
    specs = _pod_specs(docs)
    assert {"DaemonSet/nw-agent", "Deployment/nw-cordon", "Job/nw-provision"} <= {
        name for name, _ in specs
    }
    twice = []
    for name, pod in specs:
        for container in pod.get("initContainers", []) + pod["containers"]:
            names = [e["name"] for e in container.get("env", [])]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                twice.append(f"{name} container {container['name']}: {dupes}")
    assert not twice, "\n".join(twice)


@pytest.mark.parametrize(
    ("values", "where", "name"),
    [
        ({"agents": {"energy": {"env": {"NODE_NAME": "x"}}}}, "agents.energy.env", "NODE_NAME"),
        (
            {"agents": {"env": {"NODEWARD_DAEMON__PORT": "1"}}},
            "agents.env",
            "NODEWARD_DAEMON__PORT",
        ),
        (
            {"serviceDefaults": {"env": {"NODEWARD_BUS__TOKEN_FILE": "x"}}},
            "serviceDefaults.env",
            "NODEWARD_BUS__TOKEN_FILE",
        ),
        (
            {"natsAuth": {"callout": {"env": {"NODEWARD_BUS__NKEY_SEED_FILE": "x"}}}},
            "natsAuth.callout.env",
            "NODEWARD_BUS__NKEY_SEED_FILE",
        ),
    ],
)
def test_an_env_value_the_chart_sets_itself_is_refused(
    tmp_path: Path, values: dict[str, Any], where: str, name: str
) -> None:
    """Two env entries of one name: the API server would silently keep one."""
    error = refusal(tmp_path, minimal(values))
    assert where in error and f"{name} is set by the chart itself" in error


def test_agents_run_on_gpu_nodes_with_least_privilege(docs: list[dict[str, Any]]) -> None:
    ds = named(docs, "DaemonSet", "nw-agent")
    pod = ds["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "nodeward.io/gpu-unhealthy"} <= tolerated
    assert pod["runtimeClassName"] == "nvidia"
    containers = _containers(pod)
    assert set(containers) == {"gpu", "energy", "idle"}
    seed = next(v for v in pod["volumes"] if v["name"] == "seed")
    assert seed["hostPath"] == {"path": "/etc/nodeward/agent.nk", "type": "File"}
    for container in containers.values():
        sc = container["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        env = _env(container)
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        mounts = _mounts(container)
        assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
        assert mounts["/var/run/nodeward/agent.nk"] == {
            "name": "seed",
            "mountPath": "/var/run/nodeward/agent.nk",
            "readOnly": True,
        }
        assert env["NODEWARD_BUS__NKEY_SEED_FILE"]["value"] == "/var/run/nodeward/agent.nk"
        (port,) = container["ports"]
        assert env["NODEWARD_DAEMON__PORT"]["value"] == str(port["containerPort"])
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    gpu = containers["gpu"]
    assert gpu["args"] == ["agent", "gpu", "--config", "/etc/nodeward/config.yaml"]
    assert gpu["ports"][0] == {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}


def test_the_energy_agent_runs_beside_the_gpu_agent(docs: list[dict[str, Any]]) -> None:
    pod = named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    energy = _containers(pod)["energy"]
    assert energy["args"] == ["agent", "energy", "--config", "/etc/nodeward/config.yaml"]
    assert energy["ports"] == [{"name": "energy-metrics", "containerPort": 9401, "protocol": "TCP"}]
    env = _env(energy)
    mounts = _mounts(energy)
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Each pod's CPU time from the host's cgroup tree, read-only.
    cgroup_root = env["NODEWARD_AGENTS__ENERGY__CGROUP_ROOT"]["value"]
    assert mounts[cgroup_root]["readOnly"] is True
    assert volumes[mounts[cgroup_root]["name"]]["hostPath"] == {
        "path": "/sys/fs/cgroup",
        "type": "Directory",
    }
    # RAPL from the host's powercap directory (the runtime masks the container's), read-only.
    rapl_root = env["NODEWARD_AGENTS__ENERGY__RAPL__ROOT"]["value"]
    (powercap,) = [m for p, m in mounts.items() if rapl_root.startswith(p + "/")]
    assert powercap["readOnly"] is True
    assert volumes[powercap["name"]]["hostPath"]["path"] == "/sys/devices/virtual/powercap"
    socket = env["NODEWARD_AGENTS__ENERGY__POD_RESOURCES_SOCKET"]["value"]
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert {m["name"] for m in mounts.values()} >= {"config", "seed", "pod-resources", "tmp"}
    assert "ipmi" not in volumes


def test_energy_agent_off(tmp_path: Path, keys: dict[str, str]) -> None:
    values = representative_values(keys)
    values["agents"]["energy"] = {"enabled": False}
    docs = render(tmp_path, values, api_versions=[MONITORING_API])
    pod = named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    assert set(_containers(pod)) == {"gpu", "idle"}
    assert "powercap" not in {v["name"] for v in pod["volumes"]}
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == [
        "metrics",
        "idle-metrics",
    ]
    assert "nw-agent-energy" not in {p["metadata"]["name"] for p in by_kind(docs, "NetworkPolicy")}


def test_ipmi_device_is_mounted_only_when_asked(tmp_path: Path, keys: dict[str, str]) -> None:
    """Only in the energy container: the GPU agent does not read the BMC."""
    values = representative_values(keys)
    values["agents"]["ipmi"] = {
        "enabled": True,
        "hostPath": True,
        "resource": "smarter-devices/ipmi0",
    }
    docs = render(tmp_path, values)
    pod = named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    ipmi = next(v for v in pod["volumes"] if v["name"] == "ipmi")
    assert ipmi["hostPath"] == {"path": "/dev/ipmi0", "type": "CharDevice"}
    containers = _containers(pod)
    assert _mounts(containers["energy"])["/dev/ipmi0"]["name"] == "ipmi"
    assert containers["energy"]["resources"]["limits"]["smarter-devices/ipmi0"] == 1
    assert containers["energy"]["securityContext"]["privileged"] is False
    gpu = containers["gpu"]
    assert "ipmi" not in {m["name"] for m in gpu["volumeMounts"]}
    assert "smarter-devices/ipmi0" not in gpu["resources"].get("limits", {})


def test_the_kernel_log_is_mounted_in_the_gpu_container_only_when_asked(
    tmp_path: Path, keys: dict[str, str], docs: list[dict[str, Any]]
) -> None:
    default = _containers(named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"])
    assert "/dev/kmsg" not in _mounts(default["gpu"])
    assert "NODEWARD_AGENTS__GPU__KERNEL_LOG_FILE" not in _env(default["gpu"])
    values = representative_values(keys)
    values["agents"]["kernelLog"] = {
        "kmsg": {"resource": "smarter-devices/kmsg", "syslogCapability": True},
        "file": "/var/log/kern.log",
    }
    pod = named(render(tmp_path, values), "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["kernel-log"]["hostPath"] == {"path": "/var/log/kern.log", "type": "File"}
    containers = _containers(pod)
    gpu = containers["gpu"]
    assert _mounts(gpu)["/dev/kmsg"]["readOnly"] is True
    assert _mounts(gpu)["/host/var/log/kern.log"]["readOnly"] is True
    assert _env(gpu)["NODEWARD_AGENTS__GPU__KERNEL_LOG_FILE"]["value"] == "/host/var/log/kern.log"
    assert gpu["resources"]["limits"]["smarter-devices/kmsg"] == 1
    sc = gpu["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    for other in ("energy", "idle"):
        assert "/dev/kmsg" not in _mounts(containers[other])
        assert containers[other]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _energy_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = named(docs, "NetworkPolicy", "nw-agent-energy")["spec"]
    return spec


def test_energy_network_policy_opens_only_what_the_config_uses(
    docs: list[dict[str, Any]], tmp_path: Path, keys: dict[str, str]
) -> None:
    # Static carbon, in-band BMC: Prometheus on the energy port, no egress of its own.
    policy = _energy_policy(docs)
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"][0]["ports"] == [{"port": 9401, "protocol": "TCP"}]
    assert "egress" not in policy
    # A network provider and an out-of-band BMC: HTTPS to the provider, UDP 623 to the BMCs.
    values = representative_values(keys)
    values["config"] = {
        "agents": {"energy": {"carbon": {"provider": "rte-eco2mix"}, "ipmi": {"host": "10.9.0.7"}}}
    }
    values["networkPolicies"] = {"bmcCidrs": ["10.9.0.0/24"]}
    rendered = render(tmp_path, values)
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(
            named(rendered, "NetworkPolicy", "nw-agent-energy"), version, strict=True
        )
    policy = _energy_policy(rendered)
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    carbon, bmc = policy["egress"]
    assert carbon == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
        "ports": [{"port": 443, "protocol": "TCP"}],
    }
    assert bmc == {
        "to": [{"ipBlock": {"cidr": "10.9.0.0/24"}}],
        "ports": [{"port": 623, "protocol": "UDP"}],
    }


def test_an_out_of_band_bmc_without_cidrs_is_refused(tmp_path: Path) -> None:
    values = minimal({"config": {"agents": {"energy": {"ipmi": {"host": "bmc"}}}}})
    assert "networkPolicies.bmcCidrs" in refusal(tmp_path, values)


def test_a_carbon_token_comes_from_a_secret(tmp_path: Path, keys: dict[str, str]) -> None:
    values = representative_values(keys)
    values["agents"]["energy"] = {
        "secretEnv": {"NODEWARD_AGENTS__ENERGY__CARBON__TOKEN": {"name": "em", "key": "token"}}
    }
    pod = named(render(tmp_path, values), "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    token = _env(_containers(pod)["energy"])["NODEWARD_AGENTS__ENERGY__CARBON__TOKEN"]
    assert token == {
        "name": "NODEWARD_AGENTS__ENERGY__CARBON__TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "em", "key": "token"}},
    }
    assert "NODEWARD_AGENTS__ENERGY__CARBON__TOKEN" not in _env(_containers(pod)["gpu"])


def test_one_locked_down_deployment_per_service(docs: list[dict[str, Any]]) -> None:
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deployments) == {f"nw-{s}" for s in SERVICES} | {"nw-console"}
    for service in SERVICES:
        pod = deployments[f"nw-{service}"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"][:2] == ["service", service]
        assert pod["serviceAccountName"] == f"nw-{service}"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        port = container["ports"][0]
        assert port["name"] == "metrics"
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        env = {e["name"]: e for e in container["env"]}
        assert env["NODEWARD_DAEMON__PORT"]["value"] == str(port["containerPort"])
        secret = env["NODEWARD_BUS__PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
        assert secret == f"nw-nats-{service}"


def test_default_services_and_the_culler_starts_in_dry_run(tmp_path: Path) -> None:
    docs = render(tmp_path, minimal())
    names = {d["metadata"]["name"] for d in by_kind(docs, "Deployment")}
    assert names == {f"nw-{s}" for s in DEFAULT_SERVICES} | {"nw-console", "nw-auth-callout"}
    config = yaml.safe_load(named(docs, "ConfigMap", "nw-config")["data"]["config.yaml"])
    assert config["services"]["culler"]["dry_run"] is True  # audit only until turned off


def test_idle_agent_reads_sessions_and_nothing_else(docs: list[dict[str, Any]]) -> None:
    pod = named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    idle = _containers(pod)["idle"]
    assert idle["args"] == ["agent", "idle", "--config", "/etc/nodeward/config.yaml"]
    assert idle["ports"] == [{"name": "idle-metrics", "containerPort": 9402, "protocol": "TCP"}]
    mounts = _mounts(idle)
    assert mounts["/host/sys/fs/cgroup"]["readOnly"] is True
    assert _env(idle)["NODEWARD_AGENTS__IDLE__CGROUP_ROOT"]["value"] == "/host/sys/fs/cgroup"
    assert idle["securityContext"]["readOnlyRootFilesystem"] is True
    policy = named(docs, "NetworkPolicy", "nw-agent-idle")["spec"]
    assert [p["port"] for p in policy["egress"][0]["ports"]] == [8888]


def _rules(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in doc.get("rules") or []
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_every_role_has_exactly_the_rules_of_deploy_rbac(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    """Both ways: each chart role equals its deploy/rbac/<component>.yaml role."""
    docs = render(tmp_path, representative_values(keys, "callout"))
    components = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    assert set(components) >= {*SERVICES, "agent", "auth-callout"}
    plain_files = {p.stem for p in (ROOT / "deploy" / "rbac").glob("*.yaml")} - {"namespace"}
    assert set(components) == plain_files, "a component in one of chart and deploy/rbac only"
    for component in components:
        plain = list(
            yaml.safe_load_all((ROOT / "deploy" / "rbac" / f"{component}.yaml").read_text())
        )
        for kind in ("ClusterRole", "Role"):
            want = [d for d in plain if d and d["kind"] == kind]
            got = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == f"nw-{component}"]
            assert len(want) == len(got), f"{component}: {kind} in one but not the other"
            if want:
                assert _rules(got[0]) == _rules(want[0]), f"{component} {kind} rules differ"
    for binding in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        name = binding["metadata"]["name"]
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": "nodeward"}
        ]
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "nw-auth-callout"]
    assert role["metadata"]["namespace"] == "nodeward"  # pods of the release namespace only


def test_notifier_token_is_mounted(docs: list[dict[str, Any]]) -> None:
    pod = named(docs, "Deployment", "nw-notifier")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True


def _auth_users(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = auth_conf(docs)
    match = re.search(r"users = (\[.*\])\s*\}\s*$", text, re.S)
    assert match, text
    users: list[dict[str, Any]] = json.loads(match.group(1))
    return users


def test_per_node_permissions_equal_nats_auth(
    docs: list[dict[str, Any]], keys: dict[str, str]
) -> None:
    by_key = {u["nkey"]: u for u in _auth_users(docs) if "nkey" in u}
    assert set(by_key) == set(keys.values())
    for node, key in keys.items():
        assert by_key[key] == node_agent_nkey(node, key, AGENT_GRANTS).render()


def test_service_permissions_equal_nats_auth(docs: list[dict[str, Any]]) -> None:
    users = {u["user"]: u for u in _auth_users(docs) if "user" in u}
    assert set(users) == {f"nodeward-{s}" for s in SERVICES} | {
        "nodeward-admin",
        "nodeward-operator",
        "nodeward-console",
    }
    assert users["nodeward-operator"]["permissions"] == operator("", GRANTS).permissions()
    assert users["nodeward-console"]["permissions"] == reader("console", "", GRANTS).permissions()
    assert len(named(docs, "Secret", "nw-nats-operator")["stringData"]["password"]) == 32
    for service in SERVICES:
        user = users[f"nodeward-{service}"]
        if service != "cordon":  # generated: only its bcrypt hash reaches the server
            assert user["password"].startswith("$2a$"), "generated passwords are bcrypt hashes"
        assert user["permissions"] == service_user(service, GRANTS[service], "").permissions()
    # A password given in values (GitOps): as given, so that every render is the same.
    assert users["nodeward-cordon"]["password"] == "cordon-test-pw"
    secret = named(docs, "Secret", "nw-nats-cordon")["stringData"]
    assert secret == {"user": "nodeward-cordon", "password": "cordon-test-pw"}
    generated = named(docs, "Secret", "nw-nats-notifier")["stringData"]["password"]
    assert len(generated) == 32


@pytest.mark.parametrize("mode", ["nkeys", "passwords"])
def test_a_bad_node_key_is_refused_with_one_clear_line(tmp_path: Path, mode: str) -> None:
    values = representative_values({"gpu-1": "SUAJ-not-a-key"}, mode)
    error = refusal(tmp_path, values)
    assert "agents.nodeKeys.gpu-1" in error and "nkey user public key" in error


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _metric_names(expr: str) -> set[str]:
    """The raw nodeward series an expression reads (a histogram's by its family; not the
    recorded `level:nodeward_...:operation` ones, which `_recorded_names` reads)."""
    names = re.findall(r"(?<![:\w])nodeward_[a-z0-9_]+(?![:\w])", expr)
    return {re.sub(r"_(bucket|sum|count)$", "", n) if "_seconds_" in n else n for n in names}


def _recorded_names(expr: str) -> set[str]:
    return set(re.findall(r"\b[a-z_]+:nodeward_[a-z0-9_]+:[a-z0-9_]+", expr))


def _defined_metrics() -> set[str]:
    """Every metric name the code defines, directly or through `nodeward.metrics.Declare`
    (`m.counter(...)`, `m.gauge(...)`); prometheus-client adds _total to counters."""
    names: set[str] = set()
    pattern = re.compile(
        r"(Counter|Gauge|Histogram|\.counter|\.gauge)\(\s*\"(nodeward_[a-z0-9_]+)\"", re.S
    )
    for folder in ("nodeward", "agents", "services"):
        for path in (ROOT / folder).rglob("*.py"):
            for kind, name in pattern.findall(path.read_text()):
                names.add(name)
                if kind in ("Counter", ".counter"):
                    names.add(f"{name}_total")
    return names


def test_grafana_dashboards_read_only_what_the_code_and_the_recording_rules_define(
    docs: list[dict[str, Any]],
) -> None:
    maps = {
        c["metadata"]["name"]: c
        for c in by_kind(docs, "ConfigMap")
        if c["metadata"]["name"].startswith("nw-dashboard-")
    }
    assert set(maps) == {
        f"nw-dashboard-{n}" for n in ("user", "cluster", "sustainability", "operations")
    }
    recording = yaml.safe_load((CHART / "files" / "rules" / "recording.yaml").read_text())
    recorded = {r["record"] for g in recording["groups"] for r in g["rules"]}
    exporters = {n for names in EXPORTERS.values() for n in names}
    for name, cm in maps.items():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        dashboard = json.loads(text)
        assert key == f"nodeward-{name.removeprefix('nw-dashboard-')}.json"
        assert dashboard["uid"] == f"nodeward-{name.removeprefix('nw-dashboard-')}"
        exprs = _exprs(dashboard)
        raw = set().union(*(_metric_names(e) for e in exprs))
        assert not raw - _defined_metrics(), (
            f"{name}: metrics no code defines: {sorted(raw - _defined_metrics())}"
        )
        rules = set().union(*(_recorded_names(e) for e in exprs))
        assert not rules - recorded, f"{name}: no recording rule makes {sorted(rules - recorded)}"
        foreign = {
            n
            for e in exprs
            for n in re.findall(r"\b(?:DCGM_|kepler_|kube_|container_)[A-Za-z0-9_]+", e)
            if not n.startswith("container_namespace")
        }
        assert foreign <= exporters, (
            f"{name}: exporter series not documented: {foreign - exporters}"
        )
        units = [
            p["fieldConfig"]["defaults"]["unit"] for p in dashboard["panels"] if p["type"] != "row"
        ]
        assert all(units), name


def test_falco_ingest_has_a_service_a_token_and_a_policy_letting_falco_in(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    pod = named(docs, "Deployment", "nw-falco")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["ingest"] == 2803
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NODEWARD_SERVICES__FALCO__INGEST__PORT"] == "2803"
    token_file = Path(env["NODEWARD_SERVICES__FALCO__INGEST__TOKEN_FILE"] or "")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "falco-token")
    assert token_file.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "falco-token")
    secret = named(docs, "Secret", volume["secret"]["secretName"])
    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    service = named(docs, "Service", "nw-falco-ingest")
    assert service["spec"]["ports"] == [
        {"name": "ingest", "port": 2803, "targetPort": "ingest", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == pod_labels_subset(named(docs, "Deployment", "nw-falco"))
    policy = named(docs, "NetworkPolicy", "nw-falco-ingest")["spec"]
    assert policy["podSelector"]["matchLabels"] == service["spec"]["selector"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 2803, "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "falco"}}}
    ]
    assert base64.b64decode(secret["data"]["token"]).decode() == FALCO_TOKEN
    # An operator's own Secret: the chart makes none.
    own = render(
        tmp_path,
        minimal({"services": {"falco": {"enabled": True, "ingest": {"tokenSecret": "mine"}}}}),
    )
    assert not [s for s in by_kind(own, "Secret") if s["metadata"]["name"] == "nw-falco-ingest"]
    own_pod = named(own, "Deployment", "nw-falco")["spec"]["template"]["spec"]
    assert (
        next(v for v in own_pod["volumes"] if v["name"] == "falco-token")["secret"]["secretName"]
        == "mine"
    )


def pod_labels_subset(deployment: dict[str, Any]) -> dict[str, str]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector: dict[str, str] = deployment["spec"]["selector"]["matchLabels"]
    assert all(labels[k] == v for k, v in selector.items())
    return selector


def test_the_console_reads_the_bus_with_its_token_and_no_cluster_rights(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    deployment = named(docs, "Deployment", "nw-console")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "console"
    # Its own ServiceAccount (the auth callout's name for it), with no role and no API token.
    assert (
        pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "nw-console"
    )
    account = named(docs, "ServiceAccount", "nw-console")
    assert account["automountServiceAccountToken"] is False
    assert not [
        b
        for b in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
        if b["subjects"][0]["name"] == "nw-console"
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = _env(container)
    assert env["NODEWARD_BUS__INBOX_PREFIX"]["value"] == "_INBOX_console"
    assert env["NODEWARD_BUS__USER"]["value"] == "nodeward-console"
    assert env["NODEWARD_BUS__PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "nw-nats-console"
    assert env["NODEWARD_SERVICES__CONSOLE__HOST"]["value"] == "0.0.0.0"
    token_file = Path(env["NODEWARD_SERVICES__CONSOLE__TOKEN_FILE"]["value"])
    assert _mounts(container)[str(token_file.parent)]["readOnly"] is True
    secret = named(docs, "Secret", "nw-console-token")
    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    assert named(docs, "Secret", "nw-nats-console")["stringData"]["user"] == "nodeward-console"
    service = named(docs, "Service", "nw-console")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8480, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == pod_labels_subset(deployment)
    policy = named(docs, "NetworkPolicy", "nw-console")["spec"]
    assert policy["podSelector"]["matchLabels"] == service["spec"]["selector"]
    assert policy["ingress"][0]["ports"] == [{"port": 8480, "protocol": "TCP"}]
    off = render(tmp_path, minimal({"console": {"enabled": False}}))
    assert not [d for d in off if "console" in d["metadata"]["name"]]


def test_replicas_and_partitions_reach_the_deployments_and_the_config(tmp_path: Path) -> None:
    values = {
        "partitions": 8,
        "services": {"cordon": {"replicas": 3}, "culler": {"replicas": 2}},
    }
    docs = render(tmp_path, minimal(values))
    assert named(docs, "Deployment", "nw-cordon")["spec"]["replicas"] == 3
    assert named(docs, "Deployment", "nw-culler")["spec"]["replicas"] == 2
    assert named(docs, "Deployment", "nw-notifier")["spec"]["replicas"] == 1
    config = yaml.safe_load(named(docs, "ConfigMap", "nw-config")["data"]["config.yaml"])
    # Every daemon and the provision Job read this file: one partition count for all.
    assert config["bus"]["partitions"] == 8
    assert config["bus"]["stream_replicas"] == 3  # the rest of bus: as the values say
    default = yaml.safe_load(
        named(render(tmp_path / "default", minimal()), "ConfigMap", "nw-config")["data"][
            "config.yaml"
        ]
    )
    assert default["bus"]["partitions"] == 1


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"services": {"cordon": {"replicas": 2}}}, "services.cordon.replicas: 2 keeps its order"),
        ({"partitions": 17}, "partitions: 17; it must be 1 to 16"),
        ({"partitions": 4, "services": {"capacity": {"replicas": 2}}}, "one replica counts"),
        (
            {"partitions": 4, "services": {"recovery": {"enabled": True, "replicas": 2}}},
            "services.recovery.replicas: one replica drives",
        ),
    ],
)
def test_replicas_that_would_lose_order_are_refused(
    tmp_path: Path, values: dict[str, Any], error: str
) -> None:
    assert error in refusal(tmp_path, minimal(values))


def test_the_directory_reads_ldap_with_its_bind_secret_and_ca_mounted(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    from services.directory.settings import DirectorySettings
    from tests.integration.helm_chart import DIRECTORY_LDAP

    pod = named(docs, "Deployment", "nw-directory")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    prefix = "NODEWARD_SERVICES__DIRECTORY__"
    settings = DirectorySettings(
        **{k.removeprefix(prefix).lower(): v for k, v in env.items() if k.startswith(prefix)}
    )
    assert settings.url == DIRECTORY_LDAP["url"] and settings.starttls is False
    assert settings.user_base == DIRECTORY_LDAP["userBase"]
    assert settings.group_base == DIRECTORY_LDAP["groupBase"]
    assert settings.bind_dn == DIRECTORY_LDAP["bindDN"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert settings.bind_password_file is not None and settings.ca_file is not None
    assert str(settings.bind_password_file.parent) == mounts["directory-bind"]["mountPath"]
    assert (
        mounts["directory-bind"]["readOnly"] is True and "subPath" not in mounts["directory-bind"]
    )
    assert volumes["directory-bind"]["secret"] == {
        "secretName": "ldap-bind",
        "items": [{"key": "password", "path": settings.bind_password_file.name}],
    }
    assert str(settings.ca_file.parent) == mounts["directory-ca"]["mountPath"]
    assert volumes["directory-ca"]["configMap"] == {
        "name": "ldap-ca",
        "items": [{"key": "ca.crt", "path": settings.ca_file.name}],
    }
    assert not any("password" in str(v).lower() and "/" not in str(v) for v in env.values() if v)
    policy = named(docs, "NetworkPolicy", "nw-directory-ldap")["spec"]
    assert policy["podSelector"]["matchLabels"] == pod_labels_subset(
        named(docs, "Deployment", "nw-directory")
    )
    (rule,) = policy["egress"]
    assert rule["ports"] == [{"port": 389, "protocol": "TCP"}, {"port": 636, "protocol": "TCP"}]
    # Anonymous, StartTLS, the system's CAs: no Secret, no ConfigMap, no password file.
    plain = render(
        tmp_path,
        minimal(
            {
                "services": {
                    "directory": {
                        "enabled": True,
                        "ldap": {"url": "ldap://ldap:389", "starttls": True},
                    }
                }
            }
        ),
    )
    pod = named(plain, "Deployment", "nw-directory")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[f"{prefix}STARTTLS"] == "true"
    assert f"{prefix}BIND_PASSWORD_FILE" not in env and f"{prefix}CA_FILE" not in env
    assert not {"directory-bind", "directory-ca"} & {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize(
    ("directory", "said"),
    [
        ({}, "services.directory.ldap.url: empty"),
        ({"ldap": {"url": "ldaps://l", "bindDN": "cn=x"}}, "bindDN needs bindSecret"),
        ({"replicas": 2, "ldap": {"url": "ldaps://l"}}, "services.directory.replicas"),
    ],
)
def test_a_directory_without_what_it_needs_is_refused(
    tmp_path: Path, directory: dict[str, Any], said: str
) -> None:
    values = minimal({"services": {"directory": {"enabled": True, **directory}}})
    assert said in refusal(tmp_path, values)
