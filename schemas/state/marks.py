"""What NodeMarks remembers: per owner and node, the marks it put on and the prior state.

The same `MarkEntry` is written to the node (annotation `nodeward.io/marks`, a JSON object
keyed by owner) in the very PATCH that adds the marks, and into the owner's KV bucket
(key `marks.<node>`, a `MarkIntent`) as the write-ahead intent before that PATCH.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from schemas.state import Bucket

MarkPhase = Literal["applying", "applied", "releasing", "released"]


class ConditionSpec(BaseModel):
    """A node condition to set (status subresource)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


class EventSpec(BaseModel):
    """A Kubernetes Event about the node."""

    reason: str
    action: str
    note: str = ""
    type: Literal["Normal", "Warning"] = "Normal"


class MarkSpec(BaseModel):
    """What an owner wants on a node while it holds it, and what to leave when it lets go."""

    taints: list[str] = Field(default_factory=list, description="`key:effect`")
    cordon: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    release_labels: dict[str, str | None] | None = Field(
        default=None, description="labels set on release; None: restore the prior values"
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="owner's own annotations, removed on release"
    )
    condition: ConditionSpec | None = None
    release_condition: ConditionSpec | None = None
    event: EventSpec | None = None
    release_event: EventSpec | None = None


class MarkEntry(BaseModel):
    """What one owner did to a node, decided from the node before any change."""

    incident: str
    taints: list[str] = Field(default_factory=list, description="`key:effect` this owner added")
    cordon: bool = Field(default=False, description="this owner holds a cordon on the node")
    prior_unschedulable: bool = Field(
        default=False,
        description="the node was unschedulable before nodeward (any owner) cordoned it",
    )
    labels: dict[str, str | None] = Field(
        default_factory=dict, description="prior value (None: absent) of each label set"
    )
    annotations: list[str] = Field(default_factory=list, description="annotation keys set")


class MarkIntent(BaseModel):
    """The owner's write-ahead record (KV `marks.<node>` in the owner's bucket)."""

    owner: str
    node: str
    incident: str
    phase: MarkPhase
    spec: MarkSpec
    entry: MarkEntry
    operator_released: bool = Field(
        default=False, description="an operator took the node back; the owner respected it"
    )
    event_recorded: bool = False
    updated_at: float = 0.0
    started_at: datetime | None = Field(
        default=None,
        description="when the incident's trigger happened: a finish after a restart audits "
        "under the same id whichever event finishes it",
    )


def marks_key(node: str) -> str:
    return f"marks.{node}"


def intents(bucket: str) -> Bucket[MarkIntent]:
    """The owner's intents, key `marks.<node>`, in the owner's own bucket."""
    return Bucket(
        bucket,
        MarkIntent,
        prefix="marks.",
        key=marks_key,
        description="owner intents, marks.<node>",
    )


FALCO_MARKS = intents("falco-marks")
"""The Falco cordon's intents: a bucket of their own (the `falco` bucket's keys expire)."""
