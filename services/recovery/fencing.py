"""A hung node's escalation ladder (step `hung` of a recovery of plan `hang`): its node
group's rungs (`hang.Ladder`), one after another, each with its timeout, until the node is
back (a new bootID and `Ready`), then validated and released as every recovery is.

A BMC rung: the power off asked (soft or hard; `power` saved first), confirmed by the BMC's
chassis status, and only then the node fenced with Kubernetes' out-of-service taint
(`node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`), so its StatefulSet pods and
their volumes move (the pod GC force-deletes its terminating pods); once they are gone (or
`fence_wait` passed) it is powered on. The taint comes off when the node is back and
`Ready` (before its release), and only the taint nodeward put there: one found there before
is left for whoever put it. A node whose power state the BMC cannot tell is never fenced:
wrong credentials or a missing address or Secret escalate to on-call at once.

Each act (`reboot`, `power-off`, `fence`, `power-on`, `unfence`) is a kernel proposal
through the exemptions, the operators' pause and the group's `min_healthy` floor (the last
only for what takes the node further out: reboot, power off); a refusal waits, audited once.
A restart resumes from `power`: a command is sent again only while the chassis is not yet
where it was asked to go, so a restart never powers a node off a second time in one rung.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from nodeward.bmc import Bmc, BmcConfigError, BmcError, PowerState, bmc_target
from nodeward.kube import KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.nodes import taints_of
from schemas.remediation import Outcome, Remediation
from services.kernel import Guard, Proposal, Stage, Verdict, blockers
from services.kernel.drain import excused
from services.recovery.common import Kit
from services.recovery.hang import (
    OUT_OF_SERVICE,
    OUT_OF_SERVICE_VALUE,
    Ladder,
    Rung,
    RungAction,
    ready,
)
from services.recovery.remediators import REMEDIATORS, RemediatorError, boot_id
from services.recovery.state import Plan, Power, RecoveryRecord, Step


class Steps(Protocol):
    """What the ladder uses of the recovery's steps (`steps.RecoverySteps`)."""

    kit: Kit

    async def update(self, record: RecoveryRecord, **changes: Any) -> RecoveryRecord: ...

    async def save(
        self, record: RecoveryRecord, step: Step, what: str, *, note_only: bool = False
    ) -> RecoveryRecord: ...

    async def escalate(self, record: RecoveryRecord, why: str, *, rma: bool = True) -> None: ...

    def proposal(self, record: RecoveryRecord, action: str, reason: str) -> Proposal: ...

    async def record_step(
        self, record: RecoveryRecord, action: str, reason: str, *, what: str = "", **details: Any
    ) -> None: ...

    async def guarded(
        self,
        record: RecoveryRecord,
        proposal: Proposal,
        act: Callable[[], Awaitable[dict[str, Any]]],
        *,
        floor: bool = False,
        fails: tuple[type[Exception], ...] = (),
        extra: Sequence[Guard] = (),
    ) -> Remediation: ...


class Unharmed:
    """A guard: no BMC power off of a node whose kubelet still answers (`Ready`) while a pod
    a reboot would destroy is on it (`services.kernel.drain.blockers`: a budget, an
    exemption, Falco's evidence, a pod not yet drained). Such a node can be drained: only
    one that cannot (its kubelet gone) is powered off with its pods, and then fenced."""

    name = "pods_left"
    stage = Stage.OWNERSHIP

    def __init__(self, kit: Kit) -> None:
        self.kit = kit

    async def check(self, proposal: Proposal) -> Verdict | None:
        if proposal.obj is None or not ready(proposal.obj):
            return None
        node = proposal.target.name
        left = await blockers(
            self.kit.cluster, node, self.kit.exemptions, self.kit.settings.skip_namespaces
        )
        if not left:
            return None
        listed = "; ".join(f"{pod}: {why}" for pod, why in sorted(left.items()))
        return Verdict(
            self.name,
            f"refused: {node} is Ready (its kubelet answers) with {len(left)} pod(s) a power "
            f"off would destroy ({listed}); it is powered off only drained, or once it stops "
            "answering",
        )


class _Escalate(Exception):
    """The BMC cannot be used for this node: on-call, in one line."""


class HungSteps:
    """Step `hung`: the node group's ladder, rung by rung."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.kit: Kit = steps.kit
        self.unharmed = Unharmed(self.kit)

    # the step ----------------------------------------------------------------------------
    async def hung(self, record: RecoveryRecord, obj: Obj) -> None:
        """One pass of the ladder for `record`'s node."""
        ladder = self.ladder(record)
        if ladder is None:
            await self.steps.escalate(record, f"no ladder named {record.ladder!r}", rma=False)
            return
        if record.rung >= len(ladder.steps):
            await self.steps.escalate(record, f"the ladder {ladder.name}'s steps are spent")
            return
        rung = ladder.steps[record.rung]
        if record.rung_started_at is None:
            record = await self.steps.update(
                record, rung_started_at=time.time(), boot_id=boot_id(obj) or record.boot_id
            )
        if record.power in (Power.ASKED, Power.ON_ASKED) and self.back(record, obj):
            await self._back(record, rung, obj)
            return
        if rung.action == RungAction.ONCALL:
            await self.steps.escalate(
                record, f"hung ({'; '.join(record.causes) or 'unresponsive'}); the ladder "
                f"{ladder.name} did not bring it back: {'; '.join(record.history[-3:])}",
            )  # fmt: skip
            return
        assert record.rung_started_at is not None
        if time.time() >= record.rung_started_at + rung.timeout.total_seconds():
            await self.next_rung(record, rung, f"not back within {rung.timeout}")
            return
        try:
            if rung.action == RungAction.REBOOT:
                await self._reboot(record, ladder)
            else:
                await self._power(record, ladder, rung, obj)
        except _Escalate as exc:
            await self.steps.escalate(record, str(exc), rma=False)
        except BmcError as exc:  # unreachable, busy: asked again until the rung's timeout
            self.kit.log.warning("recovery.bmc_failed", error=str(exc))
            if record.last_failure != str(exc):
                await self.steps.update(record, last_failure=str(exc))

    def ladder(self, record: RecoveryRecord) -> Ladder | None:
        return next((x for x in self.kit.settings.hang.ladders if x.name == record.ladder), None)

    async def ladder_for(self, node: str) -> Ladder | None:
        """The first ladder whose selector selects `node` (the API server matches it)."""
        for ladder in self.kit.settings.hang.ladders:
            if not ladder.selector:
                return ladder
            found = await self.kit.cluster.nodes.list(
                label_selector=ladder.selector, field_selector=f"metadata.name={node}"
            )
            if found:
                return ladder
        return None

    async def after_reboot(self, record: RecoveryRecord, why: str) -> bool:
        """A reboot asked of a node that never came back and is not Ready: the node hung.
        True when its recovery goes on through the ladder, after its first reboot rung."""
        if not self.kit.settings.hang.enabled or record.plan == Plan.HANG:
            return False
        obj = await self.kit.cluster.nodes.get(record.node)
        ladder = await self.ladder_for(record.node)
        if ready(obj) or ladder is None:
            return False
        rebooted = [i for i, r in enumerate(ladder.steps) if r.action == RungAction.REBOOT]
        rung = rebooted[0] + 1 if rebooted else 0
        await REMEDIATORS["reboot-annotation"].finish(record, self.kit.tools)
        causes = [f"{why}, and not Ready"]
        await self.steps.record_step(
            record, "recover", f"{record.node} hung: {why}, and it is not Ready; its recovery "
            f"goes on through the ladder {ladder.name}, step {rung + 1}", what="hung",
            ladder=ladder.name,
        )  # fmt: skip
        await self.steps.update(
            record, plan=Plan.HANG, ladder=ladder.name, rung=rung, rung_started_at=None,
            power=None, power_sent=False, causes=causes, asked_at=None, step=Step.HUNG,
        )  # fmt: skip
        self.kit.wake.set()
        return True

    async def validation_failed(self, record: RecoveryRecord, why: str) -> None:
        """A hung node back but not valid: the ladder's next rung."""
        ladder = self.ladder(record)
        rungs = ladder.steps if ladder else []
        rung = rungs[record.rung] if record.rung < len(rungs) else None
        if rung is None:
            await self.steps.escalate(record, f"validation failed: {why}")
            return
        await self.next_rung(record, rung, f"validation failed: {why}", audit=False)

    async def unfence_when_back(self, record: RecoveryRecord) -> None:
        """An escalated node nodeward fenced: its taint comes off once it is back, Ready."""
        try:
            obj = await self.kit.cluster.nodes.get(record.node)
        except NotFound:
            return
        if ready(obj):
            await self.unfence(record)

    @staticmethod
    def back(record: RecoveryRecord, obj: Obj) -> bool:
        """Booted again since the rung began (a new bootID) and `Ready`."""
        now = boot_id(obj)
        return now is not None and now != record.boot_id and ready(obj)

    async def _back(self, record: RecoveryRecord, rung: Rung, obj: Obj) -> None:
        if rung.action == RungAction.REBOOT:
            await REMEDIATORS["reboot-annotation"].finish(record, self.kit.tools)
        await self.steps.record_step(
            record, rung.action.value,
            f"{record.node} back after {rung.action.value}: bootID {record.boot_id} -> "
            f"{boot_id(obj)}, Ready", what=f"back-{record.rung}", boot_id=boot_id(obj),
        )  # fmt: skip
        await self.steps.save(record, Step.VALIDATING, f"back after {rung.action.value}")
        self.kit.wake.set()

    async def next_rung(
        self, record: RecoveryRecord, rung: Rung, why: str, *, audit: bool = True
    ) -> None:
        """The rung failed: audited as a failure, then the ladder's next rung."""
        if audit:
            proposal = self.steps.proposal(
                record, rung.action.value, f"{rung.action.value} of {record.node} failed: {why}"
            )
            proposal.details["rung"] = record.rung
            await self.kit.runner.fail(proposal)
        if rung.action == RungAction.REBOOT:
            await REMEDIATORS["reboot-annotation"].finish(record, self.kit.tools)
        await self.steps.update(
            record,
            rung=record.rung + 1,
            rung_started_at=None,
            power=None,
            power_sent=False,
            asked_at=None,
            waiting=None,
            last_failure=why,
            history=[*record.history, f"hung: {rung.action.value} failed: {why}"][-40:],
            step=Step.HUNG,
        )
        self.kit.marks.failpoints.hit("recovery.rung")
        self.kit.wake.set()

    # rungs ---------------------------------------------------------------------------------
    async def _reboot(self, record: RecoveryRecord, ladder: Ladder) -> None:
        if record.power is not None:
            return  # asked: waiting for the new boot (or the rung's timeout)

        async def act() -> dict[str, Any]:
            try:
                return await REMEDIATORS["reboot-annotation"].ask(record, self.kit.tools)
            except RemediatorError as exc:
                raise KubeError(str(exc)) from exc

        decided = await self._act(record, ladder, "reboot", "reboot request (the reboot "
                                  "operator's)", act, takes_out=True)  # fmt: skip
        if decided.outcome == Outcome.APPLIED:
            await self.steps.update(record, power=Power.ASKED)

    async def _power(self, record: RecoveryRecord, ladder: Ladder, rung: Rung, obj: Obj) -> None:
        graceful = rung.action == RungAction.POWER_OFF_ON
        bmc = await self._bmc(record, obj)
        if record.power is None:
            record = await self.steps.update(record, power=Power.OFF_ASKED, power_sent=False)
        if record.power == Power.OFF_ASKED:
            state = await self._state(bmc)
            if state == PowerState.OFF:
                await self.steps.record_step(
                    record, "power-off", f"{record.node} is off: the BMC's chassis status says "
                    "so", what=f"off-{record.rung}", bmc=bmc.target.address,
                )  # fmt: skip
                record = await self.steps.update(record, power=Power.OFF, power_sent=False)
            elif not record.power_sent:
                how = "soft shutdown (ACPI)" if graceful else "hard power off"

                async def off() -> dict[str, Any]:
                    await self._command(bmc.power_off(graceful=graceful))
                    return {"bmc": bmc.target.address, "graceful": graceful}

                decided = await self._act(record, ladder, "power-off", f"BMC {how}", off,
                                          obj=obj, extra=[self.unharmed],
                                          takes_out=True)  # fmt: skip
                if decided.outcome == Outcome.FAILED:  # the BMC refused it (audited): no use
                    await self.next_rung(record, rung, f"the BMC refused the {how}", audit=False)
                elif decided.outcome == Outcome.APPLIED:
                    self.kit.marks.failpoints.hit("recovery.power_off_sent")
                    await self.steps.update(record, power_sent=True, asked_at=time.time())
                return
            else:
                timeout = self.kit.settings.hang.power_off_timeout.total_seconds()
                if time.time() >= (record.asked_at or record.rung_started_at or 0) + timeout:
                    await self.next_rung(record, rung, "the BMC never reported it off")
                return
        if record.power == Power.OFF:
            await self._fence(record, ladder)
            return
        if record.power == Power.FENCED:
            if not await self._moved(record):
                return
            record = await self.steps.update(record, power=Power.ON_ASKED, power_sent=False)
        if record.power == Power.ON_ASKED and not record.power_sent:
            if await self._state(bmc) == PowerState.OFF:

                async def on() -> dict[str, Any]:
                    await self._command(bmc.power_on())
                    return {"bmc": bmc.target.address}

                decided = await self._act(record, ladder, "power-on", "BMC power on", on)
                if decided.outcome != Outcome.APPLIED:
                    return
            await self.steps.update(record, power_sent=True)

    async def _fence(self, record: RecoveryRecord, ladder: Ladder) -> None:
        """The out-of-service taint, on a node the BMC said is off (never otherwise)."""
        obj = await self.kit.cluster.nodes.get(record.node)
        foreign = any(t.get("key") == OUT_OF_SERVICE for t in taints_of(obj)) and not record.fenced
        if not foreign and not record.fenced:
            record = await self.steps.update(record, fenced=True)  # first: a restart takes it off

        async def act() -> dict[str, Any]:
            if foreign:
                return {"taint": OUT_OF_SERVICE, "already": "placed by someone else: left to them"}
            await self.kit.cluster.nodes.add_taint(
                record.node, OUT_OF_SERVICE, "NoExecute", value=OUT_OF_SERVICE_VALUE
            )
            return {"taint": f"{OUT_OF_SERVICE}={OUT_OF_SERVICE_VALUE}:NoExecute"}

        why = "powered off (the BMC says so): its pods and their volumes may move"
        if (await self._act(record, ladder, "fence", why, act)).outcome == Outcome.APPLIED:
            self.kit.marks.failpoints.hit("recovery.fenced")
            await self.steps.update(record, power=Power.FENCED, fenced_at=time.time())

    async def _moved(self, record: RecoveryRecord) -> bool:
        """The fenced node's pods (DaemonSet pods aside) are gone, or `fence_wait` passed."""
        pods = await self.kit.cluster.pods.on_node(record.node)
        left = [p for p in pods if excused(p, []) not in ("DaemonSet pod", "mirror pod")]
        waited = time.time() - (record.fenced_at or time.time())
        return not left or waited >= self.kit.settings.hang.fence_wait.total_seconds()

    async def unfence(self, record: RecoveryRecord) -> RecoveryRecord:
        """nodeward's out-of-service taint off a node that is back and `Ready`."""
        if not record.fenced:
            return record
        proposal = self.steps.proposal(
            record, "unfence", f"{record.node} is back and Ready: the out-of-service taint off"
        )

        async def act() -> dict[str, Any]:
            removed = await self.kit.cluster.nodes.remove_taint(record.node, OUT_OF_SERVICE)
            return {"taint": OUT_OF_SERVICE, "removed": removed}

        decided = await self.kit.runner.run(proposal, act, [], retry=False)
        if decided.outcome in (Outcome.APPLIED, Outcome.DRY_RUN):
            record = await self.steps.update(record, fenced=False)
        return record

    # helpers -------------------------------------------------------------------------------
    async def _act(
        self,
        record: RecoveryRecord,
        ladder: Ladder,
        action: str,
        what: str,
        act: Callable[[], Awaitable[dict[str, Any]]],
        *,
        takes_out: bool = False,
        obj: Obj | None = None,
        extra: Sequence[Guard] = (),
    ) -> Remediation:
        """The act as a kernel proposal (`RecoverySteps.guarded`) on the node as read
        (`obj`), with `extra` guards; its audit record."""
        causes = "; ".join(record.causes) or "unresponsive"
        proposal = self.steps.proposal(
            record, action,
            f"{what} of {record.node}, hung: {causes} (ladder {ladder.name}, step {record.rung + 1})",
        )  # fmt: skip
        proposal.details.update(ladder=ladder.name, rung=record.rung)
        if obj is not None:
            proposal = dataclasses.replace(proposal, obj=obj)
        return await self.steps.guarded(
            record, proposal, act, floor=takes_out, fails=(BmcError,), extra=extra
        )

    async def _bmc(self, record: RecoveryRecord, obj: Obj) -> Bmc:
        """The node's BMC: its address annotation, the credentials Secret. Either missing or
        malformed escalates: a node whose power cannot be known is never fenced."""
        settings = self.kit.settings.hang
        where = f"{settings.bmc_namespace}/{settings.bmc_secret}"
        try:
            secret = await self.kit.cluster.secrets.get_own(
                settings.bmc_namespace, settings.bmc_secret
            )
        except NotFound as exc:
            raise _Escalate(f"no BMC credentials: Secret {where} not found; not fenced") from exc
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        try:
            target = bmc_target(record.node, annotations, secret.get("data") or {})
        except BmcConfigError as exc:
            raise _Escalate(f"{exc} (Secret {where}); not fenced") from exc
        return Bmc(target, timeout=settings.bmc_timeout.total_seconds())

    async def _state(self, bmc: Bmc) -> PowerState:
        state: PowerState = await self._command(bmc.power_state())
        return state

    @staticmethod
    async def _command(call: Awaitable[Any]) -> Any:
        """A BMC command; the BMC refusing the credentials escalates (one line), anything
        else is asked again on the next pass until the rung's timeout."""
        try:
            return await call
        except BmcError as exc:
            if exc.kind == "credentials":
                raise _Escalate(f"{exc}; its power state is unknown: not fenced") from exc
            raise
