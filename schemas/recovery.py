"""What services.recovery asks a node's GPU agent over core NATS request/reply, and the
answers: a GPU reset (`agent.gpu.reset.<node>`) and a validation before release
(`agent.gpu.validate.<node>`). Not stored: what recovery did with them is audited on
`remediation.>`."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from schemas.tokens import subject

AGENT_PREFIX = "agent.gpu"
RESET = "reset"
VALIDATE = "validate"


def agent_subject(verb: str, node: str) -> str:
    """`agent.gpu.<verb>.<node>`: only `node`'s agent subscribes to it."""
    return subject(f"{AGENT_PREFIX}.{verb}", node)


class ResetRequest(BaseModel):
    """Reset these GPUs of the node (`nvidia-smi -r -i <bus id>` on a real node)."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1)
    gpus: list[int] = Field(min_length=1, description="GPU indices")
    request_id: str = Field(min_length=1)


class ResetReply(BaseModel):
    ok: bool
    node: str
    reset: list[int] = Field(default_factory=list, description="the GPUs reset")
    error: str | None = None


class ValidateRequest(BaseModel):
    """Check the node's GPUs before it goes back into service."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1)
    request_id: str = Field(min_length=1)
    expected_gpus: int | None = Field(
        default=None, ge=0, description="GPUs the node must show (its nvidia.com/gpu capacity)"
    )
    dcgm_level: int = Field(default=1, ge=1, le=4, description="`dcgmi diag -r LEVEL`")
    burn_in_s: float = Field(default=0.0, ge=0, le=600, description="0: no burn-in")


class CheckStatus(StrEnum):
    PASS = "pass"  # noqa: S105 - a check status, not a password
    FAIL = "fail"
    SKIP = "skip"  # not run: the tool is absent, or not asked for


class ValidationCheck(BaseModel):
    """One check of one GPU (`gpu` None: of the node)."""

    name: str
    status: CheckStatus
    gpu: int | None = None
    bus_id: str | None = Field(
        default=None, description="the GPU's PCI bus id, where known (agents before it: none)"
    )
    detail: str = ""

    @property
    def where(self) -> str:
        """`GPU 3 (00000000:1B:00.0)`, `GPU 3` without a bus id; empty for the node's."""
        if self.gpu is None:
            return ""
        return f"GPU {self.gpu}" + (f" ({self.bus_id})" if self.bus_id else "")


class ValidationReport(BaseModel):
    """The agent's answer: every check it ran, and whether the node may go back."""

    node: str
    request_id: str
    agent_boot_id: str
    gpus_found: int
    checks: list[ValidationCheck] = Field(default_factory=list)
    dcgm: str = Field(default="absent", description="`absent`, `pass`, `fail`, `error`")

    @property
    def passed(self) -> bool:
        return all(c.status != CheckStatus.FAIL for c in self.checks)

    def failures(self) -> list[str]:
        """One phrase per failed check, naming its GPU (and bus id) first, e.g. `GPU 3
        (00000000:1B:00.0) no failing XID: XID 79 (reboot_node: GPU has fallen off the bus)
        since the reset`."""
        return [
            (f"{c.where} " if c.where else "") + f"{c.name}: {c.detail}".rstrip(": ")
            for c in self.checks
            if c.status == CheckStatus.FAIL
        ]
