"""kubectl drives the sim cluster: every kubectl this machine has, as an operator would use it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim.cluster import SimCluster, versions
from tests.integration.simkube import PortFactory, kubectl_binaries, kubectl_version

KUBECTLS = kubectl_binaries()
pytestmark = [
    pytest.mark.peer("kubectl"),
    pytest.mark.skipif(
        not KUBECTLS,
        reason="kubectl is not installed (make test installs Debian's "
        "kubernetes-client through scripts/system-deps.sh)",
    ),
]
TAINT = "nodeward.io/gpu-unhealthy"


@dataclass
class Result:
    rc: int
    out: str
    err: str


@dataclass
class Kubectl:
    binary: str
    kubeconfig: Path
    home: Path
    version: str = ""

    @property
    def minor(self) -> int:
        try:
            return int(self.version.split(".")[1])
        except (IndexError, ValueError):
            return 0

    async def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> Result:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={
                "HOME": str(self.home),
                "PATH": "/usr/bin:/bin",
                "KUBECACHEDIR": str(self.home / "cache"),
            },
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        result = Result(proc.returncode or 0, out.decode(), err.decode())
        if check and result.rc != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.rc}): {result.err or result.out}"
            )
        return result

    async def json(self, *args: str) -> dict:  # type: ignore[type-arg]
        return json.loads((await self(*args, "-o", "json")).out)  # type: ignore[no-any-return]


VERSIONS = {b: kubectl_version(b) for b in KUBECTLS}


@pytest.fixture(
    params=KUBECTLS or ["kubectl"],
    ids=[f"{Path(b).name}-{v}" for b, v in VERSIONS.items()] or ["none"],
)
def kubectl(request: pytest.FixtureRequest, sim: SimCluster, tmp_path: Path) -> Kubectl:
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(
        request.param,
        sim.write_kubeconfig(tmp_path / "kubeconfig"),
        home,
        VERSIONS.get(request.param, ""),
    )


def _minor(version: str) -> int:
    try:
        return int(version.split(".")[1])
    except (IndexError, ValueError):
        return 0


@pytest.fixture
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    """The sim cluster claiming the release of the kubectl the test drives (each kubectl
    against the API server it was released with, within kubectl's supported skew); the
    newest kubectl for tests that take none."""
    params = getattr(request.node, "callspec", None)
    binary = next(
        (v for k, v in (params.params.items() if params else ()) if k.endswith("kubectl")),
        NEWEST,
    )
    minor = _minor(VERSIONS.get(binary, ""))
    claimed = f"1.{min(max(minor, versions.OLDEST), versions.client_release())}" if minor else None
    async with SimCluster(port=0, bookmark_interval=0.2, kube_version=claimed) as cluster:
        yield cluster


_BY_AGE = sorted(KUBECTLS, key=lambda b: _minor(VERSIONS.get(b, "")))
# The oldest and the newest kubectl run the scenarios; the newest also the ones old ones cannot.
EDGES = list(dict.fromkeys([_BY_AGE[0], _BY_AGE[-1]])) if _BY_AGE else ["kubectl"]
NEWEST = EDGES[-1]


def _make(binary: str, sim: SimCluster, tmp_path: Path) -> Kubectl:
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(
        binary, sim.write_kubeconfig(tmp_path / "kubeconfig"), home, VERSIONS.get(binary, "")
    )


@pytest.fixture(params=EDGES, ids=[f"{Path(b).name}-{VERSIONS.get(b, 'none')}" for b in EDGES])
def edge_kubectl(request: pytest.FixtureRequest, sim: SimCluster, tmp_path: Path) -> Kubectl:
    """The oldest and the newest kubectl on this machine."""
    return _make(request.param, sim, tmp_path)


@pytest.fixture
def newest_kubectl(sim: SimCluster, tmp_path: Path) -> Kubectl:
    return _make(NEWEST, sim, tmp_path)


def _rows(table: str) -> dict[str, list[str]]:
    lines = table.strip().splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


async def test_get_cordon_taint_label(kubectl: Kubectl, sim: SimCluster) -> None:
    nodes = _rows((await kubectl("get", "nodes")).out)
    assert sorted(nodes) == [
        *(f"gpu-a100-0{i}" for i in range(1, 4)),
        "gpu-a100-mig-01",
        *(f"gpu-h100-0{i}" for i in range(1, 5)),
        "gpu-h100-dra-01",
        "gpu-mi300x-01",
        "gpu-mi300x-02",
    ]
    assert all(cols[0] == "Ready" for cols in nodes.values())
    pods = (await kubectl("get", "pods", "-A")).out.strip().splitlines()
    assert pods[0].split()[:3] == ["NAMESPACE", "NAME", "READY"]
    assert (
        len(pods) - 1 == 42
    )  # the seed's pods, the three agent pods of the AMD and DRA nodes included
    assert {line.split()[0] for line in pods[1:]} == {
        "ml-vision",
        "ml-nlp",
        "ml-speech",
        "ml-robotics",
        "ml-genomics",
        "nodeward",
    }
    wide = _rows((await kubectl("get", "pods", "-n", "ml-nlp", "-o", "wide")).out)
    assert wide["llm-pretrain-worker-0"][5] == "gpu-h100-02"

    await kubectl("cordon", "gpu-h100-01")
    row = _rows((await kubectl("get", "node", "gpu-h100-01")).out)["gpu-h100-01"]
    assert row[0] == "Ready,SchedulingDisabled"

    await kubectl("taint", "nodes", "gpu-h100-01", f"{TAINT}=true:NoSchedule")
    again = await kubectl("taint", "nodes", "gpu-h100-01", f"{TAINT}=true:NoSchedule", check=False)
    assert again.rc != 0
    node = await kubectl.json("get", "node", "gpu-h100-01")
    assert node["spec"]["taints"] == [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]

    await kubectl("label", "node", "gpu-h100-01", "nodeward.io/gpu-health=failed", "--overwrite")
    labelled = (await kubectl("get", "nodes", "-l", "nodeward.io/gpu-health=failed")).out
    assert list(_rows(labelled)) == ["gpu-h100-01"]

    await kubectl("taint", "nodes", "gpu-h100-01", f"{TAINT}:NoSchedule-")
    await kubectl("uncordon", "gpu-h100-01")
    node = await kubectl.json("get", "node", "gpu-h100-01")
    assert "taints" not in node["spec"] and "unschedulable" not in node["spec"]
    assert _rows((await kubectl("get", "node", "gpu-h100-01")).out)["gpu-h100-01"][0] == "Ready"


async def test_drain_evicts_and_skips_daemonset_pods(kubectl: Kubectl, sim: SimCluster) -> None:
    before = (
        await kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=gpu-a100-03")
    ).out
    assert len(before.strip().splitlines()) - 1 == 8
    # JupyterHub's bare notebook pod: kubectl drains it only when told to (--force).
    refused = await kubectl(
        "drain", "gpu-a100-03", "--ignore-daemonsets", "--timeout=30s", check=False
    )
    assert refused.rc != 0 and "--force" in refused.err and "jupyter-erin" in refused.err
    drained = await kubectl(
        "drain", "gpu-a100-03", "--ignore-daemonsets", "--force", "--timeout=30s"
    )
    last = drained.out.strip().splitlines()[-1]
    assert last in ("node/gpu-a100-03 drained", "node/gpu-a100-03 evicted"), (
        last
    )  # 1.20 says "evicted"
    left = (await kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=gpu-a100-03")).out
    assert [line.split()[1] for line in left.strip().splitlines()[1:]] == ["nodeward-agent-e2077"]
    assert (
        _rows((await kubectl("get", "node", "gpu-a100-03")).out)["gpu-a100-03"][0]
        == "Ready,SchedulingDisabled"
    )
    versions = {v for _, _, v in sim.evictions}
    if (
        kubectl.minor
    ):  # kubectl before 1.22 evicts through policy/v1beta1, later ones through policy/v1
        assert versions == {"policy/v1beta1" if kubectl.minor < 22 else "policy/v1"}
    assert len(sim.evictions) == 7


async def test_drain_of_a_node_with_a_budget_protected_pod(
    edge_kubectl: Kubectl, sim: SimCluster
) -> None:
    kubectl = edge_kubectl
    blocked = await kubectl(
        "drain", "gpu-h100-02", "--ignore-daemonsets", "--timeout=1s", check=False
    )
    assert blocked.rc != 0
    assert "disruption budget" in blocked.err + blocked.out
    pods = _rows((await kubectl("get", "pods", "-n", "ml-nlp")).out)
    assert "llm-pretrain-worker-0" in pods
    pdb = await kubectl.json("get", "pdb", "-n", "ml-nlp", "llm-pretrain")
    assert pdb["status"]["disruptionsAllowed"] == 0
    await kubectl(
        "patch",
        "pdb",
        "-n",
        "ml-nlp",
        "llm-pretrain",
        "--type=merge",
        "-p",
        '{"spec":{"minAvailable":1}}',
    )
    await kubectl("drain", "gpu-h100-02", "--ignore-daemonsets", "--timeout=30s")
    assert "llm-pretrain-worker-0" not in _rows((await kubectl("get", "pods", "-n", "ml-nlp")).out)


async def test_port_writes_are_what_kubectl_shows(
    edge_kubectl: Kubectl, port_for: PortFactory
) -> None:
    cordon = port_for("cordon")
    await cordon.nodes.set_condition(
        "gpu-h100-04", "GPUHealthy", "False", "XidError", "GPU 5: Xid 79"
    )
    await cordon.nodes.add_taint("gpu-h100-04", TAINT, "NoSchedule", "true")
    await cordon.nodes.set_unschedulable("gpu-h100-04")
    await cordon.events.create(
        await cordon.nodes.get("gpu-h100-04"),
        reason="GPUUnhealthy",
        action="Quarantine",
        note="GPU 5 reported Xid 79",
        type_="Warning",
    )
    node = await edge_kubectl.json("get", "node", "gpu-h100-04")
    conditions = {c["type"]: c for c in node["status"]["conditions"]}
    assert conditions["GPUHealthy"]["status"] == "False"
    assert conditions["GPUHealthy"]["reason"] == "XidError"
    described = (await edge_kubectl("describe", "node", "gpu-h100-04")).out
    assert f"Taints:             {TAINT}=true:NoSchedule" in described
    assert "Unschedulable:      true" in described
    assert "GPUHealthy" in described and "GPU 5: Xid 79" in described
    events_section = described.split("Events:", 1)[1]
    assert "GPUUnhealthy" in events_section and "nodeward" in events_section
    events = (await edge_kubectl("get", "events", "-n", "default")).out
    assert "GPUUnhealthy" in events and "GPU 5 reported Xid 79" in events


async def test_kubectl_as_a_service_identity_is_bound_by_its_role(edge_kubectl: Kubectl) -> None:
    as_culler = await edge_kubectl(
        "--context", "nodeward-culler", "cordon", "gpu-h100-01", check=False
    )
    assert as_culler.rc != 0
    assert (
        'User "system:serviceaccount:nodeward:nodeward-culler" cannot get resource "nodes"'
        in as_culler.err
    )
    got = await edge_kubectl(
        "--context", "nodeward-culler", "get", "pod", "bob-jupyter-0", "-n", "ml-nlp"
    )
    assert "bob-jupyter-0" in got.out
    listed = await edge_kubectl(
        "--context", "nodeward-culler", "get", "pods", "-n", "ml-nlp", check=False
    )
    assert listed.rc != 0 and 'cannot list resource "pods"' in listed.err


async def test_auth_can_i_reflects_each_services_role(edge_kubectl: Kubectl) -> None:
    async def can(context: str, *args: str) -> str:
        result = await edge_kubectl("--context", context, "auth", "can-i", *args, check=False)
        return result.out.strip()

    assert await can("nodeward-cordon", "patch", "nodes") == "yes"
    assert (
        await can("nodeward-cordon", "create", "pods", "--subresource=eviction", "-n", "ml-nlp")
        == "yes"
    )
    assert await can("nodeward-cordon", "create", "pods", "-n", "ml-nlp") == "no"
    assert await can("nodeward-cordon", "delete", "pods", "-n", "ml-nlp") == "no"
    assert await can("nodeward-credentials", "update", "secrets", "-n", "ml-nlp") == "yes"
    assert (
        await can("nodeward-credentials", "update", "leases.coordination.k8s.io", "-n", "nodeward")
        == "yes"
    )
    assert (
        await can("nodeward-credentials", "update", "leases.coordination.k8s.io", "-n", "ml-nlp")
        == "no"
    )
    assert await can("nodeward-notifier", "get", "pods") == "yes"  # owner-email annotations
    assert await can("nodeward-notifier", "list", "pods") == "no"
    assert await can("nodeward-notifier", "patch", "namespaces") == "no"
    assert await can("nodeward-admin", "delete", "nodes") == "yes"


async def test_server_side_dry_run_changes_nothing(edge_kubectl: Kubectl, sim: SimCluster) -> None:
    # kubectl before 1.27 checks dry-run support in /openapi/v2 (protobuf), later ones in v3
    newest_kubectl = edge_kubectl
    rv = sim.store.resource_version
    out = await newest_kubectl("cordon", "gpu-h100-01", "--dry-run=server")
    assert "(server dry run)" in out.out
    await newest_kubectl("label", "node", "gpu-h100-01", "a=b", "--dry-run=server")
    await newest_kubectl(
        "drain", "gpu-a100-03", "--ignore-daemonsets", "--force", "--dry-run=server"
    )
    await newest_kubectl("delete", "pod", "-n", "ml-nlp", "bob-jupyter-0", "--dry-run=server")
    assert sim.store.resource_version == rv
    assert (
        _rows((await newest_kubectl("get", "node", "gpu-h100-01")).out)["gpu-h100-01"][0] == "Ready"
    )
    listed = await newest_kubectl(
        "get", "pods", "-A", "--field-selector", "spec.nodeName=gpu-a100-03"
    )
    assert len(listed.out.strip().splitlines()) - 1 == 8
    assert sim.evictions == []


async def test_create_and_apply_validate(edge_kubectl: Kubectl, tmp_path: Path) -> None:
    # kubectl 1.27 and later validate on the server (fieldValidation, found in /openapi/v3);
    # older ones validate against the schemas of /openapi/v2 and patch with them
    newest_kubectl = edge_kubectl
    manifest = tmp_path / "pdb.yaml"
    # policy/v1 came in 1.21: a 1.20 server (what kubectl 1.20 drives here) has v1beta1 only
    policy = "policy/v1beta1" if 0 < newest_kubectl.minor < 21 else "policy/v1"
    manifest.write_text(
        f"apiVersion: {policy}\nkind: PodDisruptionBudget\nmetadata: {{name: bob, namespace: ml-nlp}}\n"
        "spec: {minAvailable: 1, selector: {matchLabels: {notebook-name: bob-jupyter}}}\n"
    )
    assert "created" in (await newest_kubectl("create", "-f", str(manifest))).out
    pdb = await newest_kubectl.json("get", "pdb", "-n", "ml-nlp", "bob")
    assert pdb["status"]["disruptionsAllowed"] == 0
    manifest.write_text(manifest.read_text().replace("minAvailable: 1", "minAvailable: 0"))
    assert "configured" in (await newest_kubectl("apply", "-f", str(manifest))).out
    pdb = await newest_kubectl.json("get", "pdb", "-n", "ml-nlp", "bob")
    assert (pdb["spec"]["minAvailable"], pdb["status"]["disruptionsAllowed"]) == (0, 1)


def _can_i_rows(out: str) -> list[tuple[str, str, str]]:
    """(resource, non-resource URLs, verbs) of each row of `kubectl auth can-i --list`."""
    lines = out.strip().splitlines()
    header = lines[0]
    cols = [header.index(name) for name in ("Non-Resource URLs", "Resource Names", "Verbs")]
    return [
        (line[: cols[0]].strip(), line[cols[0] : cols[1]].strip(), line[cols[2] :].strip())
        for line in lines[1:]
    ]


async def test_auth_can_i_list_shows_the_service_accounts_rules(kubectl: Kubectl) -> None:
    listed = await kubectl("--context", "nodeward-cordon", "auth", "can-i", "--list")
    rows = _can_i_rows(listed.out)
    verbs = {resource: verbs for resource, _, verbs in rows if resource}
    assert verbs["nodes"] == "[get list patch watch]"
    assert verbs["nodes/status"] == "[patch]"
    assert verbs["pods/eviction"] == "[create]"
    assert verbs["selfsubjectrulesreviews.authorization.k8s.io"] == "[create]"
    assert not any(resource.startswith("secrets") for resource in verbs)
    assert ("", "[/openapi/*]", "[get]") in rows  # what every authenticated user may read
    # a Role in one namespace shows in that namespace only
    in_ns = _can_i_rows(
        (await kubectl("--context", "nodeward-credentials", "auth", "can-i", "--list")).out
    )
    assert any(r == "leases.coordination.k8s.io" for r, _, _ in in_ns)
    elsewhere = _can_i_rows(
        (
            await kubectl(
                "--context", "nodeward-credentials", "auth", "can-i", "--list", "-n", "ml-nlp"
            )
        ).out
    )
    assert not any(r == "leases.coordination.k8s.io" for r, _, _ in elsewhere)
    admin = _can_i_rows((await kubectl("auth", "can-i", "--list")).out)
    assert ("*.*", "[]", "[*]") in admin and ("", "[*]", "[*]") in admin


async def test_auth_whoami_names_the_identity(kubectl: Kubectl, sim: SimCluster) -> None:
    if 0 < kubectl.minor < 27:
        pytest.skip(f"kubectl {kubectl.version} has no `auth whoami` (it came in 1.27)")
    out = (await kubectl("--context", "nodeward-cordon", "auth", "whoami")).out
    attrs = {line.split()[0]: line.split(None, 1)[1] for line in out.strip().splitlines()[1:]}
    assert attrs["Username"] == "system:serviceaccount:nodeward:nodeward-cordon"
    assert attrs["Groups"] == (
        "[system:serviceaccounts system:serviceaccounts:nodeward system:authenticated]"
    )
    account = await kubectl.json("get", "serviceaccount", "-n", "nodeward", "nodeward-cordon")
    assert attrs["UID"] == account["metadata"]["uid"]
    admin = (await kubectl("auth", "whoami", "-o", "json")).out
    assert json.loads(admin)["status"]["userInfo"]["username"] == "nodeward-admin"


def _explained_fields(out: str) -> list[str]:
    """The field names under FIELDS: in `kubectl explain` output ("  name\t<type>" lines,
    indented by two spaces since 1.27, three before)."""
    return re.findall(r"^ {2,3}([A-Za-z0-9_$-]+)\t<", out.split("FIELDS:", 1)[-1], re.MULTILINE)


async def test_explain_shows_nested_fields(kubectl: Kubectl) -> None:
    out = (await kubectl("explain", "pods.spec.containers")).out
    assert "KIND:" in out and "Pod" in out
    assert "List of containers belonging to the pod" in out
    fields = _explained_fields(out)
    assert {"name", "image", "resources", "env", "ports"} <= set(fields), fields
    assert fields == sorted(fields)
    leaf = (await kubectl("explain", "pods.spec.containers.resources.limits")).out
    assert "Limits describes the maximum amount of compute resources allowed" in leaf


async def test_explain_knows_every_kind_the_sim_holds(edge_kubectl: Kubectl) -> None:
    for resource, kind, field in (
        ("nodes", "Node", "spec"),
        ("pods", "Pod", "spec"),
        ("namespaces", "Namespace", "status"),
        ("events", "Event", "involvedObject"),
        ("secrets", "Secret", "data"),
        ("serviceaccounts", "ServiceAccount", "secrets"),
        ("configmaps", "ConfigMap", "data"),
        ("daemonsets", "DaemonSet", "spec"),
        ("statefulsets", "StatefulSet", "spec"),
        ("leases", "Lease", "spec"),
        ("networkpolicies", "NetworkPolicy", "spec"),
        ("poddisruptionbudgets", "PodDisruptionBudget", "spec"),
        ("clusterroles", "ClusterRole", "rules"),
        ("notebooks", "Notebook", "spec"),
    ):
        out = (await edge_kubectl("explain", resource)).out
        assert kind in out.split("VERSION:", 1)[0], out
        assert field in _explained_fields(out), (resource, out)
    new_events = (await edge_kubectl("explain", "events", "--api-version=events.k8s.io/v1")).out
    assert "regarding" in _explained_fields(new_events)
    notebook = (await edge_kubectl("explain", "notebooks.spec.template.spec.containers")).out
    assert "image" in _explained_fields(notebook)


async def test_a_deployment_rolls_out_and_survives_a_drain(
    newest_kubectl: Kubectl, sim: SimCluster, tmp_path: Path
) -> None:
    """`kubectl rollout status` reads the Deployment's status as on a cluster (observed
    generation, updated and available replicas); after `kubectl drain` its pods run
    elsewhere (the ReplicaSet controller and the scheduler)."""
    kubectl = newest_kubectl
    manifest = tmp_path / "web.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: ml-nlp}\n"
        "spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n"
        "  template:\n    metadata: {labels: {app: web}}\n"
        "    spec: {containers: [{name: web, image: 'busybox:1.36'}]}\n"
    )
    await kubectl("apply", "-f", str(manifest))
    rolled = await kubectl("rollout", "status", "deployment/web", "-n", "ml-nlp", "--timeout=30s")
    assert "successfully rolled out" in rolled.out
    pods = await kubectl.json("get", "pods", "-n", "ml-nlp", "-l", "app=web")
    nodes = {p["spec"]["nodeName"] for p in pods["items"]}
    node = sorted(nodes)[0]
    await kubectl(
        "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=60s"
    )
    again = await kubectl("rollout", "status", "deployment/web", "-n", "ml-nlp", "--timeout=30s")
    assert "successfully rolled out" in again.out
    after = await kubectl.json("get", "pods", "-n", "ml-nlp", "-l", "app=web")
    live = [p for p in after["items"] if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 2 and node not in {p["spec"]["nodeName"] for p in live}
