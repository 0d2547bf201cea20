"""Who may speak to users: a notice on a subject node credentials can publish is for on-call.

A node's agents may publish `notify.*.power-limit` (the energy agent's power-cap notices,
`agents/energy/caps.py`; its grant is in `agents/energy/access.py`). Two checks keep a node's
credentials from speaking to users as nodeward:

- the consumer binds `severity` and `topic` to the subject's `<severity>` and `<topic>`
  tokens (`ConsumerSpec.bind`), so a notice's topic is the one its subject, and so its
  publisher's rights, says: a `topic: security` notice on `notify.warning.power-limit` is
  an identity mismatch, refused by the runtime before the handler;
- the subject does not say which node published, so every notice on a subject node users
  may publish may address only on-call (`refusal`); a user's notice there is refused,
  audited as a security event and dead-lettered (`identity_mismatch`).

The subjects are the contract's node topics (`schemas.notify.NODE_TOPICS`): a service does
not see the agents' declarations, and tests/unit/test_notify_speakers.py holds the node
agents' declared grants to exactly these, so a topic granted to nodes later is covered.
"""

from __future__ import annotations

from schemas.notify import NODE_TOPICS
from schemas.streams import subject_matches
from services.notifier.routing import Audience

# The notify subjects any node's credentials may publish on (`notify.*.power-limit`).
NODE_SUBJECTS: tuple[str, ...] = tuple(f"notify.*.{topic}" for topic in NODE_TOPICS)


def node_subject(subject: str) -> str | None:
    """The node grant `subject` falls under, if node credentials may publish on it."""
    return next((p for p in NODE_SUBJECTS if subject_matches(p, subject)), None)


def refusal(subject: str, audience: Audience) -> str | None:
    """Why a notice on `subject` may not address `audience`; None if it may."""
    if audience.kind == "oncall":
        return None
    grant = node_subject(subject)
    if grant is None:
        return None
    return (
        f"notice to {audience} on {subject}: node credentials may publish there ({grant}),"
        " so its notices may address only on-call"
    )
