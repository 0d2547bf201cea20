"""A StatefulSet's pod, and a Kubeflow Notebook's, move through their owner: never raced with
it, never duplicated, and the owner keeps the restored pod as its own.

Against the sim cluster's StatefulSet controller (which adopts orphans as `ClaimPods` does),
its garbage collector (`propagationPolicy: Orphan`), the sim notebook controller (Kubeflow's
`kubeflow-resource-stopped` contract), the real registry and buildah.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodeward.kube.base import group_path
from schemas.control import ControlStatus
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome
from services.maintenance.owners import MOVING_ANNOTATION
from services.maintenance.plan import MOVE_ANNOTATION
from services.maintenance.state import MaintenanceState
from sim.cluster.kubelet import RUNTIME_RESTORE
from sim.cluster.seed import PodSeed
from sim.notebooks import STOP_ANNOTATION, SimNotebookController
from tests.conftest import wait_for
from tests.helpers.registry import LocalRegistry
from tests.integration.maintenance_fixtures import NS, EnvFactory, MaintenanceEnv, pod
from tests.integration.test_maintenance_move import _env, _restore, audits

MOVE = {MOVE_ANNOTATION: "true"}
TEMPLATE_IMAGE = "registry.example.com/main:1"


def owned(name: str, node: str, **labels: str) -> PodSeed:
    """An opted-in StatefulSet pod that asked to move (its set: the name without `-0`)."""
    seeded = pod(name, node, opted_in=True, labels=labels or None)
    return seeded.model_copy(update={"annotations": dict(MOVE)})


async def _statefulset(env: MaintenanceEnv, name: str) -> dict[str, Any]:
    return await env.admin.client.request(  # type: ignore[no-any-return]
        "GET", group_path("apps", "v1", "statefulsets", name, NS)
    )


async def _done(env: MaintenanceEnv, timeout: float = 60) -> MaintenanceState:
    await env.bus.publish(env.request(deadline_s=30, move=True))
    done: MaintenanceState = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=timeout, what="maintenance done"
    )
    return done


def _calls(env: MaintenanceEnv) -> list[tuple[str, str]]:
    """The checkpoint service's accepted writes, in order."""
    return [
        (m, p)
        for who, m, p, s in env.sim.requests
        if who == "checkpoint" and s < 300 and m in ("POST", "DELETE", "PATCH")
    ]


def _applied(found: list[Any], pod_name: str) -> list[tuple[str, Outcome]]:
    return [(r.target.name, r.outcome) for r in found if r.target.name == pod_name]


@pytest.fixture
async def notebook_controller(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> AsyncIterator[MaintenanceEnv]:
    """An env with Notebook `lab` run as StatefulSet `lab` (pod `lab-0` on the node), and
    Kubeflow's notebook controller running."""
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [owned("lab-0", node, **{"notebook-name": "lab"})],
        notebooks=("lab",),
    )
    controller = SimNotebookController(env.admin.client, interval=0.1)
    task = asyncio.create_task(controller.run())
    try:
        yield env
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_statefulsets_pod_moves_and_its_set_takes_it_back(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _env(maintenance_env, registry, tmp_path, pods=lambda node: [owned("db-0", node)])
    await env.start()
    before = (await env.pods())["db-0"]
    sts_before = await _statefulset(env, "db")
    done = await _done(env)
    spare = f"{env.node}-spare"

    plan = done.pods[f"{NS}/db-0"]
    assert plan.move is not None and plan.move.stage == "running", plan.move
    assert plan.move.via == "statefulset" and plan.move.target == spare
    moved = await env.admin.pods.get(NS, "db-0")
    # The one db-0 is nodeward's replacement, restored from its image on the spare node...
    assert moved["metadata"]["uid"] == plan.move.uid != before["metadata"]["uid"]
    assert moved["spec"]["nodeName"] == spare and moved["status"]["phase"] == "Running"
    image = moved["spec"]["containers"][0]["image"]
    assert image == plan.checkpoints[0].checkpoint_image and image != TEMPLATE_IMAGE
    # ... and its StatefulSet's again: created anew from its record, it adopted the pod.
    sts = await _statefulset(env, "db")
    assert sts["metadata"]["uid"] != sts_before["metadata"]["uid"]
    assert sts["spec"] == sts_before["spec"]  # the template untouched: its own image
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == TEMPLATE_IMAGE
    refs = [r for r in moved["metadata"]["ownerReferences"] if r.get("controller")]
    assert [(r["kind"], r["uid"]) for r in refs] == [("StatefulSet", sts["metadata"]["uid"])]
    await wait_for(
        lambda: _ready(env, "db"), timeout=10, what="the StatefulSet counts its pod ready"
    )

    # The order that makes it safe: the set let go before the pod stopped; the
    # replacement created before the set came back (so the set never made its own).
    calls = _calls(env)
    at = {
        what: next(i for i, (m, p) in enumerate(calls) if m == method and p.endswith(suffix))
        for what, method, suffix in (
            ("orphaned", "DELETE", "/statefulsets/db"),
            ("evicted", "POST", "/db-0/eviction"),
            ("created", "POST", f"/{NS}/pods"),
            ("returned", "POST", f"/{NS}/statefulsets"),
        )
    }
    assert at["orphaned"] < at["evicted"] < at["created"] < at["returned"], calls
    for action in ("take-over", "stop", "restore", "give-back"):
        found = [r for r in await audits(env.bus, action) if r.details.get("node") == env.node]
        assert _applied(found, "db-0") == [("db-0", Outcome.APPLIED)], action
    told = [n for n in await env.notices() if "moved" in n.title and spare in n.title]
    assert [n.audience for n in told] == [f"user:{NS}/db-0"]


async def _ready(env: MaintenanceEnv, name: str) -> bool:
    status = (await _statefulset(env, name)).get("status") or {}
    return int(status.get("readyReplicas") or 0) == 1


async def test_a_notebooks_pod_moves_while_its_notebook_is_stopped(
    notebook_controller: MaintenanceEnv,
) -> None:
    env = notebook_controller
    await env.start()
    before = (await env.pods())["lab-0"]
    sts_before = await _statefulset(env, "lab")
    done = await _done(env)

    plan = done.pods[f"{NS}/lab-0"]
    assert plan.move is not None and plan.move.stage == "running", plan.move
    assert plan.move.via == "notebook"
    moved = await env.admin.pods.get(NS, "lab-0")
    assert moved["metadata"]["uid"] == plan.move.uid != before["metadata"]["uid"]
    assert moved["spec"]["nodeName"] == plan.move.target
    assert moved["spec"]["containers"][0]["image"] == plan.checkpoints[0].checkpoint_image
    # The same StatefulSet (never deleted: its Notebook would make it again) owns it.
    sts = await _statefulset(env, "lab")
    assert sts["metadata"]["uid"] == sts_before["metadata"]["uid"]
    assert sts["spec"]["replicas"] == 1
    refs = [r for r in moved["metadata"]["ownerReferences"] if r.get("controller")]
    assert [(r["kind"], r["uid"]) for r in refs] == [("StatefulSet", sts["metadata"]["uid"])]
    # The Notebook runs again: the stop nodeward set is gone, with its mark.
    notebook = await env.admin.notebooks.get(NS, "lab")
    annotations = notebook["metadata"].get("annotations") or {}
    assert STOP_ANNOTATION not in annotations and MOVING_ANNOTATION not in annotations
    await wait_for(lambda: _ready(env, "lab"), timeout=10, what="the set counts its pod ready")
    # Stopped before the pod was evicted; started again only after the replacement existed.
    calls = _calls(env)
    patches = [i for i, (m, p) in enumerate(calls) if m == "PATCH" and "/notebooks/lab" in p]
    created = next(i for i, (m, p) in enumerate(calls) if m == "POST" and p.endswith("/pods"))
    assert len(patches) == 2 and patches[0] < created < patches[1], calls
    for action in ("take-over", "restore", "give-back"):
        found = [r for r in await audits(env.bus, action) if r.details.get("node") == env.node]
        assert _applied(found, "lab-0") == [("lab-0", Outcome.APPLIED)], action


async def test_a_restore_that_fails_gives_the_set_back_to_start_the_pod_afresh(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [owned("db-0", node)],
        spare_annotations={RUNTIME_RESTORE: "false"},  # the spare's runtime cannot restore
    )
    await env.start()
    done = await _done(env)
    plan = done.pods[f"{NS}/db-0"]
    assert plan.move is not None and plan.move.stage == "failed"
    assert "RunContainerError" in (plan.move.reason or "")

    # nodeward's replacement is gone; the set, back, runs db-0 from its own template.
    async def fresh() -> dict[str, Any] | None:
        got = await env.admin.pods.get(NS, "db-0")
        ok = got["metadata"]["uid"] != plan.move.uid and got["status"].get("phase") == "Running"  # type: ignore[union-attr]
        return got if ok else None

    again = await wait_for(fresh, timeout=20, what="db-0 started again by its StatefulSet")
    assert again["spec"]["containers"][0]["image"] == TEMPLATE_IMAGE
    sts = await _statefulset(env, "db")
    refs = [r for r in again["metadata"]["ownerReferences"] if r.get("controller")]
    assert [r["uid"] for r in refs] == [sts["metadata"]["uid"]]
    told = [n for n in await env.notices() if "could not be moved" in n.title]
    assert told and "starts it again from its template" in told[0].body
    given = [r for r in await audits(env.bus, "give-back") if r.details.get("node") == env.node]
    assert [(r.outcome, r.details.get("replacement")) for r in given] == [
        (Outcome.APPLIED, plan.move.uid)
    ]


async def test_a_stop_its_budget_blocks_leaves_the_session_with_its_set(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [owned("web-0", node, app="web")],
        pdb={"maxUnavailable": 0},  # the `web` budget allows no disruption
        evict_timeout="0.5s",
    )
    await env.start()
    before = (await env.pods())["web-0"]
    await env.bus.publish(env.request(deadline_s=3, move=True))

    async def failed() -> MaintenanceState | None:
        state = await env.state()
        plan = state.pods.get(f"{NS}/web-0") if state else None
        return state if plan and plan.move and plan.move.stage == "failed" else None

    state = await wait_for(failed, timeout=60, what="the move failed")
    plan = state.pods[f"{NS}/web-0"]
    assert plan.move is not None and "not stopped" in (plan.move.reason or "")
    # The running session was never touched, and its set (created again) keeps it.
    pod_now = await env.admin.pods.get(NS, "web-0")
    assert pod_now["metadata"]["uid"] == before["metadata"]["uid"]
    assert not pod_now["metadata"].get("deletionTimestamp")
    sts = await _statefulset(env, "web")

    async def adopted() -> bool:
        got = await env.admin.pods.get(NS, "web-0")
        refs = [r for r in got["metadata"].get("ownerReferences") or [] if r.get("controller")]
        return [r["uid"] for r in refs] == [sts["metadata"]["uid"]]

    await wait_for(adopted, timeout=10, what="web-0 adopted by its set, created again")


async def test_an_operator_cannot_restore_a_controllers_pod_by_hand(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _env(
        maintenance_env, registry, tmp_path, pods=lambda node: [pod("db-0", node, opted_in=True)]
    )
    await env.start()
    await env.bus.publish(env.request(deadline_s=5, move=False))  # checkpointed, evicted
    await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=60, what="done")
    reply = await _restore(env, "db-0")
    assert reply.status == ControlStatus.REFUSED
    assert "owned by StatefulSet db" in reply.message and "--move" in reply.message
    asked = [r for r in await audits(env.bus, "restore-request") if r.target.name == "db-0"]
    assert [(r.outcome, r.guard) for r in asked] == [(Outcome.SKIPPED, "owned")]
