"""What the API server does to a pod on create before it stores it, and what the
ServiceAccount controller does when a namespace is made.

From kube-apiserver's source:
- defaults (`pkg/apis/core/v1/defaults.go`: `SetDefaults_PodSpec`, `SetDefaults_Container`,
  `SetDefaults_Pod`): DNS and restart policy, the grace period, the scheduler, an empty
  security context, service links; each container's termination message path and policy and
  its image pull policy; requests copied from limits where unset;
- admission, in the default plugin order: `ServiceAccount` (the pod runs as `default` unless
  it names one, which must exist, else 403; its token is mounted as the projected volume
  `kube-api-access-xxxxx` in every container without a mount at the token path),
  `DefaultTolerationSeconds` (300 s for `node.kubernetes.io/not-ready` and `unreachable`),
  `Priority` (priority 0, `PreemptLowerPriority`);
- the pod strategy's `PrepareForCreate` (`pkg/registry/core/pod/strategy.go`): whatever
  status was sent is dropped; the pod is `Pending`, with its QoS class.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from sim.cluster.errors import ApiError

Obj = dict[str, Any]

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
VOLUME_PREFIX = "kube-api-access"
DEFAULT_ACCOUNT = "default"
_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def default_account(namespace: str) -> Obj:
    """The ServiceAccount the ServiceAccount controller makes in every namespace."""
    return {"metadata": {"name": DEFAULT_ACCOUNT, "namespace": namespace}}


def pod(obj: Obj, namespace: str, accounts: dict[str, Obj]) -> None:
    """Default and admit a pod being created (in place); `accounts`: the namespace's
    ServiceAccounts by name. Idempotent: run again when webhooks are reinvoked."""
    spec = obj.setdefault("spec", {})
    _spec_defaults(spec)
    _service_account(obj, spec, namespace, accounts)
    _tolerations(spec)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")


def pod_prepare(obj: Obj) -> None:
    """The pod strategy's `PrepareForCreate`, after admission (webhooks included): whatever
    status was sent is dropped; the pod is `Pending`, with its QoS class."""
    obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}


def scheme_defaults(group: str, kind: str, obj: Obj) -> Obj:
    """The scheme's defaults of a decoded object, as the API server applies them again to
    what a mutating webhook returned (pods' and workloads'; in place, and returned)."""
    if group == "" and kind == "Pod":
        _spec_defaults(obj.setdefault("spec", {}))
    elif group in ("apps", "batch") and kind in WORKLOADS:
        workload(kind, obj)
    return obj


def _spec_defaults(spec: Obj) -> None:
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("imagePullPolicy", _pull_policy(str(c.get("image") or "")))
            resources = c.setdefault("resources", {})
            limits = resources.get("limits") or {}
            if limits:
                requests = resources.setdefault("requests", {})
                for name, value in limits.items():
                    requests.setdefault(name, value)
            for port in c.get("ports") or []:
                port.setdefault("protocol", "TCP")


def _pull_policy(image: str) -> str:
    """`Always` for `:latest` or an image with neither tag nor digest, else `IfNotPresent`."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _service_account(obj: Obj, spec: Obj, namespace: str, accounts: dict[str, Obj]) -> None:
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or DEFAULT_ACCOUNT
    spec["serviceAccountName"] = spec["serviceAccount"] = name
    account = accounts.get(name)
    if account is None:
        pod_name = (obj.get("metadata") or {}).get("name", "")
        raise ApiError(
            403,
            "Forbidden",
            f'pods "{pod_name}" is forbidden: error looking up service account '
            f'{namespace}/{name}: serviceaccount "{name}" not found',
            details={"name": pod_name, "kind": "pods"},
        )
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        automount = account.get("automountServiceAccountToken")
    if automount is False:
        return
    volumes = spec.setdefault("volumes", [])
    volume = next(
        (v["name"] for v in volumes if str(v.get("name", "")).startswith(f"{VOLUME_PREFIX}-")),
        None,
    )
    name = volume or f"{VOLUME_PREFIX}-{uuid.uuid4().hex[:5]}"
    needed = False
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            mounts = c.setdefault("volumeMounts", [])
            if not any(m.get("mountPath") == MOUNT_PATH for m in mounts):
                mounts.append({"name": name, "readOnly": True, "mountPath": MOUNT_PATH})
                needed = True
    if needed and volume is None:
        volumes.append(_token_volume(name))


def _token_volume(name: str) -> Obj:
    return {
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


def _tolerations(spec: Obj) -> None:
    tolerations = spec.setdefault("tolerations", [])
    for key in _TOLERATED:
        if any(
            t.get("key") in (key, None, "") and t.get("effect") in ("NoExecute", None, "")
            for t in tolerations
        ):
            continue
        tolerations.append(
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        )


def qos_class(spec: Obj) -> str:
    """`Guaranteed`, `Burstable` or `BestEffort`, as `pkg/apis/core/helper/qos` decides
    from the containers' CPU and memory requests and limits."""
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    requests: dict[str, bool] = {}
    guaranteed = True
    any_set = False
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for r in ("cpu", "memory"):
            if r in req or r in lim:
                any_set = True
            if r not in lim or str(req.get(r, lim.get(r))) != str(lim.get(r)):
                guaranteed = False
        requests.update(dict.fromkeys(req, True))
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def running_status(pod_obj: Obj, host_ip: str, pod_ip: str, at: str) -> Obj:
    """The status a kubelet reports once it has started every container of a pod."""
    spec = pod_obj.get("spec") or {}
    status = copy.deepcopy(pod_obj.get("status") or {})
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    ]
    conditions.append(
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
    )
    status.update(
        {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": at,
            "containerStatuses": [
                {
                    "name": c.get("name"),
                    "image": c.get("image"),
                    "imageID": "",
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": at}},
                }
                for c in spec.get("containers") or []
            ],
        }
    )
    return status


WORKLOADS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "Job"})
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def workload(kind: str, obj: Obj) -> None:
    """The API server's defaults for a workload (`pkg/apis/apps/v1/defaults.go`,
    `pkg/apis/batch/v1/defaults.go`) and its pod template's, in place."""
    spec = obj.setdefault("spec", {})
    template_spec = (spec.get("template") or {}).get("spec")
    if isinstance(template_spec, dict):
        _spec_defaults(template_spec)
    if kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        spec.setdefault("replicas", 1)
    if kind == "Deployment":
        spec.setdefault(
            "strategy",
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
        )
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
    elif kind == "StatefulSet":
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault(
            "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
        )
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault(
            "persistentVolumeClaimRetentionPolicy",
            {"whenDeleted": "Retain", "whenScaled": "Retain"},
        )
    elif kind == "Job":
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        if isinstance(template_spec, dict):
            template_spec.setdefault("restartPolicy", "Never")


def job_selector(obj: Obj) -> None:
    """`jobStrategy.PrepareForCreate` / `generateSelector`: unless `manualSelector`, the
    selector is the Job's uid and its pods carry it and the Job's name as labels."""
    spec = obj.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    uid, name = obj["metadata"]["uid"], obj["metadata"]["name"]
    labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
    for key in JOB_UID_LABELS:
        labels[key] = uid
    for key in JOB_NAME_LABELS:
        labels[key] = name
    spec["selector"] = {"matchLabels": {JOB_UID_LABELS[0]: uid}}


def service(obj: Obj, cluster_ip: str) -> None:
    """A Service's defaults (`pkg/apis/core/v1/defaults.go` `SetDefaults_Service`) and its
    allocated cluster IP (`cluster_ip`, unless it is headless)."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec["type"] != "ExternalName":
        if spec.get("clusterIP") != "None":
            spec["clusterIP"] = spec.get("clusterIP") or cluster_ip
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
