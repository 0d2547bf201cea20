"""Restoring a checkpointed pod elsewhere: which maintenance checkpointed it, and the image
builds and pod manifest that run it on another node. Pure: it executes nothing;
`nodeward maintenance restore` prints it. Light to import (the command line loads it)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from typing import Any

from services.maintenance.state import CUDA_CHECKPOINT_LABEL, MaintenanceState, PodPlan

CHECKPOINT_NAME_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"


def restorable(
    states: Iterable[MaintenanceState], pod: str
) -> tuple[MaintenanceState, PodPlan] | str:
    """The newest maintenance that checkpointed `pod` (`namespace/name`) and its plan, or why
    there is none."""
    ordered = sorted(states, key=lambda s: s.requested_at, reverse=True)
    for state in ordered:
        plan = state.pods.get(pod)
        if plan is not None and plan.status == "checkpointed" and plan.checkpoints:
            return state, plan
    known = [s.pods[pod] for s in ordered if pod in s.pods]
    if not known:
        return f"no checkpoint recorded for pod {pod}"
    why = known[0].reason or {
        "not_opted_in": "it did not opt in (label nodeward.io/checkpoint=true)",
        "pending": "its checkpoint is still to be taken",
    }.get(known[0].status, known[0].status)
    return f"pod {pod} has no recorded checkpoint: {why}"


def restore_plan(state: MaintenanceState, plan: PodPlan, registry: str) -> dict[str, Any]:
    """The image builds (one per container) and the pod manifest that runs it elsewhere.

    Pure: it executes nothing; `nodeward maintenance restore` prints it.
    """
    stamp = min((c.at for c in plan.checkpoints if c.at), default=state.requested_at)
    tag = stamp.strftime("%Y%m%d%H%M%S")
    images: dict[str, str] = {}
    builds: list[dict[str, Any]] = []
    for record in plan.checkpoints:
        container = record.pod.container or ""
        image = f"{registry.rstrip('/')}/checkpoint-{plan.namespace}-{plan.name}-{container}:{tag}"
        images[container] = image
        archive = record.path or ""
        builds.append(
            {
                "container": container,
                "archive": archive,
                "node": record.node or state.node,
                "original_image": record.image,
                "image": image,
                "commands": [
                    "newcontainer=$(buildah from scratch)",
                    f"buildah add $newcontainer {shlex.quote(archive)} /",
                    f"buildah config --annotation={CHECKPOINT_NAME_ANNOTATION}="
                    f"{shlex.quote(container)} $newcontainer",
                    f"buildah commit $newcontainer {shlex.quote(image)}",
                    "buildah rm $newcontainer",
                    f"buildah push {shlex.quote(image)}",
                ],
                "alternative": f"checkpointctl build {shlex.quote(archive)} {shlex.quote(image)}",
            }
        )
    spec = json.loads(json.dumps(plan.spec))
    for key in ("nodeName",):
        spec.pop(key, None)
    for c in spec.get("containers") or []:
        if c.get("name") in images:
            c["image"] = images[c["name"]]
    if plan.gpus:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), CUDA_CHECKPOINT_LABEL: "true"}
    labels = {k: v for k, v in plan.labels.items() if k != "pod-template-hash"}
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{plan.name}-restored"[:253],
            "namespace": plan.namespace,
            "labels": {**labels, "nodeward.io/restored-from": plan.name[:63]},
            "annotations": {"nodeward.io/restored-from-maintenance": state.maintenance_id},
        },
        "spec": spec,
    }
    return {
        "pod": plan.key,
        "maintenance_id": state.maintenance_id,
        "node": state.node,
        "builds": builds,
        "manifest": manifest,
        "notes": [
            "The archives are on the node, readable by root only: build there (or copy them "
            "over an encrypted channel: they hold the containers' memory, secrets included).",
            "Restoring needs CRI-O with CRIU support (enable_criu_support = true) or "
            "containerd >= 2.1 with CRIU; a GPU pod also a node with CUDA checkpoint support "
            f"({CUDA_CHECKPOINT_LABEL}=true).",
            "The original pod's controller may also start a fresh pod; scale it down first if "
            "the restored one replaces it.",
        ],
    }
