"""What every acting service shares: one path for every action and the guards on it.

event -> policy (should we?) -> guards (may we now?) -> act or dry-run -> remediation.v1
audit event -> notify.v1 for on-call. `ActionRunner.run` is that path. The guards form one
`GuardChain` in the kernel's order, whatever order a service lists them in: exemptions
(`Exemptions`, `SkippedNamespaces`), `Staleness`, `Dedup`, `Cooldown`, rate limits
(`RateLimiter`, `KeyedRateLimiter`), the `CircuitBreaker`, `Ownership`; dry-run is the
runner's last step. Decisions that are not acts are audited through the runner too
(`ActionRunner.skip`, `.fail`, `.record`, `.screen`): services never call the `Auditor`.
`NodeMarks` puts marks on a node (taint, cordon, label, condition, annotation) and takes
them off again, by owner and crash-safe. `drain` evicts (budgets honoured, evidence kept) and
`blockers` says what a reset or reboot would still harm (both within a scope of pods,
`in_scope`, where one is given); `ReleaseHold` keeps a node another
service drives, or handed to a human, from being released automatically. The auditor's
`Tally` counts restatements (noisy skips) per window instead of auditing each. `acting` builds
what a service acts with (its runner and auditor, exemptions, operator controls' guards;
`acting_for` and `acting_controlled` for a declared service, `breaker_for` its breaker), and
a service's severity table is composed from the presets in `severities`. `Workflow` is the
durable step engine (named steps over a KV record, revision-checked, resumable after a crash,
per-step deadlines and retries, cancel) maintenance and recovery run on; `Driver` runs each
unfinished workflow as a task. `TtlCache` keeps answers read from the API a while.
"""

from schemas.state.breaker import BreakerState
from schemas.state.workflow import FlowState
from services.kernel.acting import (
    Acting,
    ActingSettings,
    acting,
    acting_controlled,
    acting_for,
)
from services.kernel.audit import Auditor
from services.kernel.breaker import BreakerSettings, CircuitBreaker, breaker_for
from services.kernel.cache import TtlCache
from services.kernel.drain import DrainResult, DrainSettings, blockers, drain, in_scope
from services.kernel.exemptions import EXEMPT_LABEL, Exemptions, SkippedNamespaces, is_exempt
from services.kernel.guards import Dedup, DedupWindow, GuardChain, Ownership, Staleness
from services.kernel.holds import HOLD_ANNOTATION, Flapping, ReleaseHold, hold_note, hold_of
from services.kernel.limits import Cooldown, KeyedRateLimiter, RateLimiter, RateLimitSettings
from services.kernel.marks import MARKS_ANNOTATION, NodeMarks
from services.kernel.owner_notice import OwnerNotice, tell_owner
from services.kernel.proposal import Guard, Proposal, Stage, Verdict, node_ref
from services.kernel.runner import ActionRunner
from services.kernel.severities import Severities, Table, per_action, table
from services.kernel.tally import Tally, TallySettings
from services.kernel.workflow import (
    Cancelled,
    Driver,
    Gone,
    Retry,
    Step,
    Stepped,
    Workflow,
)

__all__ = [
    "EXEMPT_LABEL",
    "HOLD_ANNOTATION",
    "MARKS_ANNOTATION",
    "Acting",
    "ActingSettings",
    "ActionRunner",
    "Auditor",
    "BreakerSettings",
    "BreakerState",
    "Cancelled",
    "CircuitBreaker",
    "Cooldown",
    "Dedup",
    "DedupWindow",
    "DrainResult",
    "DrainSettings",
    "Driver",
    "Exemptions",
    "Flapping",
    "FlowState",
    "Gone",
    "Guard",
    "GuardChain",
    "KeyedRateLimiter",
    "NodeMarks",
    "OwnerNotice",
    "Ownership",
    "Proposal",
    "RateLimitSettings",
    "RateLimiter",
    "ReleaseHold",
    "Retry",
    "Severities",
    "SkippedNamespaces",
    "Stage",
    "Staleness",
    "Step",
    "Stepped",
    "Table",
    "Tally",
    "TallySettings",
    "TtlCache",
    "Verdict",
    "Workflow",
    "acting",
    "acting_controlled",
    "acting_for",
    "blockers",
    "breaker_for",
    "drain",
    "hold_note",
    "hold_of",
    "in_scope",
    "is_exempt",
    "node_ref",
    "per_action",
    "table",
    "tell_owner",
]
