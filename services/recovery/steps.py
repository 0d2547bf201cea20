"""The recovery's steps, on the kernel's durable workflow engine (`services.kernel.workflow`).

draining (maintenance requested; `maintenance.done` moves it on, `drain_timeout` escalates)
-> blocked (the drain left pods: evictions retried, `drain_timeout` escalates) ->
remediating (the remediator asked, its attempt and the bootID recorded first) -> rebooting
(until the bootID changes; `reboot_timeout` is a failed attempt) -> validating (the GPU
agent) -> releasing (the owners' release paths) -> released; escalated and gone end it too.
Each move is one revision-checked write; the engine's failpoint `recovery.<step>` fires
after it (and after each note of the step's history). The loop steps every record once per
`interval` (or when woken), under the node's lock, which the consumers take too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import NoKeysError
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus.control import ControlTimeout, request
from nodeward.kube import KubeError, NotFound
from nodeward.kube.base import Obj
from schemas.base import make_event
from schemas.common import PodRef
from schemas.control import ControlReply, ControlRequest, ControlStatus
from schemas.ids import stable_id
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.notify import Severity
from schemas.recovery import VALIDATE, ValidateRequest, ValidationReport, agent_subject
from schemas.remediation import Outcome, Remediation
from services.kernel import (
    HOLD_ANNOTATION,
    DrainSettings,
    Guard,
    Proposal,
    Workflow,
    blockers,
    drain,
    hold_note,
    hold_of,
    node_ref,
)
from services.kernel.holds import release_command
from services.kernel.workflow import Gone, Retry
from services.kernel.workflow import Step as FlowStep
from services.recovery.common import (
    ACTOR,
    BACKOFF_CAP_S,
    NAME,
    Kit,
    expected_gpus,
    has_quarantine,
)
from services.recovery.fencing import HungSteps
from services.recovery.policy import (
    AfterFailure,
    after_validation_failure,
    allows_move,
)
from services.recovery.remediators import (
    REMEDIATORS,
    RemediatorError,
    boot_id,
)
from services.recovery.state import (
    Plan,
    RecoveryRecord,
    Step,
    node_key,
)

DRY_RUN_WAIT = "dry_run"
"""`waiting` of a recovery whose act a dry-running service only audited."""


class RecoverySteps:
    """The workflow of every node's recovery, and the loop that drives it."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.hung = HungSteps(self)
        self.flow = self._workflow()

    def _workflow(self) -> Workflow[RecoveryRecord]:
        """The recovery's steps on the kernel's workflow engine. A step that raised is tried
        again on a later pass (doubling from `interval`); the drain and the reboot wait up
        to their timeouts (`drain_timeout` from the start, `reboot_timeout` from the ask),
        then escalate or count a failed attempt."""
        interval = self.kit.settings.interval.total_seconds()
        retry = Retry(first_s=interval, cap_s=max(interval * 8, interval))

        def step(fn: Callable[[RecoveryRecord, Obj], Awaitable[None]], **more: Any) -> Any:
            return FlowStep(self._on_node(fn), retry=retry, **more)

        return Workflow(
            NAME,
            self.kit.records,
            {
                Step.DRAINING: step(
                    self._draining, deadline=self._drain_deadline, expired=self._undrained
                ),
                Step.BLOCKED: step(
                    self._blocked, deadline=self._drain_deadline, expired=self._still_blocked
                ),
                Step.REMEDIATING: step(self._remediate),
                Step.REBOOTING: step(
                    self._rebooting, deadline=self._reboot_deadline, expired=self._no_reboot
                ),
                Step.VALIDATING: step(self._validate),
                Step.HUNG: step(self.hung.hung),
                Step.RELEASING: step(self._release),
            },
            prefix="node.",
            key_of=lambda r: node_key(r.node),
            identity=lambda r: r.incident,
            step_of=lambda r: r.step.value,
            with_step=lambda r, to: r.model_copy(update={"step": Step(to)}),
            errors=(KubeError, NatsError, TimeoutError),
            failpoints=self.kit.marks.failpoints,
        )

    async def drained(
        self, record: RecoveryRecord, by: str, failures: list[str] | None = None
    ) -> bool:
        """Move on to the reset or reboot if no pod it would harm is left on the node (of
        the reset's scope, `RecoveryRecord.scope`); else the recovery is blocked (on-call
        paged once). True when drained."""
        left = await blockers(
            self.kit.cluster,
            record.node,
            self.kit.exemptions,
            self.kit.settings.skip_namespaces,
            only=record.scope(),
        )
        if left:
            for line in failures or []:  # the maintenance's words (the budget) where it has any
                pod, _, why = line.partition(": ")
                if pod in left and why:
                    left[pod] = why
            await self._block(record, left)
            return False
        among = "" if record.scope() is None else " among the pods holding the failed GPU"
        await self._record(
            record,
            "drain",
            f"{record.node} drained by {by}: no pod left{among} that the {record.plan.value} "
            "would harm",
            what="drained",
        )
        await self.save(record, Step.REMEDIATING, f"drained ({by})")
        self.kit.wake.set()
        return True

    async def _block(self, record: RecoveryRecord, left: dict[str, str]) -> RecoveryRecord:
        """The drain left pods: no reset or reboot; evictions retried every `evict_retry`;
        on-call paged (critical) the first time, with the pods and what keeps each."""
        now = time.time()
        first = record.blocked_since is None
        # A pod still there keeps the most telling reason seen (an eviction's budget).
        left = {
            pod: record.blocked.get(pod, why) if why.startswith("still running") else why
            for pod, why in left.items()
        }
        record = await self.update(
            record,
            blocked=left,
            blocked_since=record.blocked_since or now,
            next_evict_at=(
                now + self.kit.settings.evict_retry.total_seconds()
                if first
                else record.next_evict_at
            ),
            step=Step.BLOCKED,
        )
        if not first:
            return record
        listed = "; ".join(f"{pod}: {why}" for pod, why in sorted(left.items()))
        proposal = dataclasses.replace(
            self._proposal(
                record,
                "drain",
                f"{record.node} is not drained: {len(left)} pod(s) left"
                + ("" if record.scope() is None else " of those holding the failed GPU")
                + f" ({listed}). No "
                f"{record.plan.value} while they are there; the node stays quarantined. "
                "nodeward never forces past a PodDisruptionBudget, an exemption or Falco's "
                "evidence: free the budget, move the pods, lift the isolation, or release "
                f"the quarantine ({release_command(record.node)}). Evictions "
                f"are tried again every {self.kit.settings.evict_retry.total_seconds():g}s until "
                f"drain_timeout ({self.kit.settings.drain_timeout.total_seconds():g}s after the "
                "start), then on-call is paged again",
            ),
            trigger_id=record.attempt_id("drain-blocked"),
            severity=Severity.CRITICAL,
            title=f"{record.node}: drain blocked",
        )
        await self.kit.runner.fail(proposal, guard="drain_blocked", details={"pods": left})
        await self.save(record, Step.BLOCKED, f"{len(left)} pod(s) left: {listed}"[:400])
        return record

    async def _blocked(self, record: RecoveryRecord, obj: Obj) -> None:
        """Wait for the pods the drain left to go (evicting them again, budgets honoured),
        until `drain_timeout`; then on-call, the node quarantined."""
        if await self.drained(record, "the evictions retried after the drain"):
            return
        stored = await self.kit.records.get(node_key(record.node))
        record = stored.value if stored else record
        if time.time() >= self._drain_deadline(record):
            return  # past drain_timeout: the engine escalates it
        if time.time() < (record.next_evict_at or 0) or self.kit.runner.dry_run:
            return  # not yet; or a service turned dry-running since: it evicts nothing
        # One attempt per pod, no waiting on a budget: the pass drives every node in turn.
        wait = min(self.kit.settings.evict_retry.total_seconds(), 0.5)
        result = await drain(
            self.kit.cluster,
            record.node,
            DrainSettings(
                enabled=True,
                deadline=timedelta(seconds=wait),
                skip_namespaces=self.kit.settings.skip_namespaces,
            ),
            self.kit.exemptions,
            only=record.scope(),
        )
        # evicted: gone, or terminating (a blocker until it is gone, not a budget's refusal)
        moved = [*result.evicted, *result.gone, *result.terminating]
        if moved:
            await self._record(
                record,
                "drain",
                f"evicted {len(moved)} pod(s) the drain had left on {record.node}: "
                f"{', '.join(moved)}",
                what=f"evicted-{len(record.history)}",
            )
        left = dict(record.blocked)
        for pod in moved:
            left.pop(pod, None)
        left.update({pod: f"not evicted: {why}" for pod, why in result.blocked.items()})
        left.update(dict.fromkeys(result.terminating, "terminating"))
        await self.update(
            record,
            blocked=left,
            next_evict_at=time.time() + self.kit.settings.evict_retry.total_seconds(),
        )
        if moved:
            self.kit.wake.set()

    # the loop ---------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Drive every recovery under way, a pass each `interval` (or when woken)."""
        interval = self.kit.settings.interval.total_seconds()
        while not stopping.is_set():
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not stop the loop
                self.kit.log.exception("recovery.pass_failed")
            with contextlib.suppress(TimeoutError):
                await within(self.kit.wake.wait(), interval)
            self.kit.wake.clear()

    async def pass_once(self) -> None:
        try:
            keys = await self.kit.records.kv.keys()
        except NoKeysError:
            return
        for key in keys:
            if not key.startswith("node."):
                continue
            node = key.removeprefix("node.")
            with structlog.contextvars.bound_contextvars(node=node):
                async with self.kit.node_lock(node):
                    current = await self.kit.records.get(key)
                    if current is None:
                        continue
                    if current.value.terminal:
                        if current.value.held:
                            await self._lift_hold(current.value)
                        if current.value.fenced:  # escalated fenced: off once back, Ready
                            await self.hung.unfence_when_back(current.value)
                        continue
                    await self.step(current.value)

    async def step(self, record: RecoveryRecord) -> None:
        """One step of one recovery (the kernel's workflow engine runs it)."""
        await self.flow.step(record)

    def _on_node(
        self, fn: Callable[[RecoveryRecord, Obj], Awaitable[None]]
    ) -> Callable[[RecoveryRecord], Awaitable[float | None]]:
        """A step of a node still quarantined: one that left the cluster, or whose
        quarantine ended some other way (but while releasing), ends the recovery instead."""

        async def run(record: RecoveryRecord) -> float | None:
            try:
                obj = await self.kit.cluster.nodes.get(record.node)
            except NotFound:
                await self.save(record, Step.GONE, "the node left the cluster")
                return None
            hung = record.plan == Plan.HANG  # a hung node's ladder needs no quarantine
            if record.step != Step.RELEASING and not hung and not has_quarantine(obj):
                await self._ended_elsewhere(record)
                return None
            await fn(record, obj)
            return None

        return run

    def _drain_deadline(self, record: RecoveryRecord) -> float:
        return record.started_at + self.kit.settings.drain_timeout.total_seconds()

    def _reboot_deadline(self, record: RecoveryRecord) -> float:
        return (
            record.asked_at or record.updated_at
        ) + self.kit.settings.reboot_timeout.total_seconds()

    async def _undrained(self, record: RecoveryRecord, why: str) -> None:
        since = time.time() - record.started_at
        await self.escalate(record, f"no maintenance done within {since:.0f}s", rma=False)

    async def _still_blocked(self, record: RecoveryRecord, why: str) -> None:
        since = time.time() - record.started_at
        listed = "; ".join(f"{pod}: {why}" for pod, why in sorted(record.blocked.items()))
        await self.escalate(
            record,
            f"the drain left {len(record.blocked)} pod(s) for {since:.0f}s, past "
            f"drain_timeout: {listed}",
            rma=False,
        )

    async def _no_reboot(self, record: RecoveryRecord, why: str) -> None:
        waited = time.time() - (record.asked_at or record.updated_at)
        if await self.hung.after_reboot(record, f"no reboot within {waited:.0f}s"):
            return  # the node hung: its ladder's next rung after a reboot request
        await self._failed_attempt(record, f"no reboot within {waited:.0f}s")

    async def _draining(self, record: RecoveryRecord, obj: Obj) -> None:
        """Ask for the maintenance (its id is the recovery's: asking again is a no-op);
        `handle_maintenance` moves on when it is done."""
        if time.time() >= self._drain_deadline(record) or "draining: requested" in record.history:
            return  # past drain_timeout: the engine escalates it
        mid = record.maintenance_id or f"mnt-recovery-{record.incident}"
        movable, why_move = allows_move(record.xids, self.kit.catalog)
        move = movable and self.kit.settings.move_sessions
        first = "checkpoints and moves of opted-in sessions" if move else "checkpoints"
        scope = record.scope()  # a reset's holders; a reboot (even grown from one): the node
        why = record.drain_why if scope == record.drain_pods else "a reboot drains the whole node"
        proposal = self._proposal(record, "drain", f"maintenance {mid} of {record.node}: "
                                  f"{first} first, then the drain, before the "
                                  f"{record.plan.value}" + (f"; {why}" if why else ""))  # fmt: skip
        proposal.details.update(move=move, move_reason=why_move, drain_pods=scope)

        async def act() -> dict[str, Any]:
            request = Maintenance(
                node=record.node,
                phase=MaintenancePhase.REQUESTED,
                maintenance_id=mid,
                reason=f"GPU recovery ({record.plan.value}): {record.reason}"[:1024],
                requested_by=ACTOR,
                deadline_s=self.kit.settings.drain_deadline.total_seconds(),
                move=move,
                pods=None if scope is None else [_pod_ref(pod) for pod in scope],
            )
            at = datetime.fromtimestamp(record.started_at, UTC)
            await self.kit.bus.publish(
                make_event(request, source=ACTOR, id=stable_id(at, mid, "requested"))
            )
            return {"maintenance": mid}

        decided = await self.guarded(record, proposal, act)
        if decided.outcome == Outcome.APPLIED:
            await self.save(record, Step.DRAINING, "requested", note_only=True)

    async def _remediate(self, record: RecoveryRecord, obj: Obj) -> None:
        """Ask the remediator (boot id and attempt saved first: a restart asks again under
        the same attempt and waits for a boot after the recorded one)."""
        if record.attempts >= self.kit.settings.max_attempts and record.asked_at is None:
            await self.escalate(record, f"{record.attempts} {record.plan.value} attempts")
            return
        remediator = REMEDIATORS.get(record.remediator)
        if remediator is None:
            await self.escalate(record, f"no remediator named {record.remediator!r}", rma=False)
            return
        if record.asked_at is None and time.time() < (record.next_try_at or 0):
            return  # the back-off after a failed attempt
        if record.asked_at is None:
            # Drained means empty, checked again right before asking (after a restart, a pod
            # bound to the node by hand): a reset or reboot never meets a pod it would harm.
            left = await blockers(
                self.kit.cluster,
                record.node,
                self.kit.exemptions,
                self.kit.settings.skip_namespaces,
                only=record.scope(),
            )
            if left:
                await self._block(record, left)
                return
        if record.asked_at is None:
            # From the cure on, only validation judges the GPUs: no automatic release.
            if not self.kit.runner.dry_run:
                await self._hold(
                    record, f"{record.plan.value} of incident {record.incident} under way"
                )
            record = await self.update(
                record,
                attempts=record.attempts + 1,
                boot_id=boot_id(obj),
                asked_at=time.time(),
            )
        action = record.plan.value
        proposal = self._proposal(
            record,
            action,
            f"{action} of {record.node} (GPU {', '.join(map(str, record.gpus)) or '?'}) "
            f"through {remediator.name}, attempt {record.attempts}",
        )

        async def act() -> dict[str, Any]:
            try:
                asked = await remediator.ask(record, self.kit.tools)
            except RemediatorError as exc:
                raise _Failed(str(exc)) from exc
            self.kit.marks.failpoints.hit("recovery.asked")  # asked, not yet audited nor saved
            return asked

        try:
            decided = await self.guarded(record, proposal, act)
        except _Failed as exc:
            await self.kit.runner.fail(proposal, reason=f"{proposal.reason}; failed: {exc}")
            await self.update(record, asked_at=None, last_failure=str(exc))
            return
        if decided.outcome != Outcome.APPLIED:
            return
        if remediator.waits_for_reboot(record.plan):
            await self.save(record, Step.REBOOTING, f"asked ({remediator.name})")
        else:
            await self.save(record, Step.VALIDATING, f"reset ({remediator.name})")
        self.kit.wake.set()

    async def _rebooting(self, record: RecoveryRecord, obj: Obj) -> None:
        now_boot = boot_id(obj)
        if now_boot is not None and now_boot != record.boot_id:
            remediator = REMEDIATORS[record.remediator]
            await remediator.finish(record, self.kit.tools)
            await self._record(
                record, "reboot", f"{record.node} rebooted: bootID {record.boot_id} -> {now_boot}",
                what="rebooted", boot_id=now_boot,
            )  # fmt: skip
            await self.save(record, Step.VALIDATING, f"rebooted ({now_boot})")
            self.kit.wake.set()

    async def _validate(self, record: RecoveryRecord, obj: Obj) -> None:
        ask = ValidateRequest(
            node=record.node,
            request_id=record.attempt_id("validate"),
            expected_gpus=expected_gpus(obj),
            dcgm_level=self.kit.settings.dcgm_level,
            burn_in_s=self.kit.settings.burn_in.total_seconds(),
        )
        try:
            msg = await self.kit.bus.nc.request(
                agent_subject(VALIDATE, record.node),
                ask.model_dump_json().encode(),
                timeout=self.kit.settings.request_timeout.total_seconds() + ask.burn_in_s,
            )
            report = ValidationReport.model_validate_json(msg.data)
        except ValidationError as exc:
            await self._failed_attempt(record, f"the GPU agent's report is not understood: {exc}")
            return
        except (NatsError, TimeoutError) as exc:  # no responders (still starting), timeout
            waited = time.time() - record.updated_at
            if waited > self.kit.settings.validate_timeout.total_seconds():
                await self._failed_attempt(record, f"no validation from the GPU agent: {exc}")
            return
        summary = f"{report.gpus_found} GPU(s), {len(report.checks)} check(s), DCGM {report.dcgm}"
        proposal = self._proposal(record, "validate", f"validation of {record.node}: {summary}")
        details = {
            "agent_boot_id": report.agent_boot_id,
            "dcgm": report.dcgm,
            "failures": report.failures(),
        }
        if report.passed:
            await self.kit.runner.record(
                proposal, Outcome.APPLIED, f"{record.node} validated: {summary}", details=details
            )
            await self.save(record, Step.RELEASING, f"validated ({summary})")
            self.kit.wake.set()
            return
        await self._failed_attempt(record, "; ".join(report.failures()), details=details)

    async def _failed_attempt(
        self, record: RecoveryRecord, why: str, *, details: dict[str, Any] | None = None
    ) -> None:
        """A validation failed (or the cure never came): remediate again, or escalate. The
        count and the next step are saved in one write (a restart never counts it twice)."""
        failures = record.validation_failures + 1
        proposal = self._proposal(record, "validate", f"validation of {record.node} failed: {why}")
        if record.plan == Plan.HANG:  # the ladder's next rung, not the same cure again
            await self.kit.runner.fail(proposal, details=details or {})
            await self.hung.validation_failed(record, why)
            return
        await self.kit.runner.fail(
            proposal, details={**(details or {}), "failures_so_far": failures}
        )
        nxt = after_validation_failure(
            failures, max_failures=self.kit.settings.max_validation_failures
        )
        again = nxt == AfterFailure.RETRY
        backoff = min(
            self.kit.settings.retry_backoff.total_seconds() * 2 ** (failures - 1), BACKOFF_CAP_S
        )
        record = await self.update(
            record,
            validation_failures=failures,
            last_failure=why,
            asked_at=None,
            next_try_at=time.time() + backoff,
            step=Step.REMEDIATING if again else record.step,
            history=[*record.history, f"failed: {why}"][-40:],
        )
        self.kit.marks.failpoints.hit("recovery.failed")
        if not again:
            await self.escalate(record, f"validation failed {failures} times; last: {why}")
            return
        self.kit.wake.set()

    async def _release(self, record: RecoveryRecord, obj: Obj) -> None:
        """Through the owners' release paths: the maintenance's cordon, then the quarantine
        (a hung node's out-of-service taint first)."""
        record = await self.hung.unfence(record)
        if record.fenced:
            return  # tried again on the next pass
        reason = f"validated after the {record.plan.value} of incident {record.incident}"
        replies: dict[str, str] = {}
        owners = [("checkpoint", "finish"), ("cordon", "release")]
        if record.plan == Plan.HANG:  # a hung node's: only what it holds (no false skips)
            owners = [
                o for o, holds in zip(owners, ("draining: requested" in record.history,
                                                has_quarantine(obj)), strict=True) if holds
            ]  # fmt: skip
        for service, verb in owners:
            reply = await self._ask(service, verb, record.node, reason)
            if reply is None:
                return  # tried again on the next pass
            refused = reply.status == ControlStatus.REFUSED
            if reply.status == ControlStatus.ERROR or (
                # cordon: nothing of nodeward's left to release is done; anything else (still
                # being applied, an operator rate limit) is tried again on the next pass
                service == "cordon" and refused and reply.details.get("guard") != "not_ours"
            ):
                self.kit.log.warning(
                    "recovery.release_failed", service=service, reply=reply.message
                )
                return
            replies[f"{service}.{verb}"] = _reply_line(reply)
        proposal = self._proposal(
            record, "release", f"{record.node} back in service: {reason}", resolves=True
        )
        await self.kit.runner.record(proposal, Outcome.APPLIED, details={"replies": replies})
        await self._lift_hold(record)  # first: a terminal record holds nothing on the node
        await self.save(record, Step.RELEASED, "released")

    async def _ended_elsewhere(self, record: RecoveryRecord) -> None:
        """The quarantine ended before recovery released it (an operator, or cordon once the
        GPUs read healthy): stop, taking back what recovery asked for: the reboot request,
        and the maintenance (cancelled before its drain, else finished once done)."""
        if "draining: requested" in record.history and not await self._take_back_maintenance(
            record
        ):
            return  # the drain is under way: finished on a later pass
        with contextlib.suppress(Exception):
            await self.kit.marks.release(record.node)
        proposal = self._proposal(record, "recover", f"recovery of {record.node} stopped")
        await self.kit.runner.skip(
            proposal,
            guard="quarantine_ended",
            reason=f"recovery of {record.node} stopped at {record.step.value}: its quarantine "
            "ended without it (released by an operator?)",
        )
        await self._lift_hold(record)
        await self.save(record, Step.GONE, "quarantine ended elsewhere")

    async def _take_back_maintenance(self, record: RecoveryRecord) -> bool:
        """Cancel the node's maintenance, or finish it once done; True when nothing of it is
        left to take back."""
        reason = f"the quarantine of incident {record.incident} ended without recovery"
        for verb in ("cancel", "finish"):
            reply = await self._ask("checkpoint", verb, record.node, reason)
            if reply is None or reply.status == ControlStatus.ERROR:
                return False
            guard = reply.details.get("guard")
            if reply.status == ControlStatus.OK or guard == "not_ours":
                return True
            if guard in ("draining", "not_done"):
                return False  # the drain runs on: finished when it is done
        return False

    async def _ask(self, service: str, verb: str, node: str, reason: str) -> ControlReply | None:
        """An owner's operator control, asked as `service/recovery`; None if unanswered."""
        ask = ControlRequest(service=service, verb=verb, operator=ACTOR, reason=reason, target=node)
        try:
            return await request(
                self.kit.bus.nc, ask, timeout=self.kit.settings.request_timeout.total_seconds()
            )
        except ControlTimeout as exc:
            self.kit.log.warning("recovery.control_unanswered", service=service, error=str(exc))
            return None

    async def escalate(self, record: RecoveryRecord, why: str, *, rma: bool = True) -> None:
        """On-call: critical (RMA suggested, or the drain that never emptied the node). The
        node stays quarantined under recovery's release hold: no automatic release (cordon's
        healthy period included) until an operator releases the quarantine."""
        with contextlib.suppress(Exception):
            await self.kit.marks.release(record.node)  # no reboot asked of a node left as it is
        gpus = ", ".join(map(str, record.gpus)) or "?"
        xids = ", ".join(map(str, record.xids)) or "-"
        cure = f"RMA suggested for GPU {gpus} (XID {xids})" if rma else f"GPU {gpus} (XID {xids})"
        if record.plan == Plan.HANG and not record.gpus:  # a node hung without a GPU fault
            cure = "RMA suggested for the node" if rma else "the node hung"
        proposal = Proposal(
            action="escalate",
            target=node_ref(record.node),
            reason=f"{record.node} needs a human: {why}. {cure}; the node stays quarantined "
            f"until an operator releases it ({release_command(record.node)})",
            policy=record.plan.value,
            trigger_id=f"{record.incident}/escalate",
            trigger_time=datetime.fromtimestamp(record.started_at, UTC),
            severity=Severity.CRITICAL,
            title=f"{record.node}: RMA suggested" if rma else f"{record.node}: needs a human",
            details={"incident": record.incident, "history": record.history, "rma": rma},
        )
        await self.kit.runner.record(proposal, Outcome.APPLIED)
        stored = await self.kit.records.get(node_key(record.node))
        if stored is None or stored.value.incident != record.incident:
            await self.kit.records.put(node_key(record.node), record)
        if not self.kit.settings.dry_run:
            await self._hold(record, f"needs a human: {why}")
        await self.save(record, Step.ESCALATED, f"{why}. {cure}")

    async def _hold(self, record: RecoveryRecord, why: str) -> None:
        """The hold on the node (`services.kernel.holds`): no automatic release of its
        quarantine (cordon's healthy period) once a reset or reboot was asked (only the
        validation judges it) or a human must decide. Recorded first: a restart takes back
        a hold it may have placed."""
        if not record.held:
            record = await self.update(record, held=True)
        note = hold_note(ACTOR, record.incident, why)
        try:
            await self.kit.cluster.nodes.set_annotations(record.node, {HOLD_ANNOTATION: note})
        except KubeError as exc:  # the guard is a second line; the record is the truth
            self.kit.log.warning("recovery.hold_failed", error=str(exc))

    async def _lift_hold(self, record: RecoveryRecord) -> None:
        """A recovery over (released, gone) or an escalated node whose quarantine an operator
        released: the hold comes off; nothing of recovery's is left on the node."""
        try:
            obj: Obj | None = await self.kit.cluster.nodes.get(record.node)
        except NotFound:
            obj = None
        if record.step == Step.ESCALATED:
            if obj is not None and has_quarantine(obj):
                return  # still the human's to release
            if "draining: requested" in record.history and not await self._take_back_maintenance(
                record
            ):
                return  # its maintenance's cordon first (on a later pass if still draining)
        if obj is not None and (hold_of(obj) or {}).get("incident") == record.incident:
            await self.kit.cluster.nodes.set_annotations(record.node, {HOLD_ANNOTATION: None})
        record = await self.update(record, held=False)
        await self.save(record, record.step, "hold lifted", note_only=True)

    # helpers ----------------------------------------------------------------------------
    def proposal(self, record: RecoveryRecord, action: str, reason: str) -> Proposal:
        """A proposal about this recovery's node (the hung-node ladder's acts)."""
        return self._proposal(record, action, reason)

    async def record_step(
        self, record: RecoveryRecord, action: str, reason: str, *, what: str = "", **details: Any
    ) -> None:
        """An applied step's audit (what the ladder observed or did)."""
        await self._record(record, action, reason, what=what, **details)

    async def take_back_maintenance(self, record: RecoveryRecord) -> bool:
        return await self._take_back_maintenance(record)

    async def guarded(
        self,
        record: RecoveryRecord,
        proposal: Proposal,
        act: Callable[[], Awaitable[dict[str, Any]]],
        *,
        floor: bool = False,
        fails: tuple[type[Exception], ...] = (),
        extra: Sequence[Guard] = (),
    ) -> Remediation:
        """A remediation act through the exemptions and the operators' pause (and, for one
        that takes a node further out of service, its group's floor). A refusal is audited
        once per guard, a dry run once (`waiting`); while either lasts it is only logged."""
        guards: list[Guard] = [self.kit.exemptions, self.kit.pause, *extra]
        if floor:
            guards.append(self.kit.floor)

        def held(outcome: Outcome, guard: str | None) -> str | None:
            return DRY_RUN_WAIT if outcome == Outcome.DRY_RUN else guard

        decided = await self.kit.runner.run(
            proposal, act, guards, retry=False, fails=fails,
            repeat=lambda outcome, guard: (
                record.waiting is not None and held(outcome, guard) == record.waiting
            ),
        )  # fmt: skip
        waiting = (
            held(decided.outcome, decided.guard)
            if decided.outcome in (Outcome.REFUSED, Outcome.DRY_RUN)
            else None
        )
        if waiting != record.waiting and (waiting or decided.outcome == Outcome.APPLIED):
            await self.update(record, waiting=waiting)
        return decided

    def _proposal(
        self, record: RecoveryRecord, action: str, reason: str, *, resolves: bool = False
    ) -> Proposal:
        return Proposal(
            action=action,
            target=node_ref(record.node),
            reason=reason,
            policy=record.plan.value,
            trigger_id=record.attempt_id(action),
            trigger_time=datetime.fromtimestamp(record.started_at, UTC),
            protective=False,
            resolves=resolves,
            details={"incident": record.incident, "step": record.step.value},
        )

    async def _record(
        self, record: RecoveryRecord, action: str, reason: str, *, what: str = "", **details: Any
    ) -> None:
        proposal = self._proposal(record, action, reason)
        if what:
            proposal = dataclasses.replace(proposal, trigger_id=record.attempt_id(what))
        await self.kit.runner.record(proposal, Outcome.APPLIED, details=details)

    async def update(self, record: RecoveryRecord, **changes: Any) -> RecoveryRecord:
        """Change this recovery's record (revision-checked); a new `step` is a move of the
        workflow (its bookkeeping starts afresh)."""

        def apply(current: RecoveryRecord) -> RecoveryRecord:
            return current.model_copy(update={**changes, "updated_at": time.time()})

        to = changes.pop("step", None)
        try:
            if to is not None:
                return await self.flow.advance(record, Step(to).value, apply)
            return await self.flow.save(record, apply)
        except Gone:  # another incident's record now: this one's view, as changed
            return record.model_copy(update=changes | ({"step": Step(to)} if to else {}))

    async def save(
        self, record: RecoveryRecord, step: Step, what: str, *, note_only: bool = False
    ) -> RecoveryRecord:
        def note(current: RecoveryRecord) -> RecoveryRecord:
            history = [*current.history, f"{step.value}: {what}"][-40:]
            return current.model_copy(update={"history": history, "updated_at": time.time()})

        try:
            if note_only:
                stored = await self.flow.save(record, note)
                self.kit.marks.failpoints.hit(f"recovery.{step.value}")  # as the engine's moves
            else:  # the engine's failpoint `recovery.<step>`: crash tests, after the write
                stored = await self.flow.advance(record, step.value, note)
        except Gone:
            stored = record
        self.kit.log.info("recovery.step", step=step.value, what=what)
        return stored


class _Failed(Exception):
    """A remediator's refusal, carried out of the runner's act."""


def _reply_line(reply: ControlReply) -> str:
    return f"{reply.status.value}: {reply.message}"


def _pod_ref(pod: str) -> PodRef:
    """`namespace/name` as a maintenance's scope names it."""
    namespace, _, name = pod.partition("/")
    return PodRef(namespace=namespace, name=name)
