"""The chart's Prometheus rules under promtool, the Prometheus project's own checks.

`promtool check rules` on deploy/helm/nodeward/files/rules/{alerts,recording}.yaml, and
`promtool test rules` on their unit tests (tests/prometheus/*.test.yaml): every alert fires
with its labels and rendered annotations, is only pending until its `for:` has elapsed, and
resolves; every recording rule gives the values its inputs make. Without promtool (Debian's
`prometheus` package, scripts/system-deps.sh) those skip and say so.

The rest needs no promtool: every rule of the chart's files has its cases in the test files
(coverage cannot silently drop), every alert says its severity, summary and description, and
NodewardServiceDown's job regex names every service the chart can run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeward import plugin

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "helm" / "nodeward" / "files" / "rules"
CASES = ROOT / "tests" / "prometheus"
KINDS = ("alerts", "recording")
RULE_FILES = {kind: RULES / f"{kind}.yaml" for kind in KINDS}
TEST_FILES = {kind: CASES / f"{kind}.test.yaml" for kind in KINDS}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found: Debian's `prometheus` package has it (scripts/system-deps.sh)",
)
SEVERITIES = {"info", "warning", "critical"}
# What an alert may be labelled with: the targets' labels, and values from fixed sets (no
# UID, event id or free text).
BOUNDED_LABELS = {
    "alertname",
    "severity",
    "job",
    "namespace",
    "pod",
    "instance",
    "container",
    "node",
    "consumer",
    "stream",
    "reason",
    "channel",
    "source",
    "type",
}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _rules(kind: str) -> list[dict[str, Any]]:
    return [rule for group in _load(RULE_FILES[kind])["groups"] for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in _rules("alerts")}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return f"promtool exited {done.returncode}:\n{done.stdout}{done.stderr}"


# ---- promtool -------------------------------------------------------------------------------


@needs_promtool
@pytest.mark.parametrize("kind", KINDS)
def test_promtool_check_rules_passes(kind: str, tmp_path: Path) -> None:
    done = _promtool("check", "rules", str(RULE_FILES[kind]), cwd=tmp_path)
    assert done.returncode == 0, _said(done)
    assert "SUCCESS" in done.stdout, _said(done)


@needs_promtool
@pytest.mark.parametrize("kind", KINDS)
def test_promtool_unit_tests_pass(kind: str, tmp_path: Path) -> None:
    """Run from an unrelated directory: the test files name the rules relative to themselves."""
    done = _promtool("test", "rules", str(TEST_FILES[kind]), cwd=tmp_path)
    assert done.returncode == 0, _said(done)
    assert "SUCCESS" in done.stdout, _said(done)


# ---- the test files cover the chart's rules -------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_unit_tests_load_the_charts_rule_files(kind: str) -> None:
    """Not a copy: promtool resolves `rule_files` relative to the test file."""
    named = _load(TEST_FILES[kind])["rule_files"]
    assert [(TEST_FILES[kind].parent / p).resolve() for p in named] == [RULE_FILES[kind]]


def _alert_cases() -> dict[str, list[list[dict[str, Any]]]]:
    """Per alert, each test group's expectations for it, in evaluation order."""
    cases: dict[str, list[list[dict[str, Any]]]] = {}
    for group in _load(TEST_FILES["alerts"])["tests"]:
        by_alert: dict[str, list[dict[str, Any]]] = {}
        for case in group.get("alert_rule_test", []):
            by_alert.setdefault(case["alertname"], []).append(case)
        for name, found in by_alert.items():
            order = sorted(found, key=lambda c: _minutes(c["eval_time"]))
            cases.setdefault(name, []).append(order)
    return cases


def _minutes(duration: str) -> float:
    """A Prometheus duration (`90m`, `1h30m`, `45s`) in minutes."""
    units = {"h": 60.0, "m": 1.0, "s": 1 / 60}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_every_alert_fires_waits_for_its_for_and_resolves_in_the_unit_tests() -> None:
    alerts, cases = _alerts(), _alert_cases()
    untested = sorted(set(alerts) - set(cases))
    assert not untested, f"alerts with no case in {TEST_FILES['alerts'].name}: {untested}"
    unknown = sorted(set(cases) - set(alerts))
    assert not unknown, f"cases for alerts the chart does not have: {unknown}"
    problems = []
    for name, rule in alerts.items():
        wait = _minutes(rule["for"]) if "for" in rule else None
        if not any(_fires_then_resolves(steps, wait) for steps in cases[name]):
            problems.append(
                f"{name}: no test group where it is quiet"
                + (f" within its `for: {rule['for']}` before it fires" if wait else " before")
                + ", fires (with summary and description checked) and then has resolved"
            )
    assert not problems, "\n".join(problems)


def _fires_then_resolves(steps: list[dict[str, Any]], wait: float | None) -> bool:
    """Quiet, firing, quiet again. With `for:` the quiet time before is at most `wait` before
    the first firing one: there the condition held already (the cases put it just inside the
    `for:`), the alert pending, not firing."""
    firing = [i for i, s in enumerate(steps) if s.get("exp_alerts")]
    if not firing:
        return False
    first, last = firing[0], firing[-1]
    fired_at = _minutes(steps[first]["eval_time"])
    quiet_before = [_minutes(s["eval_time"]) for s in steps[:first] if not s.get("exp_alerts")]
    if wait is not None:
        quiet_before = [at for at in quiet_before if fired_at - at <= wait]
    resolved_after = any(not s.get("exp_alerts") for s in steps[last + 1 :])
    annotated = all(
        {"summary", "description"} <= set(alert.get("exp_annotations", {}))
        for s in steps
        for alert in s.get("exp_alerts") or []
    )
    return bool(quiet_before) and resolved_after and annotated


def test_every_recording_rule_has_expected_values_in_the_unit_tests() -> None:
    recorded = {rule["record"] for rule in _rules("recording")}
    checked: set[str] = set()
    for group in _load(TEST_FILES["recording"])["tests"]:
        for case in group.get("promql_expr_test", []):
            for sample in case.get("exp_samples") or []:
                checked.add(sample["labels"].split("{", 1)[0].strip())
    untested = sorted(recorded - checked)
    assert not untested, (
        f"recording rules with no expected sample in {TEST_FILES['recording'].name}: {untested}"
    )
    unknown = sorted(checked - recorded)
    assert not unknown, f"expected samples of series no rule records: {unknown}"


def test_the_alerts_unit_tests_expect_only_bounded_labels() -> None:
    """promtool compares an alert's whole label set, so these are every label it gets."""
    seen: dict[str, set[str]] = {}
    for group in _load(TEST_FILES["alerts"])["tests"]:
        for case in group.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                seen.setdefault(case["alertname"], set()).update(alert.get("exp_labels", {}))
    unbounded = {name: sorted(labels - BOUNDED_LABELS) for name, labels in seen.items()}
    assert not {n: u for n, u in unbounded.items() if u}, unbounded


# ---- the alerts themselves ------------------------------------------------------------------


def test_every_alert_says_its_severity_summary_and_description() -> None:
    problems = []
    for name, rule in _alerts().items():
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {rule.get('labels', {}).get('severity')!r}")
        if set(rule.get("labels", {})) - {"severity"}:
            problems.append(f"{name}: static labels other than severity: {rule['labels']}")
        for key in ("summary", "description"):
            if not str(rule.get("annotations", {}).get(key, "")).strip():
                problems.append(f"{name}: no {key}")
    assert not problems, "\n".join(problems)


def test_service_down_names_every_service() -> None:
    """A new service (an entry point under nodeward.services) must be added to the regex."""
    expr = _alerts()["NodewardServiceDown"]["expr"]
    match = re.fullmatch(r'\s*up\{job=~"([a-z|-]+)"\} == 0\s*', expr)
    assert match, f'NodewardServiceDown is not `up{{job=~"a|b|..."}} == 0`: {expr}'
    regex = match.group(1)
    services = set(plugin.names()) | {"auth-callout"}
    assert services >= {"cordon", "notifier", "accounting", "console"}  # names() found them
    named = set(regex.split("|"))
    assert named == services, (
        f"missing: {sorted(services - named)}; not a service: {sorted(named - services)}"
    )
    # Prometheus anchors the regex: each name matches whole, nothing else does
    assert all(re.fullmatch(regex, s) for s in services)
    assert not any(re.fullmatch(regex, j) for j in ("agent", "kube-state-metrics", "cordon-x"))
