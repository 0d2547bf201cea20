"""The event contract: every registered type, the Falco samples, the CloudEvents mapping."""

from __future__ import annotations

import csv
import json
import re
import uuid
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import REGISTRY, STREAMS, DecodeError, Event, decode, encode, example_event
from schemas.base import make_event
from schemas.cloudevents import MSG_ID, STRUCTURED, from_structured, to_structured
from schemas.falco import FalcoAlert
from schemas.gpu import GpuHealth, RecommendedAction
from schemas.ids import id_time_ms, new_id, stable_id
from schemas.streams import stream_for_subject, subject_matches

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
SCHEMAS_DATA = files("schemas") / "data"
"""The contract's data: NVIDIA's XID catalog (`schemas.xid`)."""
SIM_DATA = files("sim") / "data"
"""The simulator's samples (the Falco alerts)."""
TYPES = sorted(REGISTRY)

REASONS = {
    "invalid_data",
    "invalid_json",
    "missing_type",
    "type_mismatch",
    "unknown_type",
    "bad_header",
    "bad_content_type",
    "missing_headers",
    "unexpected_type",
}


def assert_one_line(err: DecodeError) -> None:
    assert err.reason in REASONS, err.reason
    text = str(err)
    assert text and "\n" not in text and "\r" not in text


def decode_error(subject: str, headers: dict[str, str] | None, body: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(subject, headers, body)
    assert_one_line(info.value)
    return info.value


# -- every registered type ----------------------------------------------------------------


@pytest.mark.parametrize("name", TYPES)
def test_example_validates_strictly(name: str) -> None:
    model = REGISTRY[name].model
    raw = model.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index,call-overload]
    data = model.model_validate(raw, context={"forbid_extra": True})
    assert data == model.example()
    assert data.TYPE == name == REGISTRY[name].name


@pytest.mark.parametrize("name", TYPES)
def test_binary_round_trip(name: str) -> None:
    event = example_event(name)
    wire = encode(event)
    assert wire.headers[MSG_ID] == event.id
    assert wire.headers["ce-type"] == name
    decoded = decode(wire.subject, wire.headers, wire.body, expected_types={name})
    assert decoded == event
    assert type(decoded.data) is REGISTRY[name].model


@pytest.mark.parametrize("name", TYPES)
def test_structured_round_trip(name: str) -> None:
    event = example_event(name)
    obj = json.loads(json.dumps(to_structured(event)))
    assert obj["type"] == name and obj["specversion"] == "1.0"
    assert from_structured(obj, forbid_extra=True) == event
    body = json.dumps(obj).encode()
    assert decode(event.nats_subject, {"content-type": STRUCTURED}, body) == event


@pytest.mark.parametrize("name", TYPES)
def test_subject_belongs_to_its_stream_and_pattern(name: str) -> None:
    et = REGISTRY[name]
    subject = encode(example_event(name)).subject
    matching = [s.name for s in STREAMS if any(subject_matches(p, subject) for p in s.subjects)]
    assert matching == [et.stream.name] == [et.model.STREAM]
    spec = stream_for_subject(subject)
    assert spec is not None and spec.name == et.stream.name
    assert subject_matches(et.subject_wildcard, subject), (et.subject_wildcard, subject)
    assert et.subject_wildcard.count(".") == et.subject_pattern.count(".")


HOSTILE = "a.b c*d>e\tf/é"
# Kubernetes names: validated by the contract (RFC 1123), so hostile values never get in.
NAME_FIELDS = ("node", "namespace", "pod", "secret")
# Free text that still becomes a subject token: sanitised into one token.
TOKEN_FIELDS = ("topic", "action", "stream", "consumer")
BAD_NAMES = ("gpu-*", ">", "a b", "Gpu-01", "-gpu", "gpu-", "a..b", "é", "", "a" * 254)


def _example(name: str) -> dict[str, Any]:
    return dict(REGISTRY[name].model.model_config["json_schema_extra"]["examples"][0])  # type: ignore[index,call-overload]


@pytest.mark.parametrize("name", TYPES)
def test_hostile_names_stay_inside_one_token(name: str) -> None:
    et = REGISTRY[name]
    raw = _example(name)
    for key in TOKEN_FIELDS:
        if key in raw:
            raw[key] = HOSTILE
    if name == "remediation.v1":
        raw["target"] = {"kind": "Pod", "namespace": HOSTILE, "name": HOSTILE}
    if name == "falco.alert.v1":
        raw["rule"] = HOSTILE
    subject = et.model.model_validate(raw).nats_subject()
    assert subject_matches(et.subject_wildcard, subject), subject
    assert not set(" \t*>") & set(subject)


NAMED = [(n, f) for n in TYPES for f in NAME_FIELDS if f in _example(n)]


@pytest.mark.parametrize(("name", "field"), NAMED, ids=[f"{n}:{f}" for n, f in NAMED])
def test_names_that_are_not_kubernetes_names_are_refused(name: str, field: str) -> None:
    wire = encode(example_event(name))
    for bad in BAD_NAMES:
        body = json.loads(wire.body)
        body[field] = bad
        err = decode_error(wire.subject, wire.headers, json.dumps(body).encode())
        assert err.reason == "invalid_data" and field in str(err)
        assert_one_line(err)
        if bad:
            assert "RFC 1123" in str(err)
    limit = 63 if field == "namespace" else 253
    goods = ["gpu-h100-01", "0", "a" * limit] + ([] if field == "namespace" else ["n1.dc-2.x"])
    for good in goods:
        body = json.loads(wire.body)
        body[field] = good
        event = decode(wire.subject, wire.headers, json.dumps(body).encode())
        assert getattr(event.data, field) == good


def test_pod_references_are_kubernetes_names() -> None:
    raw = _example("gpu.health.v1")
    raw["pods"] = [{"namespace": "user.alice", "name": "jupyter-alice-0"}]
    with pytest.raises(ValueError, match="RFC 1123 label"):
        GpuHealth.model_validate(raw)


@pytest.mark.parametrize("name", TYPES)
def test_unexpected_type_is_refused(name: str) -> None:
    wire = encode(example_event(name))
    with pytest.raises(DecodeError) as info:
        decode(wire.subject, wire.headers, wire.body, expected_types={"something.else.v1"})
    assert info.value.reason == "unexpected_type"
    assert_one_line(info.value)


def test_every_stream_carries_some_type() -> None:
    assert {s.name for s in STREAMS} == {et.stream.name for et in REGISTRY.values()}


# -- ids ----------------------------------------------------------------------------------


def test_ids_are_unique_and_time_ordered() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids
    for value in (ids[0], ids[-1]):
        parsed = uuid.UUID(value)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert id_time_ms(ids[0]) <= id_time_ms(ids[-1])


def test_stable_ids_are_deterministic() -> None:
    alert = FalcoAlert.example()
    a = stable_id(alert.time, "node", alert.rule, alert.output)
    assert a == stable_id(alert.time, "node", alert.rule, alert.output)
    assert a != stable_id(alert.time, "other-node", alert.rule, alert.output)
    assert id_time_ms(a) == int(alert.time.timestamp() * 1000)


# -- Falco samples ------------------------------------------------------------------------


def sidekick_subject(alert: dict[str, Any]) -> str:
    """The subject Falcosidekick's NATS output builds (outputs/nats.go), re-implemented."""
    rule = re.sub("[^a-z0-9]+", "_", alert["rule"].lower()).strip("_")
    return f"falco.{alert['priority'].lower()}.{rule}"


def falco_lines() -> list[bytes]:
    return [
        line for line in (SIM_DATA / "falco-alerts.jsonl").read_bytes().splitlines() if line.strip()
    ]


@pytest.mark.parametrize(
    ("package", "shipped"), [(SIM_DATA, "falco-alerts.jsonl"), (SCHEMAS_DATA, "xid-catalog.csv")]
)
def test_package_data_matches_shared_data(package: Any, shipped: str) -> None:
    shared = SHARED_DATA / shipped
    if not shared.is_file():
        pytest.skip(f"no shared data folder at {SHARED_DATA}; testing the packaged copy only")
    assert (package / shipped).read_bytes() == shared.read_bytes(), (
        f"{package}/{shipped} differs from {shared}: copy it again"
    )


def test_falco_samples_decode_without_headers() -> None:
    lines = falco_lines()
    assert len(lines) == 8
    ids = set()
    for line in lines:
        raw = json.loads(line)
        subject = sidekick_subject(raw)
        for headers in (None, {}):
            event = decode(subject, headers, line)
            assert event.type == "falco.alert.v1"
            assert isinstance(event.data, FalcoAlert)
            assert event.nats_subject == subject == encode(event).subject
            assert stream_for_subject(subject) is not None
            assert stream_for_subject(subject).name == "SECURITY"  # type: ignore[union-attr]
            assert event.source == f"falco/{raw['hostname']}"
            assert (
                event.subject
                == f"pod/{raw['output_fields']['k8s.ns.name']}/{raw['output_fields']['k8s.pod.name']}"
            )
            assert event.time == event.data.time
            assert id_time_ms(event.id) == int(event.time.timestamp() * 1000)
            assert event == decode(subject, None, line), "decoding is deterministic"
            ids.add(event.id)
        # Falco's own http_output body is the same without uuid: same event id.
        native = {k: v for k, v in raw.items() if k != "uuid"}
        again = decode(subject, None, json.dumps(native).encode())
        assert again.id == event.id and again.data.uuid is None  # type: ignore[attr-defined]
    assert len(ids) == len(lines)


def test_falco_decoded_event_round_trips_as_cloudevent() -> None:
    for line in falco_lines():
        event = decode(sidekick_subject(json.loads(line)), None, line)
        wire = encode(event)
        assert decode(wire.subject, wire.headers, wire.body) == event


def test_xid_catalog_actions_are_contract_values() -> None:
    with (SCHEMAS_DATA / "xid-catalog.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"xid", "name", "category", "recommended_action", "notes"} <= set(rows[0])
    actions = {a.value for a in RecommendedAction}
    assert {r["recommended_action"] for r in rows} <= actions
    assert len({int(r["xid"]) for r in rows}) == len(rows)


# -- decoding variants and errors ---------------------------------------------------------


def wire_of(name: str = "gpu.health.v1") -> tuple[Event[Any], str, dict[str, str], bytes]:
    event = example_event(name)
    wire = encode(event)
    return event, wire.subject, dict(wire.headers), wire.body


def test_plain_content_type_instead_of_ce_datacontenttype() -> None:
    event, subject, headers, body = wire_of()
    del headers["ce-datacontenttype"]
    for ct in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        assert decode(subject, {**headers, "content-type": ct}, body) == event
    assert decode(subject, headers, body) == event  # neither: JSON is assumed
    err = decode_error(subject, {**headers, "content-type": "text/plain"}, body)
    assert err.reason == "bad_content_type"


def test_header_names_are_case_insensitive() -> None:
    event, subject, headers, body = wire_of()
    upper = {k.upper(): v for k, v in headers.items()}
    assert decode(subject, upper, body) == event


def test_structured_mode_with_parameters_and_errors() -> None:
    event, subject, _, _ = wire_of()
    body = json.dumps(to_structured(event)).encode()
    assert decode(subject, {"Content-Type": STRUCTURED + "; charset=utf-8"}, body) == event
    assert decode_error(subject, {"content-type": STRUCTURED}, b"{nope").reason == "invalid_json"
    assert decode_error(subject, {"content-type": STRUCTURED}, b"[1, 2]").reason == "invalid_data"
    no_type = {k: v for k, v in to_structured(event).items() if k != "type"}
    err = decode_error(subject, {"content-type": STRUCTURED}, json.dumps(no_type).encode())
    assert err.reason == "missing_type"


@pytest.mark.parametrize(
    ("source", "subject_attr", "event_id"),
    [
        ("agent/gpu/nœud 7", "pod/user-zoë/jupyter 0", "id with spaces"),
        ("service/文字", 'quote"d %41 100%', "ü-1"),
        ("x\r\nInjected: yes", "tab\there", "line\nbreak"),
    ],
)
def test_percent_encoded_headers_round_trip(source: str, subject_attr: str, event_id: str) -> None:
    base = example_event("gpu.health.v1")
    event = base.model_copy(update={"source": source, "subject": subject_attr, "id": event_id})
    decoded = _through_headers(event)
    assert (decoded.source, decoded.subject, decoded.id) == (source, subject_attr, event_id)
    assert decoded == event


printable = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60)


def _through_headers(event: Event[Any]) -> Event[Any]:
    """`event` encoded (every header printable ASCII) and decoded again."""
    wire = encode(event)
    for value in wire.headers.values():
        assert value.isascii() and value.isprintable(), value
    return decode(wire.subject, wire.headers, wire.body)


@settings(max_examples=200, deadline=None)
@given(source=printable, subject_attr=printable, event_id=printable)
def test_any_attribute_text_round_trips(source: str, subject_attr: str, event_id: str) -> None:
    base = example_event("session.idle.v1")
    event = base.model_copy(update={"source": source, "subject": subject_attr, "id": event_id})
    assert _through_headers(event) == event


def test_quoted_header_values_are_unquoted() -> None:
    event, subject, headers, body = wire_of()
    headers["ce-source"] = f'"{headers["ce-source"]}"'
    assert decode(subject, headers, body) == event


@pytest.mark.parametrize(
    ("header", "value", "reason"),
    [
        ("ce-specversion", "0.3", "bad_header"),  # the wrong specversion
        ("ce-type", "gpu.health.v9", "unknown_type"),
        ("ce-datacontenttype", "application/xml", "bad_content_type"),  # not JSON
    ],
)
def test_a_wrong_header_is_refused_and_named(header: str, value: str, reason: str) -> None:
    _, subject, headers, body = wire_of()
    err = decode_error(subject, {**headers, header: value}, body)
    assert err.reason == reason and value in str(err)


def test_missing_required_headers() -> None:
    _, subject, headers, body = wire_of()
    del headers["ce-source"]
    err = decode_error(subject, headers, body)
    assert err.reason == "bad_header" and "ce-source" in str(err)


def test_bad_time_header() -> None:
    _, subject, headers, body = wire_of()
    assert decode_error(subject, {**headers, "ce-time": "yesterday"}, body).reason == "bad_header"


def test_non_json_body() -> None:
    _, subject, headers, _ = wire_of()
    err = decode_error(subject, headers, b"\x00\xffnot json")
    assert err.reason == "invalid_json" and err.event_type == "gpu.health.v1"


def test_invalid_data() -> None:
    _, subject, headers, body = wire_of()
    data = json.loads(body)
    data["state"] = "on-fire"
    del data["node"]
    err = decode_error(subject, headers, json.dumps(data).encode())
    assert err.reason == "invalid_data" and err.event_type == "gpu.health.v1"
    assert str(err).startswith("gpu.health.v1: ") and "node" in str(err) and "state" in str(err)


def test_no_headers_on_a_non_native_subject() -> None:
    _, subject, _, body = wire_of()
    assert decode_error(subject, None, body).reason == "missing_headers"


def test_invalid_falco_alerts() -> None:
    line = falco_lines()[0]
    subject = sidekick_subject(json.loads(line))
    assert decode_error(subject, None, b"not json").reason == "invalid_json"
    bad = json.loads(line)
    bad["priority"] = "Apocalyptic"
    assert decode_error(subject, None, json.dumps(bad).encode()).reason == "invalid_data"
    naive = json.loads(line)
    naive["time"] = "2026-08-20T14:02:11"  # Falco always sends UTC with Z
    err = decode_error(subject, None, json.dumps(naive).encode())
    assert err.reason == "invalid_data" and "time" in str(err)


# -- forbid_extra -------------------------------------------------------------------------


def structured(name: str = "gpu.health.v1") -> dict[str, Any]:
    return json.loads(json.dumps(to_structured(example_event(name))))


def test_forbid_extra_rejects_unknown_data_fields() -> None:
    obj = structured()
    obj["data"]["colour"] = "blue"
    obj["data"]["zzz"] = 1
    with pytest.raises(DecodeError) as info:
        from_structured(obj, forbid_extra=True)
    assert info.value.reason == "invalid_data"
    assert (
        str(info.value)
        == "gpu.health.v1: data: Value error, unknown field(s) for gpu.health.v1: colour, zzz"
    )
    assert from_structured(obj).data == from_structured(structured()).data  # ignored by default


def test_forbid_extra_rejects_unknown_nested_fields() -> None:
    obj = structured()
    obj["data"]["reasons"][0]["severity_typo"] = "high"
    with pytest.raises(DecodeError) as info:
        from_structured(obj, forbid_extra=True)
    assert "data.reasons.0" in str(info.value) and "severity_typo" in str(info.value)
    assert_one_line(info.value)
    from_structured(obj)  # readers ignore additive fields


def test_forbid_extra_allows_cloudevents_extension_attributes() -> None:
    obj = structured()
    obj["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert from_structured(obj, forbid_extra=True).type == "gpu.health.v1"


def test_forbid_extra_accepts_field_aliases_and_every_example() -> None:
    for name in TYPES:
        assert from_structured(structured(name), forbid_extra=True).type == name


def test_from_structured_type_checks() -> None:
    obj = structured()
    with pytest.raises(DecodeError) as info:
        from_structured(obj, type_name="notify.v1")
    assert info.value.reason == "type_mismatch"
    del obj["type"]
    assert from_structured(obj, type_name="gpu.health.v1").type == "gpu.health.v1"
    with pytest.raises(DecodeError) as info:
        from_structured("not an object")
    assert info.value.reason == "invalid_data"


def test_make_event_takes_subject_from_data() -> None:
    data = GpuHealth.example()
    event = make_event(data, source="agent/gpu/gpu-node-07")
    assert event.subject == data.about() and event.type == data.TYPE
    with pytest.raises(ValueError, match="does not match data model"):
        Event[GpuHealth](source="x", subject="y", type="notify.v1", data=data)


def test_schemas_package_imports_only_pydantic_and_the_standard_library() -> None:
    import ast
    import sys

    allowed = {"pydantic", "schemas", "__future__"} | set(sys.stdlib_module_names)
    for path in sorted((REPO / "schemas").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{path.name} imports {roots - allowed}"
