"""Every event type survives the wire with every nullable field null.

The wire leaves null fields out (`schemas.cloudevents.encode`, `exclude_none`), so a field
that may be null must also be allowed to be absent: an energy interval without readings
(`energy_j: null`) was published without `energy_j` and no consumer could decode it.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from schemas.cloudevents import decode, encode
from schemas.registry import REGISTRY, example_event


def _nullable(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (directly, in a list, a dict or a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def _all_models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo.extend(_models(field.annotation))
    return seen


def _nulled(value: Any, model: type[BaseModel]) -> Any:
    """`value` (a model's dump) with every nullable field of it, and of what it holds, null."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if _nullable(field.annotation):
            out[key] = None
            continue
        inner = _models(field.annotation)
        if inner and key in out:
            item = out[key]
            if isinstance(item, list):
                out[key] = [_nulled(i, inner[0]) for i in item]
            elif isinstance(item, dict) and get_origin(field.annotation) is dict:
                out[key] = {k: _nulled(v, inner[0]) for k, v in item.items()}
            else:
                out[key] = _nulled(item, inner[0])
    return out


@pytest.mark.parametrize("type_name", sorted(REGISTRY))
def test_every_nullable_field_may_be_absent(type_name: str) -> None:
    """What the wire leaves out, the decoder must take as null."""
    required_nullable = [
        f"{model.__name__}.{name}"
        for model in _all_models(REGISTRY[type_name].model)
        for name, field in model.model_fields.items()
        if field.is_required() and _nullable(field.annotation)
    ]
    assert required_nullable == [], f"nullable but required: {required_nullable}"


@pytest.mark.parametrize("type_name", sorted(REGISTRY))
def test_the_example_with_every_nullable_field_null_round_trips(type_name: str) -> None:
    event = example_event(type_name)
    model = type(event.data)
    nulled = _nulled(event.data.model_dump(mode="json", by_alias=True), model)
    try:
        data = model.model_validate(nulled)
    except ValueError:
        pytest.skip("the type's own validation needs some of these fields together")
    event = event.model_copy(update={"data": data})
    wire = encode(event)
    back = decode(wire.subject, wire.headers, wire.body)
    assert back.data == data
