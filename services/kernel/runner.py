"""The one path every action takes: guards, then act or dry-run, then audit and notify."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from nodeward.bus import RetryableError
from nodeward.kube import KubeError
from schemas.remediation import Outcome, Remediation
from services.kernel.audit import Auditor
from services.kernel.proposal import Guard, Proposal

Act = Callable[[], Awaitable[dict[str, Any]]]
Repeat = Callable[[Outcome, str | None], bool]


class ActionRunner:
    """Runs proposals through guards, acts (or dry-runs) and audits every outcome."""

    def __init__(self, auditor: Auditor, *, dry_run: bool = False) -> None:
        self.auditor = auditor
        self.dry_run = dry_run

    async def run(
        self,
        proposal: Proposal,
        act: Act,
        guards: Sequence[Guard] = (),
        *,
        repeat: Repeat | None = None,
    ) -> Remediation:
        """Guards in order; the first objection is audited and ends it. Then act or dry-run.

        A failed act is audited and raised as `RetryableError`, so the message is redelivered
        and the (idempotent) act tried again. A guard objection with `retry_after` is
        audited and raised the same way. `repeat(outcome, guard)` True marks an objection or
        dry run that only restates one already audited (a heartbeat): it is logged, not
        published again.
        """
        log = structlog.get_logger().bind(action=proposal.action, target=proposal.target.key())
        for guard in guards:
            verdict = await guard.check(proposal)
            if verdict is None:
                continue
            log.info("action.blocked", guard=verdict.guard, outcome=verdict.outcome.value)
            if repeat is not None and repeat(verdict.outcome, verdict.guard):
                audit = self.auditor.build(
                    proposal, verdict.outcome, verdict.reason, guard=verdict.guard
                )
            else:
                audit = await self.auditor.record(
                    proposal, verdict.outcome, verdict.reason, guard=verdict.guard
                )
            if verdict.retry_after is not None:
                raise RetryableError(verdict.reason, delay=verdict.retry_after)
            return audit
        if self.dry_run:
            log.info("action.dry_run")
            reason = f"dry run: would {proposal.action}: {proposal.reason}"
            if repeat is not None and repeat(Outcome.DRY_RUN, None):
                return self.auditor.build(proposal, Outcome.DRY_RUN, reason)
            return await self.auditor.record(proposal, Outcome.DRY_RUN, reason)
        try:
            details = await act()
        except KubeError as exc:
            log.warning("action.failed", error=str(exc))
            await self.auditor.record(
                proposal, Outcome.FAILED, f"{proposal.reason}; failed: {exc}", details={}
            )
            raise RetryableError(f"{proposal.action} failed: {exc}") from exc
        log.info("action.applied", **{k: v for k, v in details.items() if k != "event"})
        return await self.auditor.record(
            proposal, Outcome.APPLIED, proposal.reason, details=details
        )
