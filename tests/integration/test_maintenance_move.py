"""A maintenance with --move restores opted-in sessions on another node: the archive built
into an OCI checkpoint image with buildah, pushed to a real docker-registry and confirmed by
its digest, the archive deleted, the pod stopped and created again under its name on the
chosen node, where the sim kubelet restores it from the registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from nodeward.bus.control import request as control_request
from nodeward.kube import NotFound
from schemas.control import ControlReply, ControlRequest, ControlStatus
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome, Remediation
from services.maintenance.placement import RESTORED_ANNOTATION
from services.maintenance.plan import MOVE_ANNOTATION
from services.maintenance.state import CUDA_CHECKPOINT_LABEL, MaintenanceState, PodPlan
from sim.cluster.kubelet import RESTORED, RUNTIME_RESTORE
from sim.cluster.seed import PodSeed
from tests.conftest import wait_for
from tests.helpers.registry import LocalRegistry
from tests.integration.cordon_fixtures import read_stream
from tests.integration.maintenance_fixtures import NS, EnvFactory, MaintenanceEnv, pod

MOVE = {MOVE_ANNOTATION: "true"}


async def audits(bus: Any, action: str) -> list[Remediation]:
    return [e.data for e in await read_stream(bus, "AUDIT", f"remediation.{action}.>")]


MANIFESTS = "application/vnd.oci.image.manifest.v1+json"


def bare(name: str, node: str, **kwargs: Any) -> PodSeed:
    seeded = pod(name, node, opted_in=True, **kwargs)
    return seeded.model_copy(update={"owner": None, "annotations": dict(MOVE)})


def moving_pods(node: str) -> list[PodSeed]:
    """A bare session that moves, a Job's pod that asked to (not moved: its Job recreates
    it under another name) and a pod that did not ask (evicted)."""
    job = pod("db-0", node, opted_in=True, owner="Job")
    return [
        bare("session-0", node, containers=("main", "sidecar")),
        job.model_copy(update={"annotations": dict(MOVE)}),
        pod("web-0", node, labels={"app": "web"}),
    ]


async def _env(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path, **kwargs: Any
) -> MaintenanceEnv:
    images = registry.settings.model_dump(mode="json") | {
        "node_root": str(tmp_path / "nodes" / "{node}")
    }
    return await maintenance_env(
        pods=kwargs.pop("pods", moving_pods),
        archive_root=tmp_path / "nodes",
        registries=(registry.address,),
        spare_labels=kwargs.pop("spare_labels", {CUDA_CHECKPOINT_LABEL: "true"}),
        images=images,
        **kwargs,
    )


async def _one_session(
    maintenance_env: EnvFactory,
    registry: LocalRegistry,
    tmp_path: Path,
    *,
    gpus: int = 0,
    start: bool = True,
    **kwargs: Any,
) -> MaintenanceEnv:
    """`_env` with one bare session, `session-0`, that asked to move; its service started
    in this process unless `start` is False."""
    env = await _env(
        maintenance_env,
        registry,
        tmp_path,
        pods=lambda node: [bare("session-0", node, gpus=gpus)],
        **kwargs,
    )
    if start:
        await env.start()
    return env


async def _done(
    env: MaintenanceEnv, *, move: bool = True, deadline_s: float = 20, timeout: float = 60
) -> MaintenanceState:
    """Request the node's maintenance (with --move unless `move` is False); once done."""
    await env.bus.publish(env.request(deadline_s=deadline_s, move=move))
    done: MaintenanceState = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=timeout, what="maintenance done"
    )
    return done


def _manifest(registry: LocalRegistry, pinned: str) -> tuple[str, dict[str, Any]]:
    repo, digest = pinned.split("@", 1)
    path = repo.split("/", 1)[1]
    got = httpx.get(
        f"http://{registry.address}/v2/{path}/manifests/{digest}", headers={"Accept": MANIFESTS}
    )
    got.raise_for_status()
    return got.headers["Docker-Content-Digest"], got.json()


async def moved_session(
    env: MaintenanceEnv, done: MaintenanceState, before: dict[str, Any]
) -> tuple[PodPlan, dict[str, Any]]:
    """session-0's plan and pod: moved, under its name, Running on the spare node (its
    replacement: the uid the move recorded)."""
    plan = done.pods[f"{NS}/session-0"]
    assert plan.move is not None and plan.move.stage == "running", plan.move
    assert plan.move.target == f"{env.node}-spare"
    moved = await env.admin.pods.get(NS, "session-0")
    assert moved["metadata"]["uid"] != before["metadata"]["uid"]
    assert moved["metadata"]["uid"] == plan.move.uid
    assert moved["spec"]["nodeName"] == plan.move.target
    assert moved["status"]["phase"] == "Running"
    return plan, moved


async def test_a_move_restores_the_session_on_the_spare_node_from_its_images(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _env(maintenance_env, registry, tmp_path)
    await env.start()
    before = (await env.pods())["session-0"]
    request = env.request(deadline_s=20, move=True)
    await env.bus.publish(request)
    done: MaintenanceState = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=60, what="maintenance done"
    )
    spare = f"{env.node}-spare"

    # The session runs on the spare node, under its name, restored from its images.
    plan, moved = await moved_session(env, done, before)
    images = {c["name"]: c["image"] for c in moved["spec"]["containers"]}
    assert set(images) == {"main", "sidecar"}
    restored = {r["container"]: r for r in json.loads(moved["metadata"]["annotations"][RESTORED])}
    origin = json.loads(moved["metadata"]["annotations"][RESTORED_ANNOTATION])
    assert origin["node"] == env.node and origin["uid"] == before["metadata"]["uid"]
    for record in plan.checkpoints:
        container = record.pod.container or ""
        pinned = record.checkpoint_image
        assert pinned and images[container] == pinned and record.archive_deleted
        assert pinned.startswith(f"{registry.address}/ckpt/{NS}/session-0-{container}@sha256:")
        # The registry holds it under that digest, as a checkpoint image of that container.
        digest, manifest = _manifest(registry, pinned)
        assert pinned.endswith(digest)
        assert manifest["annotations"]["io.kubernetes.cri-o.annotations.checkpoint.name"] == (
            container
        )
        # The kubelet restored that very checkpoint: its digest, its pod's memory.
        assert restored[container]["digest"] == digest
        assert restored[container]["from"]["podUID"] == before["metadata"]["uid"]
    # Its archives left the node once the images were confirmed; the others' stay.
    left = [p.name for p in env.sim.archives(env.node)]
    assert left and all("session-0" not in name for name in left)
    assert any("db-0" in name for name in left)

    # The Job's pod was checkpointed and evicted, not moved; the other evicted.
    db = done.pods[f"{NS}/db-0"]
    assert db.move is not None and db.move.stage == "failed"
    assert "owned by Job db" in (db.move.reason or "")
    assert db.checkpoints and not db.checkpoints[0].checkpoint_image
    with_names = set(await env.pods())
    assert "db-0" not in with_names and "web-0" not in with_names

    # The old pod stopped before its replacement was created (never two copies).
    log = [(m, p) for who, m, p, s in env.sim.requests if who == "checkpoint" and s < 300]
    evicted = [i for i, (m, p) in enumerate(log) if p.endswith("/session-0/eviction")]
    created = [i for i, (m, p) in enumerate(log) if m == "POST" and p.endswith(f"/{NS}/pods")]
    assert len(evicted) == 1 and len(created) == 1 and evicted[0] < created[0]

    # The phase, the move on the stream; the owner told where it went; on-call audited.
    events = await env.phases()
    moving = [e for e in events if e.phase == MaintenancePhase.MOVING and e.moved]
    assert [(m.pod.name, m.to_node) for e in moving for m in e.moved] == [("session-0", spare)]
    notices = {n.audience: n for n in await env.notices() if "moved" in n.title}
    assert f"user:{NS}/session-0" in notices
    assert spare in notices[f"user:{NS}/session-0"].title
    for action in ("push-image", "stop", "restore"):
        found = [r for r in await audits(env.bus, action) if r.details.get("node") == env.node]
        assert [(r.target.name, r.outcome) for r in found] == [("session-0", Outcome.APPLIED)], (
            action
        )
    complete = [r for r in await audits(env.bus, "complete") if r.details["node"] == env.node]
    assert "1 moved" in complete[0].reason


async def test_no_node_fits_the_session_stays_and_is_evicted_with_its_checkpoint(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    # the spare node has no CUDA checkpoint support
    env = await _one_session(maintenance_env, registry, tmp_path, gpus=1, spare_labels={})
    done = await _done(env)
    plan = done.pods[f"{NS}/session-0"]
    assert plan.move is not None and plan.move.stage == "failed"
    assert "does not advertise CUDA checkpoint support" in (plan.move.reason or "")
    assert any("session-0: not moved" in f for f in done.failures)
    # Nothing was pushed or created; the archive stays on the node; the pod was evicted.
    assert not plan.checkpoints[0].checkpoint_image
    assert [p for p in env.sim.archives(env.node) if "session-0" in p.name]
    try:
        await env.admin.pods.get(NS, "session-0")
        raise AssertionError("the session should have been evicted")
    except NotFound:
        pass
    warned = [n for n in await env.notices() if "could not be moved" in n.title]
    assert warned and "evicted with the drain" in warned[0].body


async def _restore(env: MaintenanceEnv, pod: str, to: str | None = None) -> ControlReply:
    ask = ControlRequest(
        service="checkpoint",
        verb="restore",
        operator="ada",
        reason="the session is needed again",
        target=f"{NS}/{pod}",
        options={"to": to} if to else {},
    )
    return await control_request(env.bus.nc, ask, timeout=60)


async def test_an_operator_restores_an_evicted_checkpoint_on_the_node_named(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    env = await _one_session(maintenance_env, registry, tmp_path)
    await _done(env, move=False)  # checkpointed, evicted
    spare = f"{env.node}-spare"

    # A node that cannot take it is refused with why; the cordoned node too.
    refused = await _restore(env, "session-0", to=env.node)
    assert refused.status == ControlStatus.ERROR and "cordoned" in refused.message

    reply = await _restore(env, "session-0", to=spare)
    assert reply.status == ControlStatus.OK, reply.message
    assert reply.message == f"restored {NS}/session-0 on {spare} from its checkpoint"
    pod = await env.admin.pods.get(NS, "session-0")
    assert pod["spec"]["nodeName"] == spare and pod["status"]["phase"] == "Running"
    restored = json.loads(pod["metadata"]["annotations"][RESTORED])
    assert pod["spec"]["containers"][0]["image"].endswith(restored[0]["digest"])
    # Its images were built from the archive left on the node, which then went.
    assert not [p for p in env.sim.archives(env.node) if "session-0" in p.name]
    applied = [
        r
        for r in await audits(env.bus, "restore")
        if r.outcome == Outcome.APPLIED and r.details.get("node") == env.node
    ]
    assert [r.details.get("operator") for r in applied] == ["ada"]

    # Running: a second restore would run the session twice.
    again = await _restore(env, "session-0")
    assert again.status == ControlStatus.REFUSED and "delete it first" in again.message
    missing = await _restore(env, "nothing-0")
    assert missing.status == ControlStatus.REFUSED
    assert "no checkpoint recorded for pod" in missing.message


async def test_a_build_that_fails_ends_the_move_at_once_and_keeps_the_archive(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    broken = registry.settings.model_copy(update={"buildah": str(tmp_path / "no-buildah")})
    broken_registry = LocalRegistry(registry.address, broken, registry.state)
    env = await _one_session(maintenance_env, broken_registry, tmp_path)
    # Well before the deadline: a build that failed is not tried again each tick.
    done = await _done(env, deadline_s=60, timeout=30)
    plan = done.pods[f"{NS}/session-0"]
    assert plan.move is not None and plan.move.stage == "failed"
    assert "buildah" in (plan.move.reason or "") and "cannot run" in (plan.move.reason or "")
    assert [p for p in env.sim.archives(env.node) if "session-0" in p.name]
    pushes = [r for r in await audits(env.bus, "push-image") if r.details.get("node") == env.node]
    assert [r.outcome for r in pushes] == [Outcome.FAILED]


async def test_a_restore_that_failed_on_its_node_is_run_again_where_it_can(
    maintenance_env: EnvFactory, registry: LocalRegistry, tmp_path: Path
) -> None:
    # The spare node's runtime cannot restore.
    cannot = {RUNTIME_RESTORE: "false"}
    env = await _one_session(maintenance_env, registry, tmp_path, spare_annotations=cannot)
    done = await _done(env, deadline_s=30)
    plan = done.pods[f"{NS}/session-0"]
    assert plan.move is not None and plan.move.stage == "failed"
    assert "RunContainerError" in (plan.move.reason or "")
    failed = await env.admin.pods.get(NS, "session-0")  # nodeward's replacement, not running
    assert failed["status"]["phase"] != "Running"
    told = [n for n in await env.notices() if "could not be moved" in n.title]
    assert told and "nodeward maintenance restore" in " ".join(told[0].what_you_can_do)

    # The node's runtime is fixed; the operator runs the session again there.
    spare = f"{env.node}-spare"
    await env.admin.nodes.set_annotations(spare, {RUNTIME_RESTORE: None})
    reply = await _restore(env, "session-0", to=spare)
    assert reply.status == ControlStatus.OK, reply.message
    pod = await env.admin.pods.get(NS, "session-0")
    assert pod["metadata"]["uid"] != failed["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == spare and pod["status"]["phase"] == "Running"
    asked = [
        r
        for r in await audits(env.bus, "restore-request")
        if r.details.get("maintenance") == done.maintenance_id
    ]
    assert [(r.outcome, r.details.get("deleted_replacement")) for r in asked] == [
        (Outcome.APPLIED, failed["metadata"]["uid"])
    ]
