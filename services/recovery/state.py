"""What services.recovery keeps in KV (bucket `recovery`): one record per node in recovery
(`RECOVERIES`, key `node.<name>`), saved before each step so a restart resumes it."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from schemas.state import Bucket
from schemas.state.workflow import FlowState

BUCKET = "recovery"


class Plan(StrEnum):
    """What the fault needs before the node may serve again."""

    RESET = "reset"  # a GPU reset
    REBOOT = "reboot"  # a node reboot


class Step(StrEnum):
    """Where a node's recovery stands; each is entered after the record is saved."""

    DRAINING = "draining"  # maintenance requested; waiting for maintenance.done.<node>
    BLOCKED = "blocked"  # the drain left pods a reset or reboot would harm: evictions retried
    REMEDIATING = "remediating"  # the remediator is to be asked (reset or reboot)
    REBOOTING = "rebooting"  # asked; waiting for the node's bootID to change
    VALIDATING = "validating"  # asking the node's GPU agent to validate
    RELEASING = "releasing"  # validated; the owners' release paths are to be asked
    RELEASED = "released"  # terminal: back in service
    ESCALATED = "escalated"  # terminal: on-call told (RMA suggested); the node stays quarantined
    GONE = "gone"  # terminal: the quarantine ended some other way (an operator released it)


TERMINAL = frozenset({Step.RELEASED, Step.ESCALATED, Step.GONE})


class RecoveryRecord(BaseModel):
    """One node's recovery from one quarantine (`incident`: the cordon's)."""

    node: str
    incident: str = Field(description="the quarantine's incident (cordon's trigger event id)")
    plan: Plan
    remediator: str
    gpus: list[int] = Field(default_factory=list, description="the failed GPUs' indices")
    xids: list[int] = Field(default_factory=list)
    reason: str = ""
    step: Step = Step.DRAINING
    started_at: float
    updated_at: float
    maintenance_id: str | None = None
    drain_pods: list[str] | None = Field(
        default=None,
        description="a reset's drain scope: the pods (`namespace/name`) holding the failed "
        "GPUs; None: the whole node (a reboot, or the holders not known)",
    )
    drain_why: str = Field(default="", description="why the drain has that scope")
    boot_id: str | None = Field(default=None, description="the node's bootID when asked to reboot")
    asked_at: float | None = Field(default=None, description="when the remediator was asked")
    attempts: int = Field(default=0, description="reset/reboot requests made")
    validation_failures: int = 0
    last_failure: str | None = None
    history: list[str] = Field(default_factory=list, description="`step: what happened`")
    blocked: dict[str, str] = Field(
        default_factory=dict, description="`namespace/pod` the drain left on the node, and why"
    )
    blocked_since: float | None = Field(
        default=None, description="when the drain was found blocked"
    )
    next_evict_at: float | None = Field(default=None, description="the next eviction retry")
    next_try_at: float | None = Field(
        default=None, description="no reset or reboot before then (the back-off after a failure)"
    )
    held: bool = Field(
        default=False, description="recovery's human hold is on the node (after an escalation)"
    )
    flow: FlowState = Field(
        default_factory=FlowState, description="the workflow engine's bookkeeping of `step`"
    )

    @property
    def terminal(self) -> bool:
        return self.step in TERMINAL

    def attempt_id(self, what: str) -> str:
        """The trigger id of one step's audit within this attempt (distinct per attempt)."""
        return f"{self.incident}/{what}/{self.attempts}"

    def scope(self) -> list[str] | None:
        """The pods that must be gone before the cure: a reset's `drain_pods`; None (every
        pod on the node) for a reboot, whatever the drain's scope was."""
        return self.drain_pods if self.plan == Plan.RESET else None


class RecoveryCounts(BaseModel):
    """Recoveries started per node within the retry window (key `count.<node>`)."""

    started: list[float] = Field(default_factory=list, description="unix times, oldest first")


def node_key(node: str) -> str:
    return f"node.{node}"


def count_key(node: str) -> str:
    return f"count.{node}"


RECOVERIES: Bucket[RecoveryRecord] = Bucket(
    BUCKET, RecoveryRecord, prefix="node.", key=node_key, description="per node: its recovery"
)
COUNTS: Bucket[RecoveryCounts] = Bucket(
    BUCKET, RecoveryCounts, prefix="count.", key=count_key, description="per node: its recoveries"
)
