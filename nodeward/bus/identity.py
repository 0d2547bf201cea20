"""Identity binds to the subject: what an event says about whom must match where it was
published.

NATS authorization lets a node's agent publish only on its own subjects
(`gpu.health.<its node>.>`), but the payload is the publisher's word. A consumer declares
which data fields must equal which subject tokens (`ConsumerSpec.identity`); the runtime
checks it before the handler runs, so node 01's credentials cannot speak about node 02.
Types with `<node>`, `<ns>` or `<pod>` in their subject pattern are bound by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import lookup
from schemas.base import Event, EventData
from schemas.tokens import token

# Subject pattern placeholders of the identity a publisher's credentials are scoped to.
_PLACEHOLDERS = {"node": "node", "namespace": "ns", "pod": "pod"}


@dataclass(frozen=True)
class Binding:
    """Events of `type` must carry `data.<field>` equal to subject token `index` (0-based),
    for every (field, index) in `fields`; empty `fields` means not checked."""

    type: str
    fields: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Mismatch:
    field: str
    claimed: str
    index: int
    token: str

    def __str__(self) -> str:
        return (
            f"data.{self.field} {self.claimed!r} does not match subject token {self.index}"
            f" {self.token!r}"
        )


def bind(model: type[EventData], *fields: str) -> Binding:
    """A binding of `fields` to the tokens `model.SUBJECT_PATTERN` names for them
    (`node` -> `<node>`, `namespace` -> `<ns>`, `pod` -> `<pod>`, others `<field>`)."""
    pattern = model.SUBJECT_PATTERN.split(".")
    pairs = []
    for name in fields:
        if name not in model.model_fields:
            raise ValueError(f"{model.TYPE} has no field {name!r}")
        placeholder = f"<{_PLACEHOLDERS.get(name, name)}>"
        if placeholder not in pattern:
            raise ValueError(f"{model.TYPE}'s subject {model.SUBJECT_PATTERN} has no {placeholder}")
        pairs.append((name, pattern.index(placeholder)))
    return Binding(model.TYPE, tuple(pairs))


def default_binding(type_name: str) -> Binding:
    """The node, namespace and pod fields of `type_name` its subject pattern carries."""
    try:
        model = lookup(type_name).model
    except KeyError:
        return Binding(type_name, ())
    pattern = model.SUBJECT_PATTERN.split(".")
    fields = [
        f for f, p in _PLACEHOLDERS.items() if f"<{p}>" in pattern and f in model.model_fields
    ]
    return bind(model, *fields)


def mismatches(binding: Binding, subject: str, event: Event[EventData]) -> list[Mismatch]:
    """Every bound field whose value (as a subject token) is not the subject's token."""
    tokens = subject.split(".")
    out = []
    for name, index in binding.fields:
        claimed = str(getattr(event.data, name))
        actual = tokens[index] if index < len(tokens) else ""
        if token(claimed) != actual:
            out.append(Mismatch(name, claimed, index, actual))
    return out
