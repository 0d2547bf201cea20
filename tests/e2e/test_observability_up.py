"""The shipped dashboards and rules, proved on the real thing: Debian's Prometheus scrapes a
running `nodeward up` (every daemon's /metrics, the agents included, labelled as the chart's
ServiceMonitors and PodMonitor label them) with the chart's recording and alerting rules
loaded. Once every rule group has been evaluated twice, every panel query of the four
dashboards, every recording rule and every alert's series must give data, except those
`NO_DATA` lists with the reason the demo cannot give them any."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from launch.observability import budget, preview
from launch.observability.dashboards import EXPORTERS
from tests.browser import browser, screenshot
from tests.conftest import REPO
from tests.e2e.platform import Up, running_up
from tests.e2e.test_cli import run, wait_until
from tests.helpers.prometheus import PROMETHEUS, api, prometheus, query

pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian `prometheus` is not installed"),
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("heavy-up"),  # not beside test_fleet_up's timed 256 nodes
]

CHART = REPO / "deploy" / "helm" / "nodeward"
RULE_FILES = sorted((CHART / "files" / "rules").glob("*.yaml"))
DASHBOARDS = sorted((CHART / "files" / "dashboards").glob("*.json"))
NAMESPACE = "nodeward"  # the release's namespace, as the monitors label every target

# Grafana's variables, as a dashboard sets them for a query.
VARIABLES = {"$namespace": ".+", "$__rate_interval": "1m", "$__range": "10m"}

# The series the demo cannot give, and why. A query reading one is still run (it must be
# valid PromQL) but may be empty.
NO_DATA: dict[str, str] = {
    **{
        name: f"{exporter} does not run here (the sim cluster has no kubelet metrics, DCGM, "
        "Kepler or kube-state-metrics); the join is documented in docs/observability.md"
        for exporter, names in EXPORTERS.items()
        for name in names
    },
    # The failure counters are not here: each starts at 0 (`nodeward.metrics.at_zero`).
    "nodeward_auth_callout_answers_total": "up runs NATS without the auth callout",
}


@dataclass(frozen=True)
class Expr:
    where: str  # the file and the panel or rule
    promql: str

    def metrics(self) -> set[str]:
        """The metric and recorded-series names the expression reads."""
        names = set(
            re.findall(r"\b[a-z_]*:?[a-z_]*nodeward_[a-z0-9_]+(?::[a-z0-9_]+)?", self.promql)
        )
        names |= {n for n in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", self.promql) if n in NO_DATA}
        if re.search(r"\bup\{", self.promql):
            names.add("up")
        return names

    def exempt(self) -> str | None:
        """Why this expression may be empty in the demo (None: it must give data)."""
        reasons = {NO_DATA[n] for n in self.metrics() if n in NO_DATA}
        return "; ".join(sorted(reasons)) or None


def panel_queries() -> list[Expr]:
    """Every target of every panel of the shipped dashboards, its variables set."""
    found = []
    for path in DASHBOARDS:
        board = yaml.safe_load(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                found.append(Expr(f"{path.name}: {panel['title']}", expr))
    return found


def rules(kind: str) -> list[tuple[str, Expr]]:
    """(record or alert name, expression) of every rule of that kind in the chart's files."""
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    found.append((rule[kind], Expr(f"{path.name}: {rule[kind]}", rule["expr"])))
    return found


def _targets(up: Up) -> list[dict[str, Any]]:
    """file_sd groups: each daemon labelled as the chart's monitors label it in a cluster
    (`job` the component, `namespace` and `pod` of the target; the agents' `container` and
    `node`)."""
    groups = []
    for name, url in up.daemons.items():
        labels = {"namespace": NAMESPACE}
        agent = re.fullmatch(r"agent-(gpu|energy|idle)-(.+)", name)
        if agent:
            kind, node = agent.groups()
            labels |= {"job": "agent", "container": kind, "node": node}
            labels["pod"] = f"nodeward-agent-{node}"
        else:
            labels |= {"job": name, "pod": f"nodeward-{name}-0", "container": name}
        groups.append({"targets": [url.removeprefix("http://")], "labels": labels})
    return groups


@dataclass
class Stack:
    up: Up
    prometheus: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("observability")
    with running_up(tmp, "--quiet", timeout=180) as up:
        targets = tmp / "targets.yaml"
        targets.write_text(yaml.safe_dump(_targets(up)))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in RULE_FILES],
            "scrape_configs": [
                {
                    "job_name": "nodeward",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "honor_labels": True,  # as the chart's monitors (honorLabels: true)
                    "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        with prometheus(tmp / "prometheus", config) as url:
            _dead_letter(up)
            _guarded(up)
            yield Stack(up, url)


def _dead_letter(up: Up) -> None:
    """Three events the cordon service cannot read: they go to the DLQ, as garbage would."""

    async def publish() -> None:
        nc = await nats.connect(up.endpoints["nats_url"])
        js = nc.jetstream()
        for i in range(3):
            headers = {"ce-type": "gpu.health.v1", "ce-id": f"bad-{i}", "ce-specversion": "1.0"}
            await js.publish("gpu.health.gpu-h100-02.0", b"{not json", headers=headers)
        await nc.close()

    asyncio.run(publish())


def _guarded(up: Up) -> None:
    """An operator asks the cordon service to release a node it never quarantined: a guard
    (`not_ours`) stops it, as the operations view shows (the demo's own refusals, a rate
    limit hit or not, depend on timing)."""
    done = run(
        "quarantine", "release", "gpu-h100-04", "--reason", "e2e: not ours",
        "--state-dir", str(up.state),
    )  # fmt: skip
    assert done.returncode != 0 and "no quarantine by nodeward" in done.stdout + done.stderr


def _evaluated_twice(url: str) -> None:
    """Every rule group has been evaluated at least twice (seen by its last evaluation's
    time moving on), and every target scraped."""
    first = {g["name"]: g["lastEvaluation"] for g in api(url, "rules")["groups"]}
    assert set(first) >= {"nodeward.namespace", "nodeward.cluster", "nodeward.operations"}

    def moved() -> bool:
        now = {g["name"]: g["lastEvaluation"] for g in api(url, "rules")["groups"]}
        return all(now[n] != first[n] and not now[n].startswith("0001") for n in first)

    wait_until(moved, timeout=30, what="two evaluations of every rule group")


def _wait_for_data(url: str, exprs: list[Expr], timeout: float) -> list[str]:
    """The expressions still without a finite value (not exempt) when all others have one
    or `timeout` passed; every expression is run, and one Prometheus refuses fails at once."""
    pending = list(exprs)
    deadline = time.monotonic() + timeout
    while True:
        still = []
        for e in pending:
            result = query(url, e.promql)  # raises with Prometheus' error for bad PromQL
            finite = [r for r in result if math.isfinite(float(r["value"][1]))]
            if not finite and e.exempt() is None:  # NaN or Inf alone: "No data" on a panel
                still.append(e)
        pending = still
        if not pending or time.monotonic() > deadline:
            return [f"{e.where}: {e.promql}" for e in pending]
        time.sleep(1)


def test_every_rule_loads_and_evaluates_without_error(stack: Stack) -> None:
    _evaluated_twice(stack.prometheus)
    groups = api(stack.prometheus, "rules")["groups"]
    loaded = {r["name"] for g in groups for r in g["rules"]}
    shipped = {n for kind in ("record", "alert") for n, _ in rules(kind)}
    assert loaded == shipped
    bad = [
        f"{r['name']}: {r.get('lastError')}"
        for g in groups
        for r in g["rules"]
        if r["health"] != "ok"
    ]
    assert not bad, bad

    def scraped() -> bool:
        targets = api(stack.prometheus, "targets")["activeTargets"]
        return len(targets) == len(stack.up.daemons) and all(t["health"] == "up" for t in targets)

    wait_until(scraped, timeout=30, what="every daemon scraped")


def test_every_panel_query_returns_data_in_the_demo(stack: Stack) -> None:
    _evaluated_twice(stack.prometheus)
    queries = panel_queries()
    assert len(queries) >= 50 and len(DASHBOARDS) == 4
    empty = _wait_for_data(stack.prometheus, queries, timeout=150)
    assert not empty, "panels without data:\n" + "\n".join(empty)
    exempt = sorted({f"{e.where}: {e.exempt()}" for e in queries if e.exempt()})
    print("panels left empty in the demo, and why:\n" + "\n".join(exempt))


def test_every_recording_rule_gives_series(stack: Stack) -> None:
    _evaluated_twice(stack.prometheus)
    recorded = [Expr(e.where, name) for name, e in rules("record")]
    empty = _wait_for_data(stack.prometheus, recorded, timeout=150)
    assert not empty, "recording rules without series:\n" + "\n".join(empty)


def test_the_agents_name_each_model_as_the_capacity_series_do(stack: Stack) -> None:
    """The by-model panels join the agents' `nodeward_gpu_info{model}` with the capacity
    service's `nodeward_gpus{model}` (the nodes' product labels): every model an agent names,
    NVIDIA's and AMD's alike, is one the capacity service counts, and has its utilisation."""
    url = stack.prometheus

    def models(expr: str) -> set[str]:
        return {r["metric"].get("model", "") for r in query(url, f"count by (model) ({expr})")}

    def both() -> bool:
        return len(models("nodeward_gpu_info")) >= 3 and bool(models("nodeward_gpus"))

    wait_until(both, timeout=60, what="the agents' and the capacity service's models")
    named = models("nodeward_gpu_info")
    assert any(m.startswith("AMD_") for m in named), named
    assert named <= models("nodeward_gpus"), (named, models("nodeward_gpus"))
    wait_until(
        lambda: named <= models("model:nodeward_gpu_utilization_ratio:avg"),
        timeout=150,
        what=f"utilisation recorded for each of {sorted(named)}",
    )


def test_every_alert_reads_series_the_platform_exposes(stack: Stack) -> None:
    """An alert that is not firing gives nothing: what is checked is that each series it
    reads exists (else it could never fire), and that its expression runs."""
    _evaluated_twice(stack.prometheus)
    reads = []
    for name, e in rules("alert"):
        query(stack.prometheus, e.promql)
        selectors = re.findall(r"\b(?:nodeward_[a-z0-9_]+|up)(?:\{[^}]*\})?", e.promql)
        assert selectors, name
        reads += [Expr(f"{e.where} reads", s) for s in selectors]
    empty = _wait_for_data(stack.prometheus, reads, timeout=150)
    assert not empty, "alerts reading series that do not exist:\n" + "\n".join(empty)


def test_each_dashboard_drawn_from_prometheus_shows_its_panels(
    stack: Stack, tmp_path: Path
) -> None:
    """The static preview (launch.observability.preview) of each dashboard, fed by this
    Prometheus and drawn by Chromium: every panel is there, and only the exempt ones say
    "No data"."""
    _evaluated_twice(stack.prometheus)
    exempt = {e.where for e in panel_queries() if e.exempt()}
    empty = _wait_for_data(stack.prometheus, panel_queries(), timeout=150)
    assert not empty, "panels without data:\n" + "\n".join(empty)
    pages = preview.write(stack.prometheus, tmp_path / "preview", minutes=5)
    assert [p.stem for p in pages] == [p.stem for p in DASHBOARDS]
    with browser() as chromium:
        for path in pages:
            board = json.loads((CHART / "files" / "dashboards" / f"{path.stem}.json").read_text())
            titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
            page = chromium.new_page(viewport={"width": 1600, "height": 900})
            page.goto(path.as_uri())
            shown = page.locator("section.panel h3").all_inner_texts()
            assert shown == titles
            drawn_empty = {
                f"{path.stem}.json: {t}"
                for t in page.locator("section.panel:has(p.nodata) h3").all_inner_texts()
            }
            assert drawn_empty <= exempt, f"drawn with no data: {sorted(drawn_empty - exempt)}"
            assert page.locator("section.panel svg polyline").count() > 0
            screenshot(page, tmp_path, f"dashboard-{path.stem}")
            page.close()


def test_the_running_platform_keeps_to_the_series_budget(stack: Stack) -> None:
    """Every daemon's exposition, agents included, after the demo's fault, quarantine and
    recovery: within launch/observability/budget.yaml at this fleet's size, no label
    unbounded, no `_created` series."""
    _evaluated_twice(stack.prometheus)
    scrapes = {}
    for name, url in stack.up.daemons.items():
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            scrapes[name] = reply.read().decode()
    assert not any("_created" in text for text in scrapes.values())
    nodes = len({n.removeprefix("agent-gpu-") for n in scrapes if n.startswith("agent-gpu-")})
    assert nodes == 11
    assert budget.violations(budget.load(), budget.count(scrapes), nodes) == []
