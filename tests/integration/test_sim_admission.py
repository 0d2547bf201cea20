"""The sim cluster defaults and admits a pod as the API server does, and its kubelets start it.

Sources: `pkg/apis/core/v1/defaults.go` (`SetDefaults_PodSpec`, `SetDefaults_Container`),
`plugin/pkg/admission/serviceaccount/admission.go` (the `default` account, 403 for a missing
one, the `kube-api-access-` projected volume mounted at the token path),
`plugin/pkg/admission/defaulttolerationseconds`, `pkg/registry/core/pod/strategy.go`
(`PrepareForCreate`: status dropped, `Pending`, the QoS class), and the ServiceAccount
controller (`pkg/controller/serviceaccount`: every namespace gets `default`).
"""

from __future__ import annotations

from typing import Any

from sim.cluster import SimCluster
from tests.conftest import wait_for
from tests.integration.simkube import sim_http

MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _pod(name: str, *, node: str | None = "gpu-h100-01", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


async def test_a_new_namespace_gets_its_default_service_account(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        made = await http.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}},
        )
        assert made.status_code == 201, made.text
        account = await http.get("/api/v1/namespaces/team-a/serviceaccounts/default")
        assert account.status_code == 200
        created = await http.post("/api/v1/namespaces/team-a/pods", json=_pod("first"))
        assert created.status_code == 201, created.text


async def test_a_created_pod_is_pending_then_its_kubelet_runs_it(sim: SimCluster) -> None:
    body = _pod("p1") | {"status": {"phase": "Succeeded"}}
    async with sim_http(sim) as http:
        created = await http.post("/api/v1/namespaces/ml-nlp/pods", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["status"] == {"phase": "Pending", "qosClass": "BestEffort"}

        async def running() -> dict[str, Any] | None:
            pod = (await http.get("/api/v1/namespaces/ml-nlp/pods/p1")).json()
            return pod if pod["status"]["phase"] == "Running" else None

        pod = await wait_for(running, timeout=5, what="the kubelet to start the pod")
    status = pod["status"]
    ready = {c["type"]: c["status"] for c in status["conditions"]}
    assert ready["Ready"] == "True" and ready["PodScheduled"] == "True"
    assert status["podIP"] and status["hostIP"] and status["startTime"]
    assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert status["qosClass"] == "BestEffort"


async def test_a_pod_bound_to_no_node_stays_pending(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        loose = _pod("loose", node=None)  # for a scheduler that does not run: none binds it
        loose["spec"]["schedulerName"] = "no-such-scheduler"
        created = await http.post("/api/v1/namespaces/ml-nlp/pods", json=loose)
        assert created.status_code == 201
        # the kubelet's turn of the loop has come and gone when a second request is answered
        await http.get("/api/v1/namespaces/ml-nlp/pods")
        pod = (await http.get("/api/v1/namespaces/ml-nlp/pods/loose")).json()
    assert pod["status"]["phase"] == "Pending"


async def test_pod_defaults_and_admission(sim: SimCluster) -> None:
    body = _pod("defaults")
    body["spec"]["containers"].append(
        {"name": "side", "image": "registry.example/tool", "resources": {"limits": {"cpu": "1"}}}
    )
    async with sim_http(sim) as http:
        created = (await http.post("/api/v1/namespaces/ml-nlp/pods", json=body)).json()
    spec = created["spec"]
    assert (spec["restartPolicy"], spec["dnsPolicy"], spec["schedulerName"]) == (
        "Always",
        "ClusterFirst",
        "default-scheduler",
    )
    assert spec["terminationGracePeriodSeconds"] == 30
    assert (spec["serviceAccountName"], spec["serviceAccount"]) == ("default", "default")
    assert (spec["priority"], spec["enableServiceLinks"]) == (0, True)
    main, side = spec["containers"]
    assert (main["imagePullPolicy"], side["imagePullPolicy"]) == ("IfNotPresent", "Always")
    assert main["terminationMessagePath"] == "/dev/termination-log"
    assert side["resources"]["requests"] == {"cpu": "1"}, "requests default to the limits"
    tolerated = {t["key"]: t for t in spec["tolerations"]}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert tolerated[key]["effect"] == "NoExecute"
        assert tolerated[key]["tolerationSeconds"] == 300
    volume = next(v for v in spec["volumes"] if v["name"].startswith("kube-api-access-"))
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    for c in spec["containers"]:
        assert {"name": volume["name"], "readOnly": True, "mountPath": MOUNT} in c["volumeMounts"]
    assert created["status"]["qosClass"] == "Burstable"


async def test_no_token_when_the_pod_says_so(sim: SimCluster) -> None:
    body = _pod("quiet", automountServiceAccountToken=False)
    async with sim_http(sim) as http:
        created = (await http.post("/api/v1/namespaces/ml-nlp/pods", json=body)).json()
    assert not created["spec"].get("volumes")
    assert not created["spec"]["containers"][0].get("volumeMounts")


async def test_a_missing_service_account_is_forbidden(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.post(
            "/api/v1/namespaces/ml-nlp/pods", json=_pod("orphan", serviceAccountName="ghost")
        )
        assert answer.status_code == 403, answer.text
        assert answer.json()["message"] == (
            'pods "orphan" is forbidden: error looking up service account ml-nlp/ghost: '
            'serviceaccount "ghost" not found'
        )
        assert (await http.get("/api/v1/namespaces/ml-nlp/pods/orphan")).status_code == 404


async def test_a_create_sets_no_status_but_a_nodes(sim: SimCluster) -> None:
    """The strategies' `PrepareForCreate`: status is written through `/status` (a controller's,
    a kubelet's); a node registers with its own; a namespace is `Active`."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
        },
        "status": {"replicas": 3, "readyReplicas": 3},
    }
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "joined"},
        "status": {"capacity": {"cpu": "8"}},
    }
    async with sim_http(sim) as http:
        made = await http.post("/apis/apps/v1/namespaces/ml-nlp/deployments", json=deployment)
        assert made.status_code == 201, made.text
        assert not made.json().get("status")
        registered = await http.post("/api/v1/nodes", json=node)
        assert registered.json()["status"]["capacity"] == {"cpu": "8"}
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}}
        made = (await http.post("/api/v1/namespaces", json=namespace)).json()
        assert made["status"] == {"phase": "Active"}
        assert made["spec"]["finalizers"] == ["kubernetes"]
