"""`decode` never crashes: whatever arrives, it returns an Event or raises DecodeError."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import REGISTRY, DecodeError, Event, decode, encode, example_event
from schemas.cloudevents import STRUCTURED, to_structured

# NODEWARD_FUZZ_EXAMPLES=5000 for a longer hunt; 300 keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("NODEWARD_FUZZ_EXAMPLES", "300")), deadline=None)

EVENTS = {name: example_event(name) for name in sorted(REGISTRY)}
WIRES = [encode(e) for e in EVENTS.values()]
FALCO_SUBJECT = "falco.notice.terminal_shell_in_container"
FALCO_BODY = encode(example_event("falco.alert.v1")).body

subjects = st.one_of(
    st.sampled_from([w.subject for w in WIRES] + [FALCO_SUBJECT, "falco.x", "falco", "x.y", ""]),
    st.text(max_size=40),
)
header_text = st.text(max_size=40)
ce_names = st.sampled_from(
    [
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-subject",
        "ce-time",
        "ce-datacontenttype",
        "content-type",
        "Content-Type",
        "CE-TYPE",
        "Nats-Msg-Id",
    ]
)
random_headers = st.dictionaries(st.one_of(ce_names, header_text), header_text, max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
wires = st.sampled_from(WIRES)


def check(subject: str, headers: dict[str, str] | None, body: bytes) -> None:
    try:
        event = decode(subject, headers, body)
    except DecodeError as err:
        assert err.reason and err.reason != "malformed", f"unhandled path: {err}"
        assert "\n" not in str(err) and "\r" not in str(err)
        return
    assert isinstance(event, Event)
    assert event.type in REGISTRY and type(event.data) is REGISTRY[event.type].model


@FUZZ
@given(subjects, st.none() | random_headers, st.binary(max_size=200))
def test_random_everything(subject: str, headers: dict[str, str] | None, body: bytes) -> None:
    check(subject, headers, body)


@FUZZ
@given(wires, st.binary(max_size=300))
def test_valid_headers_random_bytes(wire: Any, body: bytes) -> None:
    check(wire.subject, wire.headers, body)


@FUZZ
@given(wires, json_values)
def test_valid_headers_random_json(wire: Any, value: Any) -> None:
    check(wire.subject, wire.headers, json.dumps(value).encode())


@FUZZ
@given(wires, st.data())
def test_valid_headers_with_random_field_values(wire: Any, data: st.DataObject) -> None:
    body = json.loads(wire.body)
    key = data.draw(st.sampled_from(sorted(body)))
    body[key] = data.draw(json_values)
    check(wire.subject, wire.headers, json.dumps(body).encode())


@FUZZ
@given(wires, random_headers)
def test_valid_body_random_headers(wire: Any, headers: dict[str, str]) -> None:
    check(wire.subject, headers, wire.body)
    check(wire.subject, {**wire.headers, **headers}, wire.body)


@FUZZ
@given(wires, ce_names, header_text)
def test_one_header_replaced(wire: Any, name: str, value: str) -> None:
    check(wire.subject, {**wire.headers, name: value}, wire.body)


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_native_falco_subject_random_body(body: bytes) -> None:
    check(FALCO_SUBJECT, None, body)


@FUZZ
@given(st.data())
def test_native_falco_random_field_values(data: st.DataObject) -> None:
    alert = json.loads(FALCO_BODY)
    key = data.draw(st.sampled_from(sorted(alert)))
    alert[key] = data.draw(json_values | st.text(max_size=30))
    check(FALCO_SUBJECT, None, json.dumps(alert).encode())


@FUZZ
@given(wires, st.data())
def test_structured_random_attributes(wire: Any, data: st.DataObject) -> None:
    obj = json.loads(json.dumps(to_structured(EVENTS[wire.headers["ce-type"]])))
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(json_values)
    check(wire.subject, {"content-type": STRUCTURED}, json.dumps(obj).encode())


@FUZZ
@given(st.binary(max_size=200))
def test_structured_random_bytes(body: bytes) -> None:
    check("gpu.health.n.0", {"content-type": STRUCTURED}, body)
