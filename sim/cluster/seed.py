"""The seed file: what the sim cluster holds when it starts.

A YAML file with short forms for nodes (GPU labels and capacity), pods (notebooks, SSH
sessions, training jobs, daemons, each with its owner), Notebooks, PodDisruptionBudgets and
Secrets, plus `objects:` for any other manifest as-is, and `checkpoint.fail` to make chosen
containers fail checkpointing the way a CRI runtime without CRIU does.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from collections import Counter
from datetime import UTC, datetime
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.cluster.resources import by_kind, lookup
from sim.cluster.store import Store, now
from sim.nvml import gpu_uuid, model_for, pci_bus_id

DEFAULT_SEED = "default-seed.yaml"
CRIU_MISSING = "checkpoint/restore support not available"


class SeedError(ValueError):
    """A seed file that cannot be read or does not validate. `str()` is one line."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Gpu(_Model):
    vendor: Literal["nvidia", "amd"] = "nvidia"
    """nvidia: the GPU operator's `nvidia.com/gpu.*` labels and `nvidia.com/gpu`; amd: the
    AMD GPU operator's node labeller (`amd.com/gpu.*`) and `amd.com/gpu`."""
    product: str = "NVIDIA-H100-80GB-HBM3"
    count: int = Field(default=8, ge=0)
    memory_mib: int = Field(default=81559, alias="memoryMiB")
    family: str = "hopper"
    driver: str = "550.90.07"


class Mig(_Model):
    strategy: Literal["single", "mixed"] = "mixed"
    config: str = "all-balanced"
    devices: dict[str, int] = Field(
        default_factory=dict, description="profile -> count, e.g. 1g.10gb: 14"
    )


class Dra(_Model):
    """GPUs served through DRA: no `nvidia.com/gpu` extended resource, one ResourceSlice of
    the driver's devices (`gpu-0`..), as the NVIDIA DRA driver's kubelet plugin publishes."""

    driver: str = "gpu.nvidia.com"
    cuda_driver: str = Field(default="12.4.0", alias="cudaDriver")


class NodeSeed(_Model):
    name: str
    gpu: Gpu | None = Field(default_factory=Gpu)
    mig: Mig | None = None
    dra: Dra | None = None
    cpu: str = "224"
    memory: str = "2063500Mi"
    instance_type: str = Field(default="p5.48xlarge", alias="instanceType")
    zone: str = "zone-a"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[dict[str, Any]] = Field(default_factory=list)
    unschedulable: bool = False
    ready: bool = True


class Owner(_Model):
    kind: str
    name: str
    api_version: str = Field(default="", alias="apiVersion")


class ContainerSeed(_Model):
    name: str
    image: str = "registry.example.com/ml/base:2024.06"


class PodSeed(_Model):
    name: str
    namespace: str
    node: str
    role: Literal["notebook", "ssh", "training", "daemon", "system"] = "training"
    owner: Owner | None = None
    gpus: int = 0
    gpu_resource: str = Field(default="nvidia.com/gpu", alias="gpuResource")
    containers: list[ContainerSeed] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    phase: Literal["Pending", "Running", "Succeeded", "Failed"] = "Running"
    ready: bool = True
    empty_dir: bool = Field(default=False, alias="emptyDir")


class NotebookSeed(_Model):
    name: str
    namespace: str
    image: str = "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.8.0"
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: int = 1


class PdbSeed(_Model):
    name: str
    namespace: str
    selector: dict[str, str]
    min_available: int | str | None = Field(default=None, alias="minAvailable")
    max_unavailable: int | str | None = Field(default=None, alias="maxUnavailable")


class SecretSeed(_Model):
    name: str
    namespace: str
    type: str = "Opaque"
    string_data: dict[str, str] = Field(default_factory=dict, alias="stringData")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class CheckpointFailure(_Model):
    namespace: str
    pod: str
    container: str = "*"
    message: str = CRIU_MISSING


class CheckpointSeed(_Model):
    fail: list[CheckpointFailure] = Field(default_factory=list)


class NamespaceMeta(_Model):
    """Labels and annotations a seeded namespace carries (a Kubeflow profile's owner, an
    opt-in)."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Seed(_Model):
    """The whole seed file."""

    namespaces: list[str] = Field(default_factory=list)
    namespace_meta: dict[str, NamespaceMeta] = Field(default_factory=dict)
    """by namespace name (the namespace is made if no other entry names it)"""
    nodes: list[NodeSeed] = Field(default_factory=list)
    pods: list[PodSeed] = Field(default_factory=list)
    notebooks: list[NotebookSeed] = Field(default_factory=list)
    pdbs: list[PdbSeed] = Field(default_factory=list)
    secrets: list[SecretSeed] = Field(default_factory=list)
    objects: list[dict[str, Any]] = Field(default_factory=list)
    checkpoint: CheckpointSeed = Field(default_factory=CheckpointSeed)

    def fails_checkpoint(
        self, namespace: str, pod: str, container: str
    ) -> CheckpointFailure | None:
        for f in self.checkpoint.fail:
            if f.namespace == namespace and f.pod == pod and f.container in ("*", container):
                return f
        return None


def load_seed(path: Path | None = None) -> Seed:
    """The seed at `path`, or the default one shipped with nodeward."""
    try:
        if path is None:
            text = importlib_resources.files("sim.cluster").joinpath(DEFAULT_SEED).read_text()
            where = "the default seed"
        else:
            text = path.read_text()
            where = str(path)
    except OSError as exc:
        raise SeedError(f"cannot read seed {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise SeedError(f"seed {where} is not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return Seed.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise SeedError(f"invalid seed {where}: {loc}: {err['msg']}") from None


AMD_GPU = "amd.com/gpu"
# What the AMD GPU operator's node labeller reads from each model (device id, CUs, SIMDs).
_AMD_SHAPES = {"MI300X": ("74a1", 304, 1216), "MI325X": ("74a5", 304, 1216)}


def amd_gpu_labels(gpu: Gpu) -> dict[str, str]:
    """The AMD GPU operator's labels for a node of `gpu`s (its node labeller and NFD rule)."""
    shape = next((v for k, v in _AMD_SHAPES.items() if k in gpu.product.upper()), None)
    device_id, cus, simds = shape or ("74a1", 304, 1216)
    labels = {
        "feature.node.kubernetes.io/amd-gpu": "true",
        "amd.com/gpu.product-name": gpu.product,
        "amd.com/gpu.device-id": device_id,
        "amd.com/gpu.family": gpu.family,
        "amd.com/gpu.cu-count": str(cus),
        "amd.com/gpu.simd-count": str(simds),
        "amd.com/gpu.vram": f"{round(gpu.memory_mib / 1024)}G",
        "amd.com/gpu.driver-version": gpu.driver,
    }
    return labels


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def node_manifest(n: NodeSeed, index: int, kubelet_version: str = "v1.37.0") -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": n.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": n.instance_type,
        "topology.kubernetes.io/zone": n.zone,
    }
    capacity: dict[str, str] = {
        "cpu": n.cpu,
        "memory": n.memory,
        "pods": "110",
        "ephemeral-storage": "3750Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    if n.gpu is not None and n.gpu.vendor == "amd":
        labels |= amd_gpu_labels(n.gpu) | {"nodeward.io/gpu-health": "healthy"}
        capacity[AMD_GPU] = str(n.gpu.count)
    elif n.gpu is not None:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": n.gpu.product,
            "nvidia.com/gpu.count": str(n.gpu.count),
            "nvidia.com/gpu.memory": str(n.gpu.memory_mib),
            "nvidia.com/gpu.family": n.gpu.family,
            "nvidia.com/cuda.driver.major": n.gpu.driver.split(".")[0],
            "nvidia.com/mig.capable": "true"
            if "A100" in n.gpu.product or "H100" in n.gpu.product
            else "false",
            "nodeward.io/gpu-health": "healthy",
        }
        if n.dra is None:  # a DRA node publishes its GPUs in ResourceSlices instead
            capacity["nvidia.com/gpu"] = str(n.gpu.count)
    if n.mig is not None:
        labels |= {
            "nvidia.com/mig.strategy": n.mig.strategy,
            "nvidia.com/mig.config": n.mig.config,
            "nvidia.com/mig.config.state": "success",
        }
        capacity["nvidia.com/gpu"] = "0"
        for profile, count in n.mig.devices.items():
            capacity[f"nvidia.com/mig-{profile}"] = str(count)
            labels[f"nvidia.com/mig-{profile}.count"] = str(count)
    labels |= n.labels
    stamp = now()
    ready = {
        "type": "Ready",
        "status": "True" if n.ready else "False",
        "reason": "KubeletReady" if n.ready else "KubeletNotReady",
        "message": "kubelet is posting ready status" if n.ready else "container runtime is down",
    }
    conditions = [
        {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": m}
        for t, r, m in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ] + [ready]
    for c in conditions:
        c["lastHeartbeatTime"] = stamp
        c["lastTransitionTime"] = stamp
    spec: dict[str, Any] = {
        "podCIDR": f"10.244.{index}.0/24",
        "podCIDRs": [f"10.244.{index}.0/24"],
        "providerID": f"sim://{n.name}",
    }
    if n.taints:
        spec["taints"] = n.taints
    if n.unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n.name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                **n.annotations,
            },
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.0.{10 + index}"},
                {"type": "Hostname", "address": n.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": _digest("machine", n.name)[:32],
                "systemUUID": _digest("uuid", n.name)[:32],
                "bootID": _digest("boot", n.name)[:32],
                "kernelVersion": "5.15.0-119-generic",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


_COMPUTE_CAPABILITY = {"ampere": "8.0.0", "hopper": "9.0.0", "blackwell": "10.0.0"}


def resource_slice_manifest(n: NodeSeed) -> dict[str, Any] | None:
    """The ResourceSlice the NVIDIA DRA driver publishes for a DRA node's GPUs (one pool per
    node, named after it; devices `gpu-<index>` with its GpuInfo attributes), or None."""
    if n.dra is None or n.gpu is None:
        return None
    model = model_for(n.gpu.product)
    major, minor, patch = [*n.gpu.driver.split("."), "0", "0"][:3]
    devices = []
    for i in range(n.gpu.count):
        devices.append(
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": gpu_uuid(n.name, i)},
                    "productName": {"string": model.name},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": n.gpu.family.capitalize()},
                    "cudaComputeCapability": {
                        "version": _COMPUTE_CAPABILITY.get(n.gpu.family, "9.0.0")
                    },
                    "driverVersion": {"version": f"{int(major)}.{int(minor)}.{int(patch)}"},
                    "cudaDriverVersion": {"version": n.dra.cuda_driver},
                    "pcieBusID": {"string": pci_bus_id(i).lower()[4:]},
                },
                "capacity": {"memory": {"value": f"{n.gpu.memory_mib}Mi"}},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{n.name}-{n.dra.driver}-{_digest('slice', n.name)[:5]}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": n.name, "uid": "", "controller": True}
            ],
        },
        "spec": {
            "driver": n.dra.driver,
            "nodeName": n.name,
            "pool": {"name": n.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


_OWNER_API = {
    "StatefulSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1",
    "Notebook": "kubeflow.org/v1",
}


def pod_manifest(p: PodSeed, owner_uid: str | None, pod_ip: str, host_ip: str) -> dict[str, Any]:
    containers = p.containers or [
        ContainerSeed(name=p.owner.name if p.role == "notebook" and p.owner else "main")
    ]
    stamp = now()
    limits = {p.gpu_resource: str(p.gpus)} if p.gpus else {}
    specs = []
    statuses = []
    for n, c in enumerate(containers):
        res: dict[str, Any] = {
            "requests": {"cpu": "4", "memory": "32Gi"},
            "limits": {"memory": "32Gi"},
        }
        if n == 0 and limits:
            res["requests"] |= limits
            res["limits"] |= limits
        specs.append(
            {
                "name": c.name,
                "image": c.image,
                "resources": res,
                "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }
        )
        running = p.phase == "Running"
        statuses.append(
            {
                "name": c.name,
                "image": c.image,
                "imageID": f"{c.image.split(':')[0]}@sha256:{_digest(c.image)}",
                "containerID": f"containerd://{_digest(p.namespace, p.name, c.name)}",
                "ready": running and p.ready,
                "started": running,
                "restartCount": 0,
                "state": {"running": {"startedAt": stamp}}
                if running
                else {
                    "terminated": {
                        "exitCode": 0 if p.phase == "Succeeded" else 1,
                        "reason": "Completed" if p.phase == "Succeeded" else "Error",
                        "startedAt": stamp,
                        "finishedAt": stamp,
                    }
                }
                if p.phase in ("Succeeded", "Failed")
                else {"waiting": {"reason": "ContainerCreating"}},
            }
        )
    labels = {"nodeward.io/role": p.role} | p.labels
    meta: dict[str, Any] = {"name": p.name, "namespace": p.namespace, "labels": labels}
    if p.annotations:
        meta["annotations"] = p.annotations
    if p.owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": p.owner.api_version or _OWNER_API.get(p.owner.kind, "v1"),
                "kind": p.owner.kind,
                "name": p.owner.name,
                "uid": owner_uid or _uid(p.namespace, p.owner.kind, p.owner.name),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    volumes: list[dict[str, Any]] = [
        {
            "name": f"kube-api-access-{hashlib.sha256(p.name.encode()).hexdigest()[:5]}",
            "projected": {
                "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]
            },
        }
    ]
    if p.empty_dir:
        volumes.append({"name": "scratch", "emptyDir": {}})
    ready_state = "True" if p.phase == "Running" and p.ready else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": p.node,
            "containers": specs,
            "restartPolicy": "Never" if p.role == "training" else "Always",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "volumes": volumes,
            "tolerations": _node_tolerations(p)
            + (
                [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                if p.gpus
                else []
            ),
        },
        "status": {
            "phase": p.phase,
            "hostIP": host_ip,
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": stamp,
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": stamp}
                for t, s in (
                    ("PodReadyToStartContainers", "True"),
                    ("Initialized", "True"),
                    ("Ready", ready_state),
                    ("ContainersReady", ready_state),
                    ("PodScheduled", "True"),
                )
            ],
            "containerStatuses": statuses,
        },
    }


def _node_tolerations(p: PodSeed) -> list[dict[str, Any]]:
    """A pod's tolerations of the node lifecycle's taints: 300 s of `not-ready` and
    `unreachable` (admission's `DefaultTolerationSeconds`), or, for a DaemonSet's pod, those
    and the pressure and `unschedulable` taints for ever, as the DaemonSet controller adds
    them (`pkg/controller/daemon/util` `AddOrUpdateDaemonPodTolerations`)."""
    if p.owner is not None and p.owner.kind == "DaemonSet":
        keys = [
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ]
        return [{"key": k, "operator": "Exists", "effect": e} for k, e in keys]
    return [
        {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]


def _uid(*parts: str) -> str:
    d = _digest(*parts)
    return f"{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


def apply_seed(store: Store, seed: Seed, *, kubelet_version: str = "v1.37.0") -> None:
    """Create every seeded object in `store`."""
    namespaces = ["default", "kube-system", "kube-public", "kube-node-lease", *seed.namespaces]
    namespaces += [p.namespace for p in seed.pods] + [b.namespace for b in seed.notebooks]
    namespaces += [b.namespace for b in seed.pdbs] + [s.namespace for s in seed.secrets]
    namespaces += [o.get("metadata", {}).get("namespace", "") for o in seed.objects]
    namespaces += list(seed.namespace_meta)
    ns_rt = lookup("", "v1", "namespaces")
    assert ns_rt is not None
    for ns in dict.fromkeys(n for n in namespaces if n):
        if store.find(ns_rt, "", ns) is None:
            meta = seed.namespace_meta.get(ns) or NamespaceMeta()
            labels = {**meta.labels, "kubernetes.io/metadata.name": ns}
            annotations = {"annotations": dict(meta.annotations)} if meta.annotations else {}
            store.create(
                ns_rt,
                "",
                {
                    "metadata": {"name": ns, "labels": labels, **annotations},
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                },
            )
    for obj in seed.objects:
        rt = by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rt is None:
            raise SeedError(
                f"seed object of unknown kind {obj.get('apiVersion')}/{obj.get('kind')}"
            )
        store.put_raw(rt, obj)
    node_rt = lookup("", "v1", "nodes")
    assert node_rt is not None
    host_ips: dict[str, str] = {}
    lease_rt = lookup("coordination.k8s.io", "v1", "leases")
    slice_rt = lookup("resource.k8s.io", "v1", "resourceslices")
    assert lease_rt is not None and slice_rt is not None
    for i, n in enumerate(seed.nodes):
        node = store.create(node_rt, "", node_manifest(n, i, kubelet_version))
        host_ips[n.name] = node["status"]["addresses"][0]["address"]
        renewed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        store.create(
            lease_rt,
            "kube-node-lease",
            {  # the kubelet's heartbeat
                "metadata": {
                    "name": n.name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": n.name,
                            "uid": node["metadata"]["uid"],
                        }
                    ],
                },
                "spec": {
                    "holderIdentity": n.name,
                    "leaseDurationSeconds": 40,
                    "renewTime": renewed,
                },
            },
        )
        dra_slice = resource_slice_manifest(n)
        if dra_slice is not None:
            dra_slice["metadata"]["ownerReferences"][0]["uid"] = node["metadata"]["uid"]
            store.create(slice_rt, "", dra_slice)
    nb_rt = lookup("kubeflow.org", "v1", "notebooks")
    assert nb_rt is not None
    for nb in seed.notebooks:
        store.put_raw(
            nb_rt,
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Notebook",
                "metadata": {
                    "name": nb.name,
                    "namespace": nb.namespace,
                    "labels": {"app": nb.name} | nb.labels,
                    "annotations": nb.annotations,
                },
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": nb.name,
                                    "image": nb.image,
                                    "resources": {"limits": {"nvidia.com/gpu": str(nb.gpus)}}
                                    if nb.gpus
                                    else {},
                                }
                            ]
                        }
                    }
                },
                "status": {
                    "readyReplicas": 1,
                    "containerState": {"running": {"startedAt": now()}},
                    "conditions": [],
                },
            },
        )
    owner_uids: dict[tuple[str, str, str], str] = {}
    node_index = {n.name: i for i, n in enumerate(seed.nodes)}
    pod_counts: dict[str, int] = {}
    owned = Counter((p.namespace, p.owner.kind, p.owner.name) for p in seed.pods if p.owner)
    for p in seed.pods:
        count = pod_counts[p.node] = pod_counts.get(p.node, 0) + 1
        pod_ip = f"10.244.{node_index.get(p.node, 250)}.{10 + count}"
        pod_rt = lookup("", "v1", "pods")
        assert pod_rt is not None
        manifest = pod_manifest(p, None, pod_ip, host_ips.get(p.node, "10.0.0.250"))
        if p.owner is not None:
            manifest["metadata"].setdefault("labels", {}).update(owner_selector(p))
            key = (p.namespace, p.owner.kind, p.owner.name)
            if key not in owner_uids:
                owner_uids[key] = _ensure_owner(store, p, manifest, owned[key])
            manifest["metadata"]["ownerReferences"][0]["uid"] = owner_uids[key]
        created = store.create(pod_rt, p.namespace, manifest)
        # The API server makes a new pod Pending; its kubelet then reports how it runs.
        created["status"] = {**created["status"], **manifest["status"]}
        store.update(pod_rt, p.namespace, p.name, created, subresource="status")
    pdb_rt = lookup("policy", "v1", "poddisruptionbudgets")
    assert pdb_rt is not None
    for b in seed.pdbs:
        spec: dict[str, Any] = {"selector": {"matchLabels": b.selector}}
        if b.min_available is not None:
            spec["minAvailable"] = b.min_available
        if b.max_unavailable is not None:
            spec["maxUnavailable"] = b.max_unavailable
        store.create(
            pdb_rt,
            b.namespace,
            {"metadata": {"name": b.name, "namespace": b.namespace}, "spec": spec},
        )
    secret_rt = lookup("", "v1", "secrets")
    assert secret_rt is not None
    for s in seed.secrets:
        store.create(
            secret_rt,
            s.namespace,
            {
                "metadata": {
                    "name": s.name,
                    "namespace": s.namespace,
                    "labels": s.labels,
                    "annotations": s.annotations,
                },
                "type": s.type,
                "data": {
                    k: base64.b64encode(v.encode()).decode() for k, v in s.string_data.items()
                },
            },
        )


def owner_selector(p: PodSeed) -> dict[str, str]:
    """The label selector of the controller the seed makes for `p`'s owner: its pods carry
    it, as the pods a controller makes from its template do."""
    assert p.owner is not None
    selector = {
        k: v for k, v in p.labels.items() if k in ("app", "statefulset", "notebook-name", "name")
    }
    return selector or {"app": p.owner.name}


def _ensure_owner(store: Store, p: PodSeed, manifest: dict[str, Any], pods: int) -> str:
    """Create the pod's controller if the sim serves its kind, with `pods` replicas made
    from the pod's `manifest` (so that what it creates again is the same pod); its uid
    either way."""
    assert p.owner is not None
    api_version = p.owner.api_version or _OWNER_API.get(p.owner.kind, "v1")
    rt = by_kind(api_version, p.owner.kind)
    if rt is None or rt.kind == "Notebook":
        existing = store.find(rt, p.namespace, p.owner.name) if rt else None
        return (
            existing["metadata"]["uid"]
            if existing
            else _uid(p.namespace, p.owner.kind, p.owner.name)
        )
    existing = store.find(rt, p.namespace, p.owner.name)
    if existing:
        return str(existing["metadata"]["uid"])
    selector = owner_selector(p)
    template_meta = {
        k: copy.deepcopy(v)
        for k, v in manifest["metadata"].items()
        if k in ("labels", "annotations")
    }
    template_meta.setdefault("labels", {}).update(selector)
    template_spec = {k: copy.deepcopy(v) for k, v in manifest["spec"].items() if k != "nodeName"}
    template_spec["volumes"] = [
        v for v in template_spec.get("volumes") or [] if not v["name"].startswith("kube-api-access")
    ]
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector},
        "template": {"metadata": template_meta, "spec": template_spec},
    }
    if rt.kind == "Job":
        spec |= {"manualSelector": True, "parallelism": pods, "completions": pods}
    elif rt.kind != "DaemonSet":
        spec["replicas"] = pods
    meta: dict[str, Any] = {"name": p.owner.name, "namespace": p.namespace}
    notebooks = by_kind("kubeflow.org/v1", "Notebook")
    notebook = store.find(notebooks, p.namespace, p.owner.name) if notebooks else None
    if rt.kind == "StatefulSet" and notebook is not None:
        # Kubeflow's notebook controller runs a Notebook as the StatefulSet of its name,
        # which it controls (`generateStatefulSet`, `SetControllerReference`).
        meta["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Notebook",
                "name": p.owner.name,
                "uid": notebook["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    obj = store.create(rt, p.namespace, {"metadata": meta, "spec": spec})
    return str(obj["metadata"]["uid"])
