"""A maintenance with --move survives a SIGKILL of the checkpoint service at every stage of
the move: built, pushed, the archive deleted, the old pod stopped, the new one created, and
the workflow's own steps around them; and, for a StatefulSet's or a Notebook's pod, its
owner let go and given back.

The service runs as its own process, killed at one failpoint by `NODEWARD_FAILPOINT`, then
restarted without it. After `done`: exactly one running copy of the session, on the spare
node, restored from the very image the registry holds; no checkpoint lost (the archive left
the node only because its image is in the registry); one `applied` audit of each of `stop`
and `restore`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nodeward.kube import NotFound
from nodeward.kube.base import group_path
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome
from services.maintenance.owners import MOVING_ANNOTATION, recorded
from services.maintenance.state import MaintenanceState
from sim.cluster.kubelet import RESTORED
from sim.notebooks import STOP_ANNOTATION, SimNotebookController
from tests.conftest import wait_for
from tests.helpers.registry import LocalRegistry
from tests.integration.crash_fixtures import ServiceProcess
from tests.integration.maintenance_fixtures import NS, EnvFactory, MaintenanceEnv
from tests.integration.test_maintenance_move import (
    _env,
    _manifest,
    _one_session,
    audits,
    moved_session,
)
from tests.integration.test_maintenance_move_owners import _statefulset, owned

POINTS = [
    "maintenance.checkpointed",  # checkpointed, the move not begun
    "move.built",  # the image built, not pushed
    "move.pushed",  # pushed, its digest not saved
    "move.archive_deleted",  # the archive gone from the node, not recorded
    "move.stopped",  # the old pod gone, the stage not saved
    "move.stop.audited",  # its stop audited, the stage not saved
    "move.created",  # the replacement created, not audited
    "move.restore.audited",  # its restore audited, the stage not saved
    "maintenance.moving",  # every move over, the workflow not advanced
]


async def _killed_then_done(
    env: MaintenanceEnv, tmp_path: Path, nats_url: str, point: str
) -> MaintenanceState:
    """The service as its own process, SIGKILLed at `point` during a `--move` maintenance,
    then started again without it; the maintenance once `done`."""
    proc = ServiceProcess.of("checkpoint", env.settings, tmp_path, nats_url)
    try:
        proc.start(failpoint=point)
        await env.bus.publish(env.request(deadline_s=30, move=True))
        assert await proc.exited(timeout=60) == -9, proc.tail()
        proc.start()
        done: MaintenanceState = await wait_for(
            lambda: env.phase_is(MaintenancePhase.DONE), timeout=60, what="the maintenance done"
        )
    finally:
        proc.kill()
    return done


@pytest.mark.parametrize("point", POINTS)
async def test_a_move_killed_at_each_stage_ends_with_one_running_copy_and_its_checkpoint(
    maintenance_env: EnvFactory,
    registry: LocalRegistry,
    nats_url: str,
    tmp_path: Path,
    point: str,
) -> None:
    env = await _one_session(maintenance_env, registry, tmp_path, start=False, lease_ttl="1s")
    before = (await env.pods())["session-0"]
    done = await _killed_then_done(env, tmp_path, nats_url, point)

    # The move is over, with exactly one copy: the name is unique in a namespace, and the
    # one pod of that name is the replacement, running on the spare node.
    plan, moved = await moved_session(env, done, before)
    on_node = [
        p["metadata"]["name"]
        for p in (await env.admin.pods.list())
        if p["spec"].get("nodeName") == env.node
    ]
    assert "session-0" not in on_node
    images = {c["name"]: c["image"] for c in moved["spec"]["containers"]}
    restored = {r["container"]: r for r in json.loads(moved["metadata"]["annotations"][RESTORED])}

    # No lost checkpoint: every container's image recorded, held by the registry, and the
    # one the kubelet restored.
    assert plan.checkpoints
    for record in plan.checkpoints:
        container = record.pod.container or ""
        pinned = record.checkpoint_image
        assert pinned, record
        assert pinned.startswith(f"{registry.address}/ckpt/{NS}/session-0-{container}@sha256:")
        assert images[container] == pinned
        digest, _ = _manifest(registry, pinned)
        assert pinned.endswith(f"@{digest}")
        assert restored[container]["digest"] == digest
        assert record.archive_deleted
    # The archive left the node (only once its image was confirmed, above).
    assert not [p for p in env.sim.archives(env.node) if "session-0" in p.name]

    # One applied `stop` and one applied `restore`, whatever the restart repeated.
    for action in ("stop", "restore"):
        found = [r for r in await audits(env.bus, action) if r.details.get("node") == env.node]
        assert [(r.target.name, r.outcome) for r in found] == [("session-0", Outcome.APPLIED)], (
            action,
            found,
        )
    # `push-image`: at least one applied. A push the kill cut short before its digest was
    # saved (`move.built`, `move.pushed`) is done again after the restart, and may be
    # audited again: allowed, the state records the one digest that was saved.
    pushed = [r for r in await audits(env.bus, "push-image") if r.details.get("node") == env.node]
    assert any(r.outcome == Outcome.APPLIED for r in pushed), pushed
    assert all(r.target.name == "session-0" for r in pushed)


OWNER_POINTS = [
    ("db-0", "move.taken_over"),  # the set deleted leaving its pods, not audited
    ("db-0", "move.take_over.audited"),  # its take-over audited, the stage not saved
    ("db-0", "move.stopped"),
    ("db-0", "move.created"),
    ("db-0", "move.given_back"),  # the set created again and its pod adopted, not saved
    ("lab-0", "move.taken_over"),  # the Notebook stopped, not audited
    ("lab-0", "move.created"),
    ("lab-0", "move.given_back"),  # the Notebook started, the pod handed to its set
]


@pytest.mark.parametrize(("name", "point"), OWNER_POINTS)
async def test_a_move_through_its_owner_killed_at_each_stage_ends_with_the_owner_keeping_it(
    maintenance_env: EnvFactory,
    registry: LocalRegistry,
    nats_url: str,
    tmp_path: Path,
    name: str,
    point: str,
) -> None:
    notebook = name == "lab-0"
    labels = {"notebook-name": "lab"} if notebook else {}
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [owned(name, node, **labels)],
        notebooks=("lab",) if notebook else (),
        lease_ttl="1s",
    )
    sts_name = name.rsplit("-", 1)[0]
    controller = asyncio.create_task(SimNotebookController(env.admin.client, interval=0.1).run())
    before = (await env.pods())[name]
    try:
        done = await _killed_then_done(env, tmp_path, nats_url, point)
    finally:
        controller.cancel()
        await asyncio.gather(controller, return_exceptions=True)

    plan = done.pods[f"{NS}/{name}"]
    assert plan.move is not None and plan.move.stage == "running", plan.move
    # One copy: the replacement, restored from its image, its set's own.
    moved = await env.admin.pods.get(NS, name)
    assert moved["metadata"]["uid"] == plan.move.uid != before["metadata"]["uid"]
    assert moved["spec"]["containers"][0]["image"] == plan.checkpoints[0].checkpoint_image
    sts = await _statefulset(env, sts_name)
    refs = [r for r in moved["metadata"]["ownerReferences"] if r.get("controller")]
    assert [r["uid"] for r in refs] == [sts["metadata"]["uid"]]
    assert sts["spec"]["replicas"] == 1
    if notebook:
        annotations = (await env.admin.notebooks.get(NS, "lab"))["metadata"].get("annotations")
        assert not {STOP_ANNOTATION, MOVING_ANNOTATION} & set(annotations or {})
    # The owner let go and took it back once each, whatever the restart repeated.
    for action in ("take-over", "stop", "restore", "give-back"):
        found = [r for r in await audits(env.bus, action) if r.details.get("node") == env.node]
        assert [r.outcome for r in found] == [Outcome.APPLIED], (action, found)


async def test_a_set_made_again_by_someone_else_while_nodeward_was_down_keeps_its_pod(
    maintenance_env: EnvFactory, registry: LocalRegistry, nats_url: str, tmp_path: Path
) -> None:
    """Killed once the set was deleted leaving its pod; a GitOps tool creates the set again
    (it adopts the running pod) before nodeward is back: the move ends before any stop, the
    set is given back nothing, and keeps its pod."""
    env = await _env(
        maintenance_env, registry, tmp_path, pods=lambda node: [owned("db-0", node)], lease_ttl="1s"
    )
    record = recorded(await _statefulset(env, "db"))
    proc = ServiceProcess.of("checkpoint", env.settings, tmp_path, nats_url)
    try:
        proc.start(failpoint="move.taken_over")
        await env.bus.publish(env.request(deadline_s=30, move=True))
        assert await proc.exited(timeout=60) == -9, proc.tail()
        again = await env.admin.client.request(
            "POST", group_path("apps", "v1", "statefulsets", namespace=NS), body=record
        )
        proc.start()

        async def failed() -> str | None:
            state = await env.state()
            plan = state.pods.get(f"{NS}/db-0") if state else None
            move = plan.move if plan else None
            return move.reason if move and move.stage == "failed" else None

        reason = await wait_for(failed, timeout=60, what="the move ended")
        # The maintenance goes on as without --move (its drain evicts the pod).
        await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=60, what="done")
    finally:
        proc.kill()
    assert "created again by someone else" in reason
    # The move never stopped it, and the set that someone made keeps db-0.

    async def kept() -> bool:
        try:
            pod = await env.admin.pods.get(NS, "db-0")
        except NotFound:
            return False
        refs = [r for r in pod["metadata"]["ownerReferences"] if r.get("controller")]
        return [r["uid"] for r in refs] == [again["metadata"]["uid"]]

    await wait_for(kept, timeout=20, what="db-0 its new set's")
    stops = [r for r in await audits(env.bus, "stop") if r.details.get("node") == env.node]
    assert not [r for r in stops if r.outcome == Outcome.APPLIED]


async def test_a_notebook_someone_stops_during_the_move_stays_stopped(
    maintenance_env: EnvFactory, registry: LocalRegistry, nats_url: str, tmp_path: Path
) -> None:
    """Killed with the replacement created; the Notebook's user stops it meanwhile (their own
    stop over nodeward's): nodeward takes only its mark off, and the replacement goes."""
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [owned("lab-0", node, **{"notebook-name": "lab"})],
        notebooks=("lab",),
        lease_ttl="1s",
    )
    controller = asyncio.create_task(SimNotebookController(env.admin.client, interval=0.1).run())
    proc = ServiceProcess.of("checkpoint", env.settings, tmp_path, nats_url)
    theirs = "2030-01-01T00:00:00Z"
    try:
        proc.start(failpoint="move.created")
        await env.bus.publish(env.request(deadline_s=30, move=True))
        assert await proc.exited(timeout=60) == -9, proc.tail()
        await env.admin.notebooks.set_annotations(NS, "lab", {STOP_ANNOTATION: theirs})
        proc.start()

        async def ended() -> str | None:
            state = await env.state()
            plan = state.pods.get(f"{NS}/lab-0") if state else None
            move = plan.move if plan else None
            return move.reason if move and move.stage == "failed" else None

        reason = await wait_for(ended, timeout=60, what="the move ended")

        async def gone() -> bool:
            return "lab-0" not in {p["metadata"]["name"] for p in await env.admin.pods.list(NS)}

        await wait_for(gone, timeout=20, what="the replacement gone with the stop")
    finally:
        proc.kill()
        controller.cancel()
        await asyncio.gather(controller, return_exceptions=True)
    assert "stopped by someone" in reason
    annotations = (await env.admin.notebooks.get(NS, "lab"))["metadata"]["annotations"]
    assert annotations[STOP_ANNOTATION] == theirs and MOVING_ANNOTATION not in annotations
