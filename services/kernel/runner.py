"""The one path every decision takes: the guard chain, then act or dry-run, then audit and
notify. Decisions that are not acts (a skip, a failure the service found) are audited
through the runner too: services never call the auditor."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import structlog

from nodeward.bus import RetryableError
from nodeward.kube import KubeError
from schemas.remediation import Outcome, Remediation
from services.kernel.audit import Auditor, decision_log
from services.kernel.guards import GuardChain
from services.kernel.proposal import Guard, Proposal, Verdict

Act = Callable[[], Awaitable[dict[str, Any]]]
Repeat = Callable[[Outcome, str | None], bool | Awaitable[bool]]
"""`repeat(outcome, guard)` True: the decision restates one already audited (logged only)."""


class ActionRunner:
    """Runs proposals through the guard chain, acts (or dry-runs) and audits every outcome."""

    def __init__(self, auditor: Auditor, *, dry_run: bool = False) -> None:
        self.auditor = auditor
        self.dry_run = dry_run

    def with_dry_run(self, dry_run: bool = True) -> ActionRunner:
        """The same runner (same auditor), dry-running or not."""
        return self if dry_run == self.dry_run else ActionRunner(self.auditor, dry_run=dry_run)

    async def run(
        self,
        proposal: Proposal,
        act: Act,
        guards: Iterable[Guard] = (),
        *,
        repeat: Repeat | None = None,
        retry: bool = True,
        resumed: bool = False,
        fails: tuple[type[Exception], ...] = (),
    ) -> Remediation:
        """The guard chain (in the kernel's order, whatever order `guards` are given in);
        the first objection is audited and ends it. Then act or dry-run.

        A failed act is audited and raised as `RetryableError`, so the message is redelivered
        and the (idempotent) act tried again; with `retry=False` the failure's audit record
        is returned instead. `fails`: what else an act raises when it failed (beside
        `KubeError`), handled the same way. A guard objection with `retry_after` is audited and raised the
        same way. `repeat(outcome, guard)` True marks an objection or dry run that only
        restates one already audited (a heartbeat): it is logged, not published again.
        `resumed`: the act finishes one a restart cut short; its `applied` audit is not
        published again if it was stored before the restart (`Auditor.record(once=...)`).
        """
        log = structlog.get_logger().bind(action=proposal.action, target=proposal.target.key())
        objection = await self.screen(proposal, guards, repeat=repeat)
        if objection is not None:
            return objection
        if self.dry_run:
            log.info("action.dry_run")
            reason = f"dry run: would {proposal.action}: {proposal.reason}"
            quiet = await _restates(repeat, Outcome.DRY_RUN, None)
            return await self.auditor.record(proposal, Outcome.DRY_RUN, reason, publish=not quiet)
        # A restatement the tally counts is not acted on again (its first of the window was).
        if await self.auditor.tallied(proposal, Outcome.APPLIED, proposal.reason):
            log.debug("action.counted")
            return self.auditor.build(proposal, Outcome.APPLIED, proposal.reason, None, None)
        failures: tuple[type[Exception], ...] = (KubeError, *fails)
        try:
            details = await act()
        except failures as exc:
            log.warning("action.failed", error=str(exc))
            self.auditor.tally.reopen(proposal, Outcome.APPLIED, None)
            failed = await self.auditor.record(
                proposal, Outcome.FAILED, f"{proposal.reason}; failed: {exc}", details={}
            )
            if not retry:
                return failed
            raise RetryableError(f"{proposal.action} failed: {exc}") from exc
        log.info("action.applied", **{k: v for k, v in details.items() if k != "event"})
        return await self.auditor.record(
            proposal,
            Outcome.APPLIED,
            proposal.reason,
            details=details,
            admitted=True,
            once=resumed,
        )

    async def screen(
        self, proposal: Proposal, guards: Iterable[Guard], *, repeat: Repeat | None = None
    ) -> Remediation | None:
        """The guard chain alone: the first objection audited (None when every guard allows).

        For a decision taken before there is anything to act on (a stale trigger is not
        even looked at). An objection with `retry_after` is raised as `RetryableError`
        after its audit.
        """
        verdict = await GuardChain.of(guards).check(proposal)
        if verdict is None:
            return None
        decision_log(proposal, verdict.outcome, verdict.guard).info("action.blocked")
        audit = await self._objection(proposal, verdict, repeat)
        if verdict.retry_after is not None:
            raise RetryableError(verdict.reason, delay=verdict.retry_after)
        return audit

    async def skip(
        self,
        proposal: Proposal,
        *,
        guard: str,
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
        repeat: bool = False,
    ) -> Remediation:
        """Audit that the service skipped `proposal` for a reason of its own (`guard`:
        `no_controller`, `already_quarantined`, ...). `repeat`: already audited, log only."""
        return await self.record(
            proposal, Outcome.SKIPPED, reason, guard=guard, details=details, publish=not repeat
        )

    async def fail(
        self,
        proposal: Proposal,
        *,
        reason: str | None = None,
        guard: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> Remediation:
        """Audit that `proposal` failed in a way the service found itself (the owner must
        act, a dependency is down): on-call is told as for a failed act."""
        return await self.record(proposal, Outcome.FAILED, reason, guard=guard, details=details)

    async def record(
        self,
        proposal: Proposal,
        outcome: Outcome,
        reason: str | None = None,
        *,
        guard: str | None = None,
        details: Mapping[str, Any] | None = None,
        publish: bool = True,
        once: bool = False,
    ) -> Remediation:
        """Audit a decision the service took without an act of the runner's: a withdrawn
        warning (its effect is the service's own state), or the audit of an act done before
        a restart, re-published under the same id (`once`: not if it is stored already).
        `reason` defaults to the proposal's. `publish=False` builds the record without
        publishing it (it restates one audited)."""
        decision_log(proposal, outcome, guard).info("action.recorded")
        return await self.auditor.record(
            proposal,
            outcome,
            proposal.reason if reason is None else reason,
            guard=guard,
            details=details,
            publish=publish,
            once=once,
        )

    async def _objection(
        self, proposal: Proposal, verdict: Verdict, repeat: Repeat | None
    ) -> Remediation:
        quiet = verdict.quiet or await _restates(repeat, verdict.outcome, verdict.guard)
        return await self.auditor.record(
            proposal,
            verdict.outcome,
            verdict.reason,
            guard=verdict.guard,
            details=verdict.details or None,
            publish=not quiet,
        )


async def _restates(repeat: Repeat | None, outcome: Outcome, guard: str | None) -> bool:
    if repeat is None:
        return False
    answer = repeat(outcome, guard)
    if inspect.isawaitable(answer):
        return bool(await answer)
    return bool(answer)
