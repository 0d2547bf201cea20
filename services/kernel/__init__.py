"""What every acting service shares: one path for every action and the guards on it.

event -> policy (should we?) -> guards (may we now?) -> act or dry-run -> remediation.v1
audit event -> notify.v1 for on-call. `ActionRunner.run` is that path; the guards are
`Exemptions`, `CircuitBreaker`, `RateLimiter` and `Cooldown`; ownership records live in
the service's KV bucket and in an annotation on the object. `NodeMarks` puts marks on a
node (taint, cordon, label, condition, annotation) and takes them off again, by owner and
crash-safe.
"""

from services.kernel.audit import Auditor
from services.kernel.breaker import BreakerSettings, BreakerState, CircuitBreaker
from services.kernel.drain import DrainResult, DrainSettings, drain
from services.kernel.exemptions import EXEMPT_LABEL, Exemptions, SkippedNamespaces, is_exempt
from services.kernel.limits import Cooldown, KeyedRateLimiter, RateLimiter, RateLimitSettings
from services.kernel.marks import MARKS_ANNOTATION, NodeMarks
from services.kernel.owner_notice import OwnerNotice, tell_owner
from services.kernel.proposal import Guard, Proposal, Verdict
from services.kernel.runner import ActionRunner

__all__ = [
    "EXEMPT_LABEL",
    "MARKS_ANNOTATION",
    "ActionRunner",
    "Auditor",
    "BreakerSettings",
    "BreakerState",
    "CircuitBreaker",
    "Cooldown",
    "DrainResult",
    "DrainSettings",
    "Exemptions",
    "Guard",
    "KeyedRateLimiter",
    "NodeMarks",
    "OwnerNotice",
    "Proposal",
    "RateLimitSettings",
    "RateLimiter",
    "SkippedNamespaces",
    "Verdict",
    "drain",
    "is_exempt",
    "tell_owner",
]
