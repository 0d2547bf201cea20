"""JSON Schema (draft 2020-12) of every event type, as a structured CloudEvent.

Each document describes the whole event (`specversion`, `id`, `time`, `source`, `type`,
`subject`, `datacontenttype`, `data`) with `type` fixed to the type's name, and names the
JetStream stream and subject pattern in `x-nodeward-*` keys. `index.json` lists every type
and its file. Pure: building the documents does no I/O (`nodeward.schemas_export` writes them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.base import Event, make_event
from schemas.cloudevents import to_structured
from schemas.ids import stable_id
from schemas.registry import REGISTRY, lookup
from schemas.streams import STREAMS

DIALECT = "https://json-schema.org/draft/2020-12/schema"
BASE_URI = "https://nodeward.io/schemas/"
INDEX_FILE = "index.json"
# Examples get a fixed time and a derived id so that the documents are reproducible.
_EXAMPLE_TIME = datetime(2026, 8, 20, 14, 2, 11, tzinfo=UTC)
# Attributes nodeward always sets (CloudEvents itself requires id, source, specversion, type).
_REQUIRED = ("specversion", "id", "time", "source", "type", "subject", "data")


def schema_file(type_name: str) -> str:
    """The file name of a type's schema, e.g. `gpu.health.v1.json`."""
    return f"{type_name}.json"


def example_structured(type_name: str) -> dict[str, Any]:
    """A reproducible example event of this type, in structured JSON form."""
    et = lookup(type_name)
    event = make_event(
        et.model.example(),
        source=et.model.EXAMPLE_SOURCE,
        id=stable_id(_EXAMPLE_TIME, type_name),
        time=_EXAMPLE_TIME,
    )
    return to_structured(event)


def event_schema(type_name: str) -> dict[str, Any]:
    """The JSON Schema of one event type as a structured CloudEvent."""
    et = lookup(type_name)
    schema = Event[et.model].model_json_schema(mode="validation")  # type: ignore[name-defined]
    schema["properties"]["type"] = {"const": et.name, "title": "Type", "type": "string"}
    schema["required"] = [p for p in _REQUIRED if p in schema["properties"]]
    schema.update(
        {
            "$schema": DIALECT,
            "$id": BASE_URI + schema_file(et.name),
            "title": et.name,
            "description": f"{et.description} (CloudEvents 1.0, structured JSON form)",
            "examples": [example_structured(et.name)],
            "x-nodeward-stream": et.stream.name,
            "x-nodeward-subject": et.subject_pattern,
            "x-nodeward-subject-wildcard": et.subject_wildcard,
        }
    )
    return schema


def index_document() -> dict[str, Any]:
    """Every event type → its schema file, stream and subject pattern; every stream."""
    return {
        "$id": BASE_URI + INDEX_FILE,
        "title": "nodeward event types",
        "dialect": DIALECT,
        "types": {
            name: {
                "file": schema_file(name),
                "$id": BASE_URI + schema_file(name),
                "description": et.description,
                "stream": et.stream.name,
                "subject": et.subject_pattern,
            }
            for name, et in sorted(REGISTRY.items())
        },
        "streams": {
            s.name: {"subjects": list(s.subjects), "description": s.description} for s in STREAMS
        },
    }


def all_documents() -> dict[str, dict[str, Any]]:
    """File name → document: one schema per registered type, plus `index.json`."""
    docs = {schema_file(name): event_schema(name) for name in sorted(REGISTRY)}
    docs[INDEX_FILE] = index_document()
    return docs
