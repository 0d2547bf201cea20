"""`notify`: on-call hears through the decision's audit notice; the pod's owner gets their own."""

from __future__ import annotations

from typing import Any

from schemas.ids import stable_id
from schemas.remediation import Outcome
from schemas.tokens import falco_rule_token
from services.falco.actions.base import ActionContext, Actionner
from services.falco.alerts import severity_of
from services.falco.rules import ActionKind
from services.falco.settings import ACTOR
from services.kernel import OwnerNotice, tell_owner


async def run(ctx: ActionContext) -> dict[str, Any]:
    alert, target = ctx.alert, ctx.target
    if target.pod is None or not ctx.spec.params.get("owner", True):
        return {"owner_notified": False}
    namespace, name, _ = ctx.pod()
    done = [
        ctx.done_words[a]
        for a, r in ctx.earlier
        if r.outcome == Outcome.APPLIED and a in ctx.done_words
    ]
    contact = ctx.settings.support_contact
    can_do = [
        f"If this was you, tell {contact} what you were doing: most alerts are explained "
        "in minutes.",
        f"If it was not you, tell {contact} at once: your session or credentials may be "
        "compromised.",
    ]
    if any(a == ActionKind.ISOLATE and r.outcome == Outcome.APPLIED for a, r in ctx.earlier):
        can_do.append(
            f"The network isolation stays until {contact} lifts it; save your work inside "
            "the pod meanwhile."
        )
    body = (
        f"Falco, the platform's runtime security monitor, reported '{alert.rule}' "
        f"({alert.priority.value}) in your pod {namespace}/{name} at "
        f"{alert.time.isoformat()}. " + " ".join(done)
    ).strip()
    notice = OwnerNotice(
        severity=severity_of(alert.priority),
        title=f"Security alert on your pod {name}",
        body=body,
        why=f"Falco's rule '{alert.rule}' matched: {alert.message()}"[:1000],
        steps=can_do,
    )
    event = ctx.event
    note = await tell_owner(
        ctx.bus,
        notice,
        actor=ACTOR,
        topic=ctx.settings.topic,
        namespace=namespace,
        name=name,
        targets=[target.ref],
        notice_id=stable_id(event.time, event.id, ACTOR, "notify-owner", target.ref.key()),
        dedup_key=f"falco/{namespace}/{name}/{falco_rule_token(alert.rule)}",
    )
    return {"owner_notified": True, "audience": note.audience}


ACTION = Actionner(
    ActionKind.NOTIFY,
    "tell on-call (the decision's audit notice) and the pod's owner what happened and what to do",
    "none",
    run,
)
