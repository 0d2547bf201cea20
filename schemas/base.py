"""The envelope every event shares, and the base of every event's data model.

An event is a CloudEvent: envelope attributes (`id`, `time`, `source`, `type`, `subject`)
plus `data`, one of the typed models in this package. On the wire the attributes travel
as `ce-*` headers and `data` is the JSON body (see `cloudevents.py`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from schemas.ids import new_id


def utcnow() -> datetime:
    return datetime.now(UTC)


class Model(BaseModel):
    """Base for nested value objects: unknown fields are ignored (additive evolution)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _strict_extra(cls, value: Any, info: ValidationInfo) -> Any:
        """With context `{"forbid_extra": True}` unknown fields are an error (used at input edges).

        Checked on every model, nested ones included, so a typo anywhere is reported.
        """
        if info.context and info.context.get("forbid_extra") and isinstance(value, dict):
            known = set(cls.model_fields) | {
                f.alias for f in cls.model_fields.values() if f.alias is not None
            }
            unknown = sorted(str(k) for k in value if k not in known)
            if unknown:
                name = getattr(cls, "TYPE", cls.__name__)
                raise ValueError(f"unknown field(s) for {name}: {', '.join(unknown)}")
        return value


class EventData(Model):
    """Base of every event type's data.

    Subclasses set `TYPE` (`domain.kind.vN`), `STREAM`, `SOURCE_KIND` and implement
    `nats_subject()` (where it is published) and `about()` (the CloudEvents subject).
    Within a version fields are only ever added; a breaking change is a new `.vN` type.
    """

    TYPE: ClassVar[str]
    STREAM: ClassVar[str]
    SUBJECT_PATTERN: ClassVar[str]
    EXAMPLE_SOURCE: ClassVar[str]
    OBSERVED: ClassVar[tuple[str, ...]] = ()
    """Fields holding when the publisher observed what it says (its clock's "now"): with
    the event's `time`, what a consumer holds against when the bus stored it."""

    def nats_subject(self) -> str:
        raise NotImplementedError

    def about(self) -> str:
        raise NotImplementedError

    def concern(self) -> str:
        """How much a person should care about this event: info, warning or critical
        (what `nodeward tail --min-severity` filters on); info unless a type says more."""
        return "info"

    @classmethod
    def example(cls) -> Self:
        examples = (cls.model_config.get("json_schema_extra") or {}).get("examples")  # type: ignore[union-attr]
        return cls.model_validate(examples[0])  # type: ignore[index]


D = TypeVar("D", bound=EventData)


class Event(BaseModel, Generic[D]):
    """A CloudEvents 1.0 event carrying one typed data model."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=new_id, min_length=1, max_length=128)
    time: AwareDatetime = Field(default_factory=utcnow)
    source: str = Field(min_length=1, max_length=512)
    type: str
    subject: str = Field(min_length=1, max_length=512)
    datacontenttype: Literal["application/json"] = "application/json"
    data: D

    @field_validator("time")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @model_validator(mode="after")
    def _type_matches_data(self) -> Self:
        expected = type(self.data).TYPE
        if self.type != expected:
            raise ValueError(f"type {self.type!r} does not match data model {expected!r}")
        return self

    @property
    def nats_subject(self) -> str:
        return self.data.nats_subject()


def make_event(
    data: D,
    *,
    source: str,
    id: str | None = None,
    time: datetime | None = None,
) -> Event[D]:
    """Wrap typed data in an envelope; `subject` comes from the data, `id` and `time` are fresh."""
    model: type[Event[D]] = Event[type(data)]  # type: ignore[misc,assignment]
    return model(
        id=id or new_id(),
        time=time or utcnow(),
        source=source,
        type=data.TYPE,
        subject=data.about(),
        data=data,
    )
