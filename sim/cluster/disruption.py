"""PodDisruptionBudgets and the eviction subresource, as the API server applies them.

Nothing recreates an evicted pod: the sim has no controllers, so a budget that an
eviction used stays used.
"""

from __future__ import annotations

import math
from typing import Any

from sim.cluster.errors import ApiError, bad_request
from sim.cluster.resources import ResourceType, require
from sim.cluster.selectors import match_label_selector_object
from sim.cluster.store import Change, Store

PODS = require("", "v1", "pods")
PDBS = require("policy", "v1", "poddisruptionbudgets")


def pod_healthy(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return status.get("phase") == "Running" and ready is not None and ready.get("status") == "True"


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        frac = int(value[:-1]) * total / 100
        return math.ceil(frac) if round_up else math.floor(frac)
    return int(value)


def budget_status(store: Store, pdb: dict[str, Any]) -> dict[str, Any]:
    """The status the disruption controller would write: healthy, desired, allowed."""
    ns = pdb["metadata"]["namespace"]
    spec = pdb.get("spec") or {}
    pods = [
        p
        for p in store.list(PODS, ns)
        if match_label_selector_object(spec.get("selector"), p["metadata"].get("labels"))
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    expected = len(pods)
    healthy = sum(1 for p in pods if pod_healthy(p))
    if "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected, round_up=True)
    allowed = max(0, healthy - desired)
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed > 0 else "False",
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "lastTransitionTime": pdb["metadata"].get("creationTimestamp"),
            }
        ],
    }


def refresh(store: Store, namespace: str) -> None:
    """Recompute every budget's status in `namespace` (the disruption controller's job)."""
    for pdb in store.list(PDBS, namespace):
        status = budget_status(store, pdb)
        old = pdb.get("status") or {}
        for cond in status["conditions"]:
            prev = next(
                (c for c in old.get("conditions") or [] if c.get("type") == cond["type"]), None
            )
            if prev and prev.get("status") == cond["status"]:
                cond["lastTransitionTime"] = prev.get("lastTransitionTime")
        if status != old:
            pdb["status"] = status
            store.update(
                PDBS, namespace, pdb["metadata"]["name"], pdb, subresource="status", check_rv=False
            )


def watch_pods(store: Store) -> None:
    """Keep budget status current as pods and budgets change."""

    def hook(change: Change) -> None:
        if change.key == PDBS.key and change.type == "MODIFIED":
            old_gen = (change.old or {}).get("metadata", {}).get("generation")
            if old_gen == change.obj["metadata"].get("generation"):
                return  # a status write (ours): nothing to recompute
        if change.key in (PODS.key, PDBS.key):
            refresh(store, change.obj["metadata"].get("namespace", ""))

    store.hooks.append(hook)


def evict(
    store: Store, rt: ResourceType, namespace: str, name: str, body: Any, *, dry_run: bool = False
) -> None:
    """POST pods/{name}/eviction: delete the pod if every budget allows it, else 429."""
    if not isinstance(body, dict) or body.get("kind") != "Eviction":
        raise bad_request("eviction body must be an Eviction")
    if body.get("apiVersion") not in ("policy/v1", "policy/v1beta1"):
        raise bad_request(
            f"unsupported Eviction apiVersion {body.get('apiVersion')!r}: use policy/v1 or policy/v1beta1"
        )
    if (body.get("metadata") or {}).get("name") != name:
        raise bad_request("name in URL does not match name in Eviction object")
    pod = store.get(rt, namespace, name)
    options = body.get("deleteOptions") or {}
    pre = options.get("preconditions") or {}
    terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    if not terminal and not pod["metadata"].get("deletionTimestamp"):
        budgets = [
            b
            for b in store.list(PDBS, namespace)
            if match_label_selector_object(
                (b.get("spec") or {}).get("selector"), pod["metadata"].get("labels")
            )
        ]
        if len(budgets) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                "does not support.",
            )
        if budgets:
            budget = budgets[0]
            status = budget_status(store, budget)
            policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
            healthy_budget = status["currentHealthy"] >= status["desiredHealthy"]
            unhealthy_ok = not pod_healthy(pod) and (policy == "AlwaysAllow" or healthy_budget)
            if status["disruptionsAllowed"] < 1 and not unhealthy_ok:
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": (
                                    f"The disruption budget {budget['metadata']['name']} needs "
                                    f"{status['desiredHealthy']} healthy pods and has {status['currentHealthy']} currently"
                                ),
                            }
                        ]
                    },
                )
    store.delete(
        rt,
        namespace,
        name,
        precondition_rv=pre.get("resourceVersion"),
        precondition_uid=pre.get("uid"),
        dry_run=dry_run,
        grace_period=options.get("gracePeriodSeconds"),
        propagation=options.get("propagationPolicy"),
    )
