"""The `moving` step of a maintenance with `--move`: each checkpointed pod that asked to
move is restored on another node, one stage at a time, each a kernel proposal.

    planned              a target chosen as the scheduler would (`placement`), recorded
    planned -> imaged    every container's archive built into an OCI checkpoint image,
                         pushed, its digest read back from the registry, then the archive
                         deleted from the node (`push-image`)
    imaged -> released   a StatefulSet's (a Notebook's) pod only: its owner lets it go,
                         how it does recorded first (`take-over`, `owners`)
    -> stopped           the target checked again, then the pod evicted (its budget
                         honoured) and gone from the API (`stop`)
    stopped -> created   the replacement, same name, created pinned to the target (`restore`)
    created -> restored  the kubelet restored it (`Running`)
    restored -> running  its owner keeps it again (`give-back`; a bare pod has none), and
                         its owner is told where it went

Every stage is saved (revision-checked) before the next starts, so a SIGKILL anywhere
resumes at the stage it reached: a push repeated before its digest was saved, an eviction
of a pod already gone, a create that finds its own replacement, a release or give-back
that finds itself done, never a second copy and never a checkpoint lost (the archive goes
only once the image is confirmed). A pod that cannot move (no registry, no node fits, a
budget, a failed restore) is `failed` with the reason; before it stopped it stays for the
drain (evicted, its checkpoint kept); a bare pod stopped already keeps its images in the
registry for `nodeward maintenance restore`; an owner's pod whose restore failed is
deleted and its owner given back, which starts it afresh from its template.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from nodeward.bus import RetryableError
from nodeward.kube import NotFound
from nodeward.kube.base import Obj
from nodeward.kube.errors import AlreadyExists, BadRequest, EvictionBlocked, Forbidden, Invalid
from schemas.common import PodRef
from schemas.maintenance import CheckpointRecord, MaintenancePhase, MovedPod
from schemas.remediation import Outcome, Remediation
from services.kernel import Proposal
from services.maintenance import image
from services.maintenance.common import Kit, now, pod_ref
from services.maintenance.owners import OwnerRefused, Owners
from services.maintenance.placement import (
    choose_target,
    replacement,
    requests_on,
    restored_by,
    unfit,
)
from services.maintenance.plan import move_failed, moved
from services.maintenance.state import MaintenanceState, MovePlan, MoveStage, PodPlan

FAILED_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)
"""A replacement container waiting for one of these did not restore."""
REFUSED = (Invalid, BadRequest, Forbidden)
"""The API server refused the replacement: trying again changes nothing."""

Save = Callable[[str, Callable[[PodPlan], PodPlan]], Any]


def _images(plan: PodPlan) -> dict[str, str]:
    return {
        c.pod.container or "": c.checkpoint_image for c in plan.checkpoints if c.checkpoint_image
    }


def _staged(plan: PodPlan, stage: str, **fields: Any) -> PodPlan:
    assert plan.move is not None
    return plan.model_copy(update={"move": plan.move.model_copy(update={"stage": stage, **fields})})


class Mover:
    """Moves the pods of one maintenance; `save(key, change)` stores a pod's plan."""

    def __init__(
        self,
        kit: Kit,
        state: MaintenanceState,
        save: Save,
        *,
        pinned: bool = False,
        absent: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        """`pinned`: the recorded target is an operator's choice: if it does not fit the
        move fails, no other node is chosen. `absent`: the pod was gone before (a restore
        of an evicted pod): there is nothing to stop. `details`: added to every proposal's
        (the operator who asked)."""
        self.kit, self.state, self._save = kit, state, save
        self.pinned, self.absent, self.details = pinned, absent, details or {}
        self.owners = Owners(
            kit.cluster, state.maintenance_id, within=kit.settings.stop_timeout.total_seconds()
        )

    def _proposal(self, action: str, plan: PodPlan, reason: str, **details: Any) -> Proposal:
        return self.kit.proposal(
            action, self.state, pod_ref(plan), reason, **{**self.details, **details}
        )

    async def save(self, plan: PodPlan, change: Callable[[PodPlan], PodPlan]) -> PodPlan:
        saved: PodPlan = await self._save(plan.key, change)
        return saved

    async def move(self, plan: PodPlan) -> None:
        """Take the pod's move as far as it goes now; raise to be tried again next tick."""
        assert plan.move is not None
        log = self.kit.log.bind(pod=plan.key)
        if plan.move.stage == "planned" and not self.kit.settings.images.registry:
            plan = await self.fail(plan, "no registry is configured (services.checkpoint.images)")
        if plan.move is not None and plan.move.stage in ("planned", "imaged"):
            plan = await self._place(plan)
        if plan.move is not None and plan.move.stage == "planned":
            plan = await self._image(plan)
        if plan.move is not None and plan.move.stage == "imaged" and plan.move.through_owner:
            plan = await self._release(plan)
        if plan.move is not None and plan.move.stage in ("imaged", "released"):
            plan = await self._stop(plan)
        if plan.move is not None and plan.move.stage == "stopped":
            plan = await self._restore(plan)
        if plan.move is not None and plan.move.stage == "created":
            plan = await self._running(plan)
        if plan.move is not None and plan.move.stage == "restored":
            plan = await self._give_back(plan)
        log.info("move.stage", stage=plan.move.stage if plan.move else None)

    def _failpoint(self, name: str) -> None:
        self.kit.marks.failpoints.hit(name)

    def _gives_up(self, cause: BaseException) -> bool:
        """A failure that will not pass (`ImageError.final`), or the maintenance's deadline
        is past: the move fails instead of being tried again each tick."""
        if getattr(cause, "final", False):
            return True
        deadline = self.state.deadline_at()
        return deadline is not None and now() >= deadline

    async def fail(self, plan: PodPlan, reason: str) -> PodPlan:
        """End the pod's move `failed`: its owner told and the event out first (their ids
        derive from the move: a restart repeats them, deduplicated), then the stage saved,
        so a SIGKILL between never loses the notice."""
        assert plan.move is not None
        stopped = plan.move.stage in ("stopped", "created")
        restarted = left_stopped = None
        # From the moment how the owner lets go is saved, it may have let go: given back
        # (idempotent: an owner never taken over is left as it is).
        if plan.move.via in ("statefulset", "notebook") and plan.move.stage in (
            "imaged",
            "released",
            "stopped",
            "created",
        ):
            given = await self._abandon(plan)
            restarted = f"{plan.move.owner} {plan.move.owner_name}"
            if given.get("stopped_by_someone"):  # its Notebook stays stopped: no restart
                restarted, left_stopped = None, str(given.get("notebook"))
        failed = _staged(plan, "failed", reason=reason)
        notice = move_failed(
            self.state,
            failed,
            reason,
            stopped=stopped,
            restarted_by=restarted,
            left_stopped=left_stopped,
        )
        await self.kit.notify_owner(self.state, failed, notice)
        await self._publish(failed, None, reason)
        return await self.save(plan, lambda p: _staged(p, "failed", reason=reason))

    async def _advance(
        self,
        plan: PodPlan,
        result: Remediation,
        stage: MoveStage,
        failpoint: str | None = None,
        **fields: Any,
    ) -> PodPlan:
        """After a stage's kernel decision: applied, the next stage saved; a dry run changes
        nothing and tells no one (it was audited as what it would do); else the move fails."""
        if result.outcome == Outcome.DRY_RUN:
            return plan
        if result.outcome != Outcome.APPLIED:
            return await self.fail(plan, result.reason)
        if failpoint:
            self._failpoint(failpoint)
        return await self.save(plan, lambda p: _staged(p, stage, **fields))

    async def _publish(self, plan: PodPlan, to: str | None, error: str | None) -> None:
        record = MovedPod(
            pod=PodRef(namespace=plan.namespace, name=plan.name, uid=plan.uid),
            from_node=self.state.node,
            to_node=to,
            images=_images(plan),
            error=error,
        )
        await self.kit.bus.publish(
            self.kit.phase_event(self.state, MaintenancePhase.MOVING, plan.key, moved=[record])
        )

    # the target: chosen before the images are built, checked again before the stop ----
    async def _place(self, plan: PodPlan) -> PodPlan:
        """Record the node the pod goes to: the one chosen before, while it still fits
        (the fleet changes while images are built), else the best that fits now; none
        fits: the move fails before the pod is touched."""
        assert plan.move is not None
        nodes = await self.kit.cluster.nodes.list()
        pods = await self.kit.cluster.pods.list()
        chosen = plan.move.target
        if chosen is not None and self.pinned:
            node = next((n for n in nodes if n["metadata"]["name"] == chosen), None)
            unfits = (
                "no such node"
                if node is None
                else unfit(plan, node, requests_on(pods, chosen), source=None)
            )
            if unfits:
                return await self.fail(plan, f"it cannot go to {chosen}: {unfits}")
            return plan
        if chosen is not None:
            fits, _ = choose_target(
                plan,
                [n for n in nodes if n["metadata"]["name"] in (chosen, self.state.node)],
                pods,
                source=self.state.node,
            )
            if fits == chosen:
                return plan
        target, why = choose_target(plan, nodes, pods, source=self.state.node)
        if target is None:
            return await self.fail(
                plan, "no node can take it: " + ("; ".join(why) or "no other node")
            )
        stage = plan.move.stage
        return await self.save(plan, lambda p: _staged(p, stage, target=target))

    # planned -> imaged ----------------------------------------------------------------
    async def _image(self, plan: PodPlan) -> PodPlan:
        settings = self.kit.settings.images
        proposal = self._proposal(
            "push-image",
            plan,
            f"build the checkpoint images of {plan.key} and push them to {settings.registry}",
            containers=sorted(c.pod.container or "" for c in plan.checkpoints),
        )

        async def act() -> dict[str, Any]:
            current = plan
            for record in list(current.checkpoints):
                current = await self._one_image(current, record)
            return {"images": _images(current)}

        try:
            result = await self.kit.runner.run(
                proposal, act, [self.kit.exemptions], fails=(image.ImageError,)
            )
        except RetryableError as exc:
            cause = exc.__cause__ or exc
            if not self._gives_up(cause):
                raise  # the registry or buildah may come back: tried again next tick
            return await self.fail(plan, str(cause))
        return await self._advance(plan, result, "imaged")

    async def _one_image(self, plan: PodPlan, record: CheckpointRecord) -> PodPlan:
        settings = self.kit.settings.images
        container = record.pod.container or ""
        if record.checkpoint_image is None:
            if not record.path:
                raise image.ImageError(f"{plan.key}/{container}: no archive recorded")
            archive = image.node_path(settings.node_root, self.state.node, record.path)
            ref = image.image_ref(
                settings.registry, plan.namespace, plan.name, container, record.at or now()
            )
            labels = image.checkpoint_annotations(
                container,
                pod=plan.name,
                namespace=plan.namespace,
                node=self.state.node,
                image=record.image,
                checkpointed_at=record.at,
            )
            async with image.build_storage(settings) as root:
                await image.build_image(archive, container, ref, settings, root=root, labels=labels)
                self._failpoint("move.built")
                digest = await image.push_image(ref, settings, root=root)
            self._failpoint("move.pushed")
            pinned = f"{ref.rsplit(':', 1)[0]}@{digest}"
            plan = await self.save(plan, _with_record(container, checkpoint_image=pinned))
            self.kit.log.info("move.pushed", container=container, image=pinned)
            record = next(c for c in plan.checkpoints if c.pod.container == container)
        if not record.archive_deleted and record.path:
            await image.delete_archive(settings.node_root, self.state.node, record.path)
            self._failpoint("move.archive_deleted")
            plan = await self.save(plan, _with_record(container, archive_deleted=True))
        return plan

    # imaged -> stopped ----------------------------------------------------------------
    async def _stop(self, plan: PodPlan) -> PodPlan:
        assert plan.move is not None
        try:
            pod: Obj | None = await self.kit.cluster.pods.get(plan.namespace, plan.name)
        except NotFound:
            pod = None
        if pod is None and self.absent:
            return await self.save(plan, lambda p: _staged(p, "stopped"))
        if pod is not None and pod["metadata"].get("uid") != plan.uid:
            if restored_by(pod, self.state.maintenance_id):
                return await self.save(
                    plan, lambda p: _staged(p, "created", uid=pod["metadata"]["uid"])
                )
            return await self.fail(plan, f"another pod named {plan.key} took its place")
        proposal = self._proposal(
            "stop",
            plan,
            f"stop {plan.key} on {self.state.node}: it restores on {plan.move.target} from its "
            "checkpoint images",
            obj=pod,
            to=plan.move.target,
        )
        settings = self.kit.settings

        async def act() -> dict[str, Any]:
            # A pod its owner is deleting already (a stopped Notebook's) is waited for.
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                await self.kit.cluster.pods.evict(
                    plan.namespace,
                    plan.name,
                    deadline=settings.evict_timeout.total_seconds(),
                    grace_period=settings.grace_period,
                    uid=plan.uid,
                )
            gone = await self.kit.cluster.pods.wait_gone(
                plan.namespace, plan.name, plan.uid, within=settings.stop_timeout.total_seconds()
            )
            if not gone:
                raise TimeoutError(f"{plan.key} still terminating after {settings.stop_timeout}")
            self._failpoint("move.stopped")
            return {"stopped": True}

        guards = [self.kit.exemptions] if pod is not None else []
        try:
            # `resumed`: a stop audited before a SIGKILL (its stage not saved) is not
            # audited again when the restart finds the pod gone.
            result = await self.kit.runner.run(
                proposal, act, guards, fails=(TimeoutError,), resumed=True
            )
        except RetryableError as exc:
            cause = exc.__cause__ or exc
            if not isinstance(cause, EvictionBlocked | TimeoutError) and not self._gives_up(cause):
                raise
            return await self.fail(plan, f"not stopped: {cause}")
        return await self._advance(plan, result, "stopped", "move.stop.audited")

    # stopped -> created ---------------------------------------------------------------
    async def _restore(self, plan: PodPlan) -> PodPlan:
        assert plan.move is not None and plan.move.target is not None
        target = plan.move.target
        at = min((c.at for c in plan.checkpoints if c.at), default=None)
        manifest = replacement(
            plan,
            _images(plan),
            target,
            node=self.state.node,
            maintenance_id=self.state.maintenance_id,
            checkpointed_at=at.isoformat() if at else None,
            controller=plan.move.owner_record if plan.move.via == "notebook" else None,
        )
        proposal = self._proposal(
            "restore",
            plan,
            f"restore {plan.key} on {target} from its checkpoint images",
            to=target,
            images=_images(plan),
        )

        async def act() -> dict[str, Any]:
            try:
                created = await self.kit.cluster.pods.create(plan.namespace, manifest)
            except AlreadyExists:
                created = await self.kit.cluster.pods.get(plan.namespace, plan.name)
                if not restored_by(created, self.state.maintenance_id):
                    raise
            self._failpoint("move.created")
            return {"uid": created["metadata"]["uid"], "to": target}

        try:
            result = await self.kit.runner.run(proposal, act, [], resumed=True)
        except RetryableError as exc:
            cause = exc.__cause__ or exc
            if isinstance(cause, AlreadyExists):
                return await self.fail(plan, f"another pod named {plan.key} took its place")
            if isinstance(cause, REFUSED) or self._gives_up(cause):
                return await self.fail(plan, f"its replacement was refused: {cause}")
            raise
        uid = str(result.details.get("uid"))
        return await self._advance(plan, result, "created", "move.restore.audited", uid=uid)

    # created -> running ---------------------------------------------------------------
    async def _running(self, plan: PodPlan) -> PodPlan:
        assert plan.move is not None
        settings = self.kit.settings
        deadline = time.monotonic() + settings.restore_timeout.total_seconds()
        while True:
            try:
                pod = await self.kit.cluster.pods.get(plan.namespace, plan.name)
            except NotFound:
                return await self.fail(plan, "its replacement was deleted before it ran")
            if pod["metadata"].get("uid") != plan.move.uid:
                return await self.fail(plan, f"another pod named {plan.key} took its place")
            status = pod.get("status") or {}
            waiting = [
                (s.get("state") or {}).get("waiting") or {}
                for s in status.get("containerStatuses") or []
            ]
            bad = next((w for w in waiting if w.get("reason") in FAILED_WAITING), None)
            if bad is not None:
                return await self.fail(
                    plan, f"restore failed: {bad.get('reason')}: {bad.get('message', '')}"
                )
            if status.get("phase") == "Running":
                break
            if time.monotonic() >= deadline:
                return await self.fail(
                    plan,
                    f"not running after {settings.restore_timeout} (phase {status.get('phase')})",
                )
            await asyncio.sleep(settings.tick.total_seconds())
        if plan.move.through_owner:
            return await self.save(plan, lambda p: _staged(p, "restored"))
        return await self._arrived(plan)

    async def _arrived(self, plan: PodPlan) -> PodPlan:
        """The move is over: `running`, its owner told where it went."""
        assert plan.move is not None and plan.move.target is not None
        # Told and published before the stage is saved (ids derive from the move: a repeat
        # after a SIGKILL is deduplicated), so the owner always hears where it went.
        running = _staged(plan, "running")
        await self.kit.notify_owner(self.state, running, moved(self.state, running, _images(plan)))
        await self._publish(running, plan.move.target, None)
        done = await self.save(plan, lambda p: _staged(p, "running"))
        await self._prune(done)
        return done

    # imaged -> released, restored -> running: a StatefulSet's (Notebook's) pod ------------
    async def _release(self, plan: PodPlan) -> PodPlan:
        """Its owner lets it go: how, decided and saved first (the set's manifest is the
        only copy once it is deleted), then done as one kernel decision."""
        assert plan.move is not None
        if plan.move.via is None:
            try:
                via, record = await self.owners.decide(plan)
            except OwnerRefused as exc:
                return await self.fail(plan, f"not released: {exc}")
            plan = await self.save(
                plan, lambda p: _staged(p, "imaged", via=via, owner_record=record)
            )
        move = plan.move
        assert move is not None
        how = (
            f"delete StatefulSet {move.owner_name} leaving its pods, to create it again "
            "once the replacement runs"
            if move.via == "statefulset"
            else f"stop Notebook {(move.owner_record or {}).get('name')} until the replacement runs"
        )
        proposal = self._proposal(
            "take-over",
            plan,
            f"{how}: {plan.key} moves to {move.target}",
            owner=f"{move.owner}/{move.owner_name}",
            via=move.via,
        )

        async def act() -> dict[str, Any]:
            done = await self.owners.release(plan)
            self._failpoint("move.taken_over")
            return done

        try:
            result = await self.kit.runner.run(
                proposal,
                act,
                [self.kit.exemptions],
                fails=(TimeoutError, OwnerRefused),
                resumed=True,
            )
        except RetryableError as exc:
            cause = exc.__cause__ or exc
            if not isinstance(cause, OwnerRefused) and not self._gives_up(cause):
                raise
            return await self.fail(plan, f"not released: {cause}")
        return await self._advance(plan, result, "released", "move.take_over.audited")

    async def _give_back(self, plan: PodPlan) -> PodPlan:
        """Its owner keeps the restored pod again; then the move is over. Tried again each
        tick until it is done: the session runs meanwhile, and an owner left released would
        never start the pod again."""
        assert plan.move is not None
        proposal = self._proposal(
            "give-back",
            plan,
            f"give {plan.key} back to {plan.move.owner} {plan.move.owner_name}: it runs on "
            f"{plan.move.target}",
            owner=f"{plan.move.owner}/{plan.move.owner_name}",
            via=plan.move.via,
        )

        async def act() -> dict[str, Any]:
            done = await self.owners.give_back(plan)
            self._failpoint("move.given_back")
            return done

        result = await self.kit.runner.run(proposal, act, [], fails=(TimeoutError,), resumed=True)
        if result.outcome == Outcome.DRY_RUN:
            return plan
        if result.outcome != Outcome.APPLIED:
            raise RetryableError(f"{plan.key} not given back to its owner: {result.reason}")
        if result.details.get("stopped_by_someone"):
            # Not nodeward's to undo: the stop stays, and the restored pod went with it.
            why = "its Notebook was stopped by someone during the move; the pod stopped with it"
            await self._publish(_staged(plan, "failed", reason=why), None, why)
            return await self.save(plan, lambda p: _staged(p, "failed", reason=why))
        return await self._arrived(plan)

    async def _abandon(self, plan: PodPlan) -> dict[str, Any]:
        """A move through an owner that failed after its release: nodeward's replacement, if
        any, deleted (it did not restore), then the owner given back, which starts the pod
        afresh from its template (or, before the stop, keeps the old one)."""
        assert plan.move is not None
        uid = plan.move.uid if plan.move.stage == "created" else None
        settings = self.kit.settings
        proposal = self._proposal(
            "give-back",
            plan,
            f"give {plan.key} back to {plan.move.owner} {plan.move.owner_name}: the move failed",
            owner=f"{plan.move.owner}/{plan.move.owner_name}",
            via=plan.move.via,
            replacement=uid,
        )

        async def act() -> dict[str, Any]:
            if uid is not None:
                # Evicted, not deleted (the role has no pods delete): a replacement that
                # never ran counts against no disruption budget.
                await self.kit.cluster.pods.evict(plan.namespace, plan.name, uid=uid)
                gone = await self.kit.cluster.pods.wait_gone(
                    plan.namespace, plan.name, uid, within=settings.stop_timeout.total_seconds()
                )
                if not gone:
                    raise TimeoutError(f"nodeward's replacement {plan.key} is still terminating")
            return await self.owners.give_back(plan)

        result = await self.kit.runner.run(proposal, act, [], fails=(TimeoutError,), resumed=True)
        if result.outcome not in (Outcome.APPLIED, Outcome.DRY_RUN):
            raise RetryableError(f"{plan.key} not given back to its owner: {result.reason}")
        return dict(result.details)

    async def _prune(self, plan: PodPlan) -> None:
        """Retention: the pod's checkpoint images beyond `keep` or older than `max_age`
        leave the registry (the ones just pushed are the newest: kept)."""
        settings = self.kit.settings.images
        for record in plan.checkpoints:
            if not record.checkpoint_image:
                continue
            repo = record.checkpoint_image.split("@", 1)[0]
            try:
                deleted = await image.prune(repo, settings)
            except image.ImageError as exc:
                self.kit.log.warning("move.prune_failed", repository=repo, error=str(exc))
                continue
            if deleted:
                self.kit.log.info("move.pruned", repository=repo, deleted=deleted)


def _with_record(container: str, **fields: Any) -> Callable[[PodPlan], PodPlan]:
    def change(plan: PodPlan) -> PodPlan:
        records = [
            c.model_copy(update=fields) if c.pod.container == container else c
            for c in plan.checkpoints
        ]
        return plan.model_copy(update={"checkpoints": records})

    return change


def moving(state: MaintenanceState) -> list[str]:
    """The pods whose move is not over (neither running elsewhere nor failed)."""
    return [
        p.key
        for p in state.pods.values()
        if p.status == "checkpointed"
        and p.move is not None
        and p.move.stage not in ("running", "failed")
    ]


__all__ = ["MovePlan", "Mover", "moving"]
