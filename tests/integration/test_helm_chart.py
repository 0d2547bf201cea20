"""deploy/helm/nodeward rendered with the real helm, and every manifest checked.

Rendered from an offline copy without the NATS dependency (see tests/integration/helm_chart.py):
the NATS subchart itself is not rendered here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nodeward.nats_auth import node_agent_nkey, service_user
from tests.integration.helm_chart import (
    CHART,
    ROOT,
    SERVICES,
    by_kind,
    helm,
    named,
    new_nkey,
    offline_copy,
    render,
    representative_values,
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
    return render(tmp_path_factory.mktemp("chart"), representative_values(keys))


def test_helm_lint_passes(tmp_path: Path, keys: dict[str, str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(representative_values(keys)))
    done = helm("lint", "--strict", str(offline_copy(tmp_path)), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


def test_helm_refuses_the_real_chart_offline_which_is_why_a_copy_is_rendered() -> None:
    """The reason tests render a copy: helm wants the declared NATS chart in charts/."""
    if (CHART / "charts").exists():
        pytest.skip("the NATS chart has been fetched into charts/ (helm dependency update)")
    done = helm("template", "nw", str(CHART), "--set", "nats.enabled=false")
    assert done.returncode != 0
    assert "missing in charts/ directory: nats" in done.stderr


def test_the_real_chart_declares_the_official_nats_chart() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = meta["dependencies"]
    assert dep["name"] == "nats"
    assert dep["repository"] == "https://nats-io.github.io/k8s/helm/charts/"
    assert str(dep["version"]).startswith("1.")
    assert dep["condition"] == "nats.enabled"
    nats = yaml.safe_load((CHART / "values.yaml").read_text())["nats"]["config"]
    assert nats["jetstream"]["enabled"] and nats["jetstream"]["fileStore"]["enabled"]
    assert nats["cluster"] == {"enabled": True, "replicas": 3}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_kubernetes(
    docs: list[dict[str, Any]], version: str
) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "NetworkPolicy", "Secret", "Job"} <= kinds
    errors = []
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(
                f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
    assert not errors, "\n".join(errors)


def test_prometheus_rules_pass_promtool(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian package prometheus; scripts/system-deps.sh)")
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "nodeward_events_dead_lettered_total" in alerts["NodewardDeadLettersGrowing"]
    assert "nodeward_breaker_tripped" in alerts["NodewardBreakerOpen"]
    assert 'up{job="agent"}' in alerts["NodewardAgentMissing"]
    assert "nodeward_notifications_failed_total" in alerts["NodewardNotificationsFailing"]
    used = set().union(*(_metric_names(e) for e in alerts.values()))
    missing = used - _defined_metrics()
    assert not missing, f"alerts use metrics no code defines: {sorted(missing)}"


def test_monitors_select_the_pods_that_serve_metrics(docs: list[dict[str, Any]]) -> None:
    monitors = by_kind(docs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {f"nw-{s}" for s in SERVICES}
    services = by_kind(docs, "Service")
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    daemonset = named(docs, "DaemonSet", "nw-agent")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_agents_run_on_gpu_nodes_with_least_privilege(docs: list[dict[str, Any]]) -> None:
    ds = named(docs, "DaemonSet", "nw-agent")
    pod = ds["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "nodeward.io/gpu-unhealthy"} <= tolerated
    assert pod["runtimeClassName"] == "nvidia"
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/pod-resources" in mounts
    seed = next(v for v in pod["volumes"] if v["name"] == "seed")
    assert seed["hostPath"] == {"path": "/etc/nodeward/agent.nk", "type": "File"}
    assert env["NODEWARD_BUS__NKEY_SEED_FILE"]["value"] == "/var/run/nodeward/agent.nk"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_ipmi_device_is_mounted_only_when_asked(tmp_path: Path, keys: dict[str, str]) -> None:
    values = representative_values(keys)
    values["agents"]["ipmi"] = {"enabled": True, "hostPath": True}
    docs = render(tmp_path, values)
    pod = named(docs, "DaemonSet", "nw-agent")["spec"]["template"]["spec"]
    ipmi = next(v for v in pod["volumes"] if v["name"] == "ipmi")
    assert ipmi["hostPath"] == {"path": "/dev/ipmi0", "type": "CharDevice"}
    assert pod["containers"][0]["securityContext"]["privileged"] is False


def test_one_locked_down_deployment_per_service(docs: list[dict[str, Any]]) -> None:
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deployments) == {f"nw-{s}" for s in SERVICES}
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


def test_unbuilt_services_are_off_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path, {})
    names = {d["metadata"]["name"] for d in by_kind(docs, "Deployment")}
    assert names == {"nw-cordon", "nw-notifier"}


def _rules(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in doc.get("rules") or []
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_every_role_has_exactly_the_rules_of_deploy_rbac(docs: list[dict[str, Any]]) -> None:
    """Both ways: each chart role equals its deploy/rbac/<component>.yaml role."""
    for component in (*SERVICES, "agent"):
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


def test_notifier_token_is_mounted(docs: list[dict[str, Any]]) -> None:
    pod = named(docs, "Deployment", "nw-notifier")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True


def _auth_users(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = named(docs, "Secret", "nodeward-nats-auth")["stringData"]["auth.conf"]
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
        assert by_key[key] == node_agent_nkey(node, key).render()


def test_service_permissions_equal_nats_auth(docs: list[dict[str, Any]]) -> None:
    users = {u["user"]: u for u in _auth_users(docs) if "user" in u}
    assert set(users) == {f"nodeward-{s}" for s in SERVICES} | {"nodeward-admin"}
    for service in SERVICES:
        user = users[f"nodeward-{service}"]
        assert user["password"].startswith("$2a$"), "service passwords are bcrypt hashes"
        assert user["permissions"] == service_user(service, "").permissions()
    secret = named(docs, "Secret", "nw-nats-cordon")["stringData"]
    assert secret == {"user": "nodeward-cordon", "password": "cordon-test-pw"}
    generated = named(docs, "Secret", "nw-nats-notifier")["stringData"]["password"]
    assert len(generated) == 32


def test_a_bad_node_key_is_refused_with_one_clear_line(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"agents": {"nodeKeys": {"gpu-1": "SUAJ-not-a-key"}}}))
    done = helm("template", "nw", str(offline_copy(tmp_path)), "-f", str(values))
    assert done.returncode != 0
    assert "agents.nodeKeys.gpu-1" in done.stderr and "nkey user public key" in done.stderr


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bnodeward_[a-z_]+", expr))


def _defined_metrics() -> set[str]:
    """Every metric name the code defines (prometheus-client adds _total to counters)."""
    names: set[str] = set()
    pattern = re.compile(r"(Counter|Gauge|Histogram)\(\s*\"(nodeward_[a-z_]+)\"", re.S)
    for folder in ("nodeward", "agents", "services"):
        for path in (ROOT / folder).rglob("*.py"):
            for kind, name in pattern.findall(path.read_text()):
                names.add(name)
                if kind == "Counter":
                    names.add(f"{name}_total")
    return names


def test_grafana_dashboard_uses_only_metrics_the_code_defines(docs: list[dict[str, Any]]) -> None:
    cm = named(docs, "ConfigMap", "nw-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["nodeward.json"])
    exprs = _exprs(dashboard)
    used = set().union(*(_metric_names(e) for e in exprs))
    assert {"nodeward_gpu_health_state", "nodeward_remediations_total"} <= used
    assert "nodeward_events_dead_lettered_total" in used
    missing = used - _defined_metrics()
    assert not missing, f"dashboard panels use metrics no code defines: {sorted(missing)}"
