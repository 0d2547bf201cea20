"""Operator controls through the kernel: a request becomes a `Proposal`, its decision a reply.

A service's control handler (served by `nodeward.bus.control`) proposes what the operator
asks (`operator_proposal`: the operator's name and reason in the audit record's details and
reason, the request as its trigger), runs it through its `ActionRunner` with the guards
that apply (exemptions, `operator_limit`, the breaker only for what removes a node from
service; dry-run as always), and answers with `reply_for` the decision the runner audited.
What the service refuses itself (nothing of nodeward's to undo) is audited too, through
`refuse`: every control leaves one audit record on `remediation.>` and its notice.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nodeward.config import Section
from schemas.common import ObjectRef, dns_subdomain
from schemas.control import ControlReply, ControlRequest
from schemas.notify import Severity
from schemas.remediation import Outcome, Remediation
from services.kernel.limits import KeyedRateLimiter, RateLimitSettings
from services.kernel.proposal import Proposal
from services.kernel.runner import ActionRunner

OPERATOR = "operator"
"""The details key naming the operator of a control's proposal."""


class ControlSettings(Section):
    """`controls` of a service that serves operator controls."""

    rate_limit: RateLimitSettings = Field(
        default_factory=lambda: RateLimitSettings(per_minute=30, burst=10),
        description="per operator: a script in a loop cannot undo the fleet",
    )


def named_node(request: ControlRequest) -> str | ControlReply:
    """The node a control names (its `target`), or the error reply when that is no node
    name."""
    node = request.target or ""
    try:
        dns_subdomain(node)
    except ValueError as exc:
        return ControlReply.error(f"{request.verb}: {exc}")
    return node


def operator_limit(settings: RateLimitSettings) -> KeyedRateLimiter:
    """A guard: a token bucket per operator, for every operator's proposal (undos too)."""
    return KeyedRateLimiter(
        "operator_rate_limit",
        settings,
        key=lambda p: p.details.get(OPERATOR),
        what="operator",
        applies=lambda p: OPERATOR in p.details,
    )


def operator_proposal(
    request: ControlRequest,
    *,
    action: str,
    target: ObjectRef,
    what: str,
    obj: dict[str, Any] | None = None,
    policy: str | None = None,
    protective: bool = False,
    details: dict[str, Any] | None = None,
    severity: Severity = Severity.INFO,
    resolves: bool = False,
) -> Proposal:
    """`what` (e.g. "release of gpu-h100-01 from quarantine X"), asked by the operator.
    On-call hears of it at `severity` (info: an operator's own act pages nobody);
    `resolves`: it ends an incident, whose alerts then resolve."""
    why = f": {request.reason}" if request.reason else ""
    return Proposal(
        action=action,
        target=target,
        reason=f"{what}, asked by operator {request.operator}{why}",
        policy=policy,
        trigger_id=request.id,
        trigger_time=request.time,
        protective=protective,
        obj=obj,
        severity=severity,
        resolves=resolves,
        details={
            "by": OPERATOR,
            OPERATOR: request.operator,
            "operator_reason": request.reason,
            "request_id": request.id,
            **(details or {}),
        },
    )


def reply_for(decided: Remediation, done: str | None = None) -> ControlReply:
    """The operator's answer to the decision the runner audited: `done` (or the audit's
    reason) when applied, the guard's reason when refused or skipped."""
    extra: dict[str, Any] = {"outcome": decided.outcome.value, "action": decided.action}
    if decided.guard:
        extra["guard"] = decided.guard
    if decided.outcome == Outcome.APPLIED:
        return ControlReply.ok(done or decided.reason, **{**decided.details, **extra})
    if decided.outcome == Outcome.DRY_RUN:
        return ControlReply.ok(decided.reason, **extra)
    if decided.outcome in (Outcome.REFUSED, Outcome.SKIPPED):
        return ControlReply.refused(decided.reason, **extra)
    return ControlReply.error(decided.reason, **extra)


async def refuse(
    runner: ActionRunner, proposal: Proposal, *, guard: str, reason: str
) -> ControlReply:
    """Audit that the service will not do what the operator asked (`guard`, e.g.
    `not_ours`), and answer it in one line."""
    return reply_for(await runner.skip(proposal, guard=guard, reason=reason))
