"""The exported JSON Schemas are valid draft 2020-12 and accept exactly nodeward's events."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from schemas import REGISTRY, decode, example_event
from schemas.cloudevents import to_structured
from schemas.jsonschema import BASE_URI, DIALECT, event_schema, example_structured, index_document

TYPES = sorted(REGISTRY)


def validator(name: str) -> Draft202012Validator:
    schema = event_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def errors(name: str, obj: Any) -> list[str]:
    return [e.message for e in validator(name).iter_errors(obj)]


@pytest.mark.parametrize("name", TYPES)
def test_schema_names_the_type_stream_and_subject(name: str) -> None:
    schema = event_schema(name)
    et = REGISTRY[name]
    assert schema["$schema"] == DIALECT
    assert schema["$id"] == f"{BASE_URI}{name}.json"
    assert schema["title"] == name
    assert schema["properties"]["type"]["const"] == name
    assert schema["x-nodeward-stream"] == et.stream.name
    assert schema["x-nodeward-subject"] == et.subject_pattern
    assert schema["x-nodeward-subject-wildcard"] == et.subject_wildcard
    assert set(schema["properties"]) == {
        "specversion",
        "id",
        "time",
        "source",
        "type",
        "subject",
        "datacontenttype",
        "data",
    }


@pytest.mark.parametrize("name", TYPES)
def test_examples_and_fresh_events_validate(name: str) -> None:
    assert errors(name, event_schema(name)["examples"][0]) == []
    assert errors(name, json.loads(json.dumps(to_structured(example_event(name))))) == []
    assert example_structured(name) == example_structured(name)


@pytest.mark.parametrize("name", TYPES)
def test_wrong_events_are_rejected(name: str) -> None:
    good = example_structured(name)
    other = next(t for t in TYPES if t != name)
    assert errors(name, {**good, "type": other})
    assert errors(name, {k: v for k, v in good.items() if k != "data"})
    assert errors(name, {k: v for k, v in good.items() if k != "id"})
    assert errors(name, {**good, "specversion": "0.3"})
    assert errors(name, {**good, "data": {}})  # every type has required data fields


def test_gpu_health_data_constraints() -> None:
    good = example_structured("gpu.health.v1")
    assert errors("gpu.health.v1", {**good, "data": {**good["data"], "gpu_index": -1}})
    assert errors("gpu.health.v1", {**good, "data": {**good["data"], "state": "on-fire"}})


def test_falco_samples_validate_as_events() -> None:
    data = files("sim") / "data" / "falco-alerts.jsonl"
    for line in data.read_bytes().splitlines():
        raw = json.loads(line)
        event = decode("falco.x.y", None, line)
        assert errors("falco.alert.v1", json.loads(json.dumps(to_structured(event)))) == []
        assert raw["rule"] == event.data.rule  # type: ignore[attr-defined]


def test_index_lists_every_type_and_stream() -> None:
    index = index_document()
    assert sorted(index["types"]) == TYPES
    for name, entry in index["types"].items():
        assert entry["file"] == f"{name}.json"
        assert entry["stream"] in index["streams"]
        assert entry["subject"] == REGISTRY[name].subject_pattern
