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
    HANG = "hang"  # a node that does not answer: its group's escalation ladder (`hang`)


class Power(StrEnum):
    """Where a ladder's rung stands (`hang.RungAction`); each is saved before it is acted on."""

    ASKED = "asked"  # reboot: the request made; waiting for the new boot
    OFF_ASKED = "off-asked"  # the BMC asked to power off; waiting for its chassis status
    OFF = "off"  # the BMC says off: the node may be fenced
    FENCED = "fenced"  # the out-of-service taint on: its pods move; then powered on
    ON_ASKED = "on-asked"  # the BMC asked to power on; waiting for the new boot, Ready


class Step(StrEnum):
    """Where a node's recovery stands; each is entered after the record is saved."""

    DRAINING = "draining"  # maintenance requested; waiting for maintenance.done.<node>
    BLOCKED = "blocked"  # the drain left pods a reset or reboot would harm: evictions retried
    REMEDIATING = "remediating"  # the remediator is to be asked (reset or reboot)
    REBOOTING = "rebooting"  # asked; waiting for the node's bootID to change
    VALIDATING = "validating"  # asking the node's GPU agent to validate
    HUNG = "hung"  # a hung node: its ladder's rungs, one after another (`rung`, `power`)
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
    ladder: str | None = Field(default=None, description="a hung node's group's ladder")
    rung: int = Field(default=0, ge=0, description="the ladder's step under way")
    rung_started_at: float | None = None
    power: Power | None = Field(default=None, description="where the rung stands")
    power_sent: bool = Field(default=False, description="the BMC command of `power` was sent")
    fenced: bool = Field(
        default=False, description="nodeward's out-of-service taint is (to be) on the node"
    )
    fenced_at: float | None = None
    waiting: str | None = Field(
        default=None, description="the guard refusing the rung's act (audited once)"
    )
    causes: list[str] = Field(default_factory=list, description="why the node was found hung")
    flow: FlowState = Field(
        default_factory=FlowState, description="the workflow engine's bookkeeping of `step`"
    )

    @property
    def terminal(self) -> bool:
        return self.step in TERMINAL

    def attempt_id(self, what: str) -> str:
        """The trigger id of one step's audit within this attempt (distinct per attempt, and
        for a hung node's ladder per rung: a soft and a hard power off are two records)."""
        if self.plan == Plan.HANG:
            return f"{self.incident}/{what}/{self.attempts}.{self.rung}"
        return f"{self.incident}/{what}/{self.attempts}"

    def scope(self) -> list[str] | None:
        """The pods that must be gone before the cure: a reset's `drain_pods`; None (every
        pod on the node) for a reboot, whatever the drain's scope was."""
        return self.drain_pods if self.plan == Plan.RESET else None


class PauseRecord(BaseModel):
    """The operators' pause (key `pause`): no new remediation while it is there."""

    by: str
    reason: str
    at: float


PAUSE_KEY = "pause"


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
PAUSE: Bucket[PauseRecord] = Bucket.one(
    BUCKET, PauseRecord, PAUSE_KEY, description="the operators' pause of new remediation"
)
