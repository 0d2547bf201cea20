"""The Falco response rules (matching, `continue`, validation) and the alert model's
tolerance of what real Falco and Falcosidekick send."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.falco import FalcoAlert, FalcoPriority
from services.falco.alerts import dedup_key, label_value, severity_of
from services.falco.ingest import BadAlert, parse_body
from services.falco.rules import ActionKind, Policy, PriorityTest, RulesError, RuleSet, load_policy
from sim.falco_samples import DROP_AND_EXECUTE, samples


def alert(rule: str = DROP_AND_EXECUTE, **changes: Any) -> FalcoAlert:
    raw = next(a for a in samples() if a["rule"] == rule)
    return FalcoAlert.model_validate({**raw, **changes})


def policy(*rules: dict[str, Any]) -> Policy:
    return Policy.of(RuleSet.model_validate({"rules": list(rules)}).rules)


def names(p: Policy, a: FalcoAlert) -> list[str]:
    return [r.name for r in p.select(a)]


NOTIFY = [{"action": "notify"}]


@pytest.mark.parametrize(
    ("test", "priority", "holds"),
    [
        (">=Warning", "Critical", True),
        (">=Warning", "Warning", True),
        (">=Warning", "Notice", False),
        (">Notice", "Notice", False),
        ("<Notice", "Informational", True),
        ("<=Error", "Critical", False),
        ("Critical", "Critical", True),
        ("=critical", "Alert", False),
        (">=info", "Debug", False),
    ],
)
def test_priority_comparisons(test: str, priority: str, holds: bool) -> None:
    assert PriorityTest.parse(test).holds(FalcoPriority.parse(priority)) is holds


def test_first_match_wins_unless_it_says_continue() -> None:
    p = policy(
        {"name": "crit", "match": {"priority": ">=Critical"}, "actions": NOTIFY},
        {"name": "all", "actions": NOTIFY},
    )
    assert names(p, alert()) == ["crit"]
    p = policy(
        {"name": "crit", "match": {"priority": ">=Critical"}, "actions": NOTIFY, "continue": True},
        {"name": "other", "match": {"priority": "Notice"}, "actions": NOTIFY},
        {"name": "all", "actions": NOTIFY},
    )
    assert names(p, alert()) == ["crit", "all"]


def test_rule_names_tags_source_fields_and_pod() -> None:
    a = (
        alert()
    )  # tags: PCI_DSS_11.5.1, TA0003, container, maturity_stable, mitre_persistence, process
    cases: list[tuple[dict[str, Any], bool]] = [
        ({"rules": ["Terminal shell in container", DROP_AND_EXECUTE]}, True),
        ({"rules": ["Terminal shell in container"]}, False),
        ({"tags": [["container", "process"]]}, True),
        ({"tags": ["container, shell", "network"]}, False),
        ({"tags": ["container, shell", "process"]}, True),
        ({"source": "syscall"}, True),
        ({"source": ["k8s_audit"]}, False),
        ({"output_fields": ["proc.name=xmrig, k8s.ns.name=user-bob"]}, True),
        ({"output_fields": ["proc.name!=xmrig", "user.uid=0"]}, True),
        ({"output_fields": ["proc.name!=xmrig"]}, False),
        ({"output_fields": ["proc.aname[3]="]}, True),  # absent or null equals ""
        ({"pod": True}, True),
        ({"pod": False}, False),
    ]
    for match, expected in cases:
        p = policy({"name": "r", "match": match, "actions": NOTIFY})
        assert bool(p.select(a)) is expected, match
    host = alert(output_fields={"k8s.pod.name": None, "k8s.ns.name": None})
    assert names(policy({"name": "r", "match": {"pod": False}, "actions": NOTIFY}), host) == ["r"]


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        (
            {"name": "x", "match": {"priority": ">=Severe"}, "actions": NOTIFY},
            "unknown Falco priority",
        ),
        ({"name": "x", "match": {"priority": "~Warning"}, "actions": NOTIFY}, "not like"),
        ({"name": "x", "match": {"output_fields": ["proc.name"]}, "actions": NOTIFY}, "key=value"),
        ({"name": "x", "actions": [{"action": "explode"}]}, "action"),
        ({"name": "x", "actions": [{"action": "label"}]}, "label needs"),
        (
            {"name": "x", "actions": [{"action": "label", "with": {"labels": {"bad key!": "v"}}}]},
            "label key",
        ),
        (
            {"name": "x", "actions": [{"action": "isolate", "with": {"cidr": "0.0.0.0/0"}}]},
            "takes no parameter",
        ),
        ({"name": "x", "actions": [{"action": "terminate"}]}, "after a checkpoint"),
        (
            {"name": "x", "actions": [{"action": "terminate"}, {"action": "checkpoint"}]},
            "after a checkpoint",
        ),
        ({"name": "x", "actions": NOTIFY, "mach": {}}, "mach"),
    ],
)
def test_bad_rules_are_refused_with_one_line(
    tmp_path: Path, rule: dict[str, Any], error: str
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps({"rules": [rule]}))
    with pytest.raises(RulesError) as info:
        load_policy(path)
    message = str(info.value)
    assert error in message and "\n" not in message and str(path) in message


def test_the_shipped_rules_never_terminate() -> None:
    shipped = load_policy()
    kinds = {a.action for rule, _ in shipped.rules for a in rule.actions}
    assert ActionKind.TERMINATE not in kinds
    by_priority = {
        p: [a.action.value for r in shipped.select(alert(priority=p.value)) for a in r.actions]
        for p in FalcoPriority
    }
    assert by_priority[FalcoPriority.CRITICAL] == ["checkpoint", "isolate", "notify"]
    assert by_priority[FalcoPriority.EMERGENCY] == ["checkpoint", "isolate", "notify"]
    assert by_priority[FalcoPriority.WARNING] == ["annotate", "notify"]
    assert by_priority[FalcoPriority.NOTICE] == ["notify"]
    assert by_priority[FalcoPriority.INFORMATIONAL] == []


# -- the alert model -----------------------------------------------------------------------


def test_every_sample_parses_and_names_its_pod() -> None:
    for raw in samples():
        a = FalcoAlert.parse(json.dumps(raw))
        assert a.pod == raw["output_fields"]["k8s.pod.name"]
        assert a.message() and not a.message()[0].isdigit()
        assert a.priority.value not in a.message().split(" ", 1)[0]


def test_tolerates_null_k8s_fields_nanosecond_times_escapes_and_cut_strings() -> None:
    raw = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
    host = {
        **raw,
        "time": 1787235065774201663,
        "tags": None,
        "source": "",
        "hostname": "",
        "output_fields": {**raw["output_fields"], "k8s.pod.name": None, "k8s.ns.name": None},
    }
    body = json.dumps(host).replace("bash", "\\u003cbash\\u003e\\ud800")
    a = FalcoAlert.parse(body.encode() + b"")
    assert a.time == datetime(2026, 8, 20, 14, 11, 5, 774202, tzinfo=UTC)
    assert a.pod is None and a.namespace is None and a.tags == [] and a.source == "syscall"
    assert a.hostname is None
    assert "<bash>\ufffd" in a.output
    a.model_dump_json()  # re-encodes: nothing unencodable kept
    raw_bytes = json.dumps(raw).encode().replace(b"xmrig -o", b"xmrig \xff-o")  # invalid UTF-8
    assert "\ufffd-o" in FalcoAlert.parse(raw_bytes).output
    cut = FalcoAlert.model_validate(
        {**raw, "output_fields": {**raw["output_fields"], "k8s.pod.name": "bob-llm-fine[...]"}}
    )
    assert cut.pod is None  # never acted on
    no_output = {k: v for k, v in raw.items() if k != "output"}
    assert FalcoAlert.parse(json.dumps(no_output)).output == ""
    for seconds in (1787235065, 1787235065774, 1787235065774201):
        assert FalcoAlert.model_validate({**raw, "time": seconds}).time.year == 2026


def test_the_ingest_refuses_what_is_not_an_alert_in_one_line() -> None:
    for body, words in (
        (b"", "empty body"),
        (b"{", "not JSON"),
        (b'{"rule": "x"}', "not a Falco alert"),
        (b"[1, 2]", "not a Falco alert"),
        (json.dumps([samples()[0]] * 3).encode(), "at most 2"),
    ):
        with pytest.raises(BadAlert) as info:
            parse_body(body, max_alerts=2)
        assert words in str(info.value) and "\n" not in str(info.value)
    assert len(parse_body(json.dumps(samples()[:2]).encode(), max_alerts=2)) == 2
    lines = "\n".join(json.dumps(a) for a in samples()).encode() + b"\n"
    assert [a.rule for a in parse_body(lines, max_alerts=8)] == [a["rule"] for a in samples()]
    pretty = json.dumps(samples()[0], indent=2).encode()
    assert len(parse_body(pretty, max_alerts=1)) == 1
    with pytest.raises(BadAlert, match="at most 2"):
        parse_body(lines, max_alerts=2)
    with pytest.raises(BadAlert, match="not JSON"):
        parse_body(lines.replace(b"}\n", b"}}\n", 1), max_alerts=8)
    with pytest.raises(ValidationError):
        FalcoAlert.parse(b'{"rule": "x", "priority": "Notice"}')


def test_duplicates_ignore_the_time_prefix_only() -> None:
    a = alert()
    later = alert(
        output="23:59:59.000000001: " + a.output.partition(": ")[2], time="2026-08-21T00:00:00Z"
    )
    assert dedup_key(a) == dedup_key(later)
    assert dedup_key(a) != dedup_key(alert(output=a.output + " again"))
    assert severity_of(FalcoPriority.ALERT).value == "critical"
    value = label_value("Drop and execute new binary in container! " * 3)
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value) and len(value) <= 63
    assert len(label_value("x" * 100)) == 63


# Falcosidekick's `/test` event as each generation of its test handler wrote it (handlers.go),
# after its own processing (default source `syscalls` from 2.25, `internal` for the test rule
# from 2.29), and as its NATS output and webhook forward it.
def _sidekick_test(time: str, **more: Any) -> dict[str, Any]:
    """The test event from 2.25 on: the same fields, `time` and `more` apart."""
    return {
        "output": "This is a test from falcosidekick",
        "priority": "Debug",
        "hostname": "falcosidekick",
        "rule": "Test rule",
        "time": time,
        "output_fields": {"proc.name": "falcosidekick", "user.name": "falcosidekick"},
        **more,
    }


SIDEKICK_TESTS = {
    "before-2.25": {
        "output": "This is a test from falcosidekick",
        "priority": "Debug",
        "rule": "Test rule",
        "time": "2021-03-01T10:00:00Z",
        "outputfields": {"proc.name": "falcosidekick"},
    },
    "2.25-syscalls": _sidekick_test(
        "2022-06-01T10:00:00Z",
        source="syscalls",
        tags=["example", "test"],
        uuid="6f1d0c3e-8a2b-4c7d-9e10-2b3a4c5d6e71",
    ),
    "2.29-internal": _sidekick_test(
        "2024-06-01T10:00:00Z", source="internal", tags=["example", "test"]
    ),
    "2.31-debug-body": _sidekick_test(
        "2025-06-01T10:00:00Z", source="debug", tags=["test", "example"]
    ),
}


@pytest.mark.parametrize("version", sorted(SIDEKICK_TESTS))
def test_every_generation_of_the_sidekick_test_event_is_recognised(version: str) -> None:
    alert = FalcoAlert.parse(json.dumps(SIDEKICK_TESTS[version]))
    assert alert.is_test
    assert alert.nats_subject() == "falco.debug.test_rule"


def test_a_real_alert_of_a_rule_named_test_rule_is_not_a_test_event() -> None:
    real = dict(
        SIDEKICK_TESTS["2.29-internal"], output="Shell spawned by user=root", source="syscall"
    )
    assert not FalcoAlert.parse(json.dumps(real)).is_test
    louder = dict(SIDEKICK_TESTS["2.29-internal"], priority="Critical")
    assert not FalcoAlert.parse(json.dumps(louder)).is_test
