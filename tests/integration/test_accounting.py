"""The accounting service on a real NATS and the sim cluster: `nodeward report` totals against
hand-computed sums of injected energy, session and culler events, across a redelivery and a
restart that re-reads every stream; CSV parsed back; gaps shown as gaps."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.remediation import Outcome
from services.accounting.state import hour_of
from tests.conftest import wait_for
from tests.integration.accounting_fixtures import A100, H100, AccountingEnv, EnvFactory

pytestmark = pytest.mark.xdist_group("accounting")

MIN = timedelta(minutes=1)
KWH = 3_600_000.0


def _approx(value: float) -> Any:
    return pytest.approx(value, abs=1e-5)


async def _inject(env: AccountingEnv, hour: datetime) -> list[Any]:
    """One hour of two nodes (h100 misses 5 minutes of readings), three pods, two idle
    periods, utilisation samples and the culler's decisions. Returns what was published."""
    events: list[Any] = []
    for i in range(6):
        start = hour + 10 * i * MIN
        events.append(env.node_interval(env.h100, start, 600, covered_s=300 if i == 3 else None))
        events.append(env.node_interval(env.a100, start, 600))
        events.append(
            env.pod_interval(
                env.h100, env.ns1, "pod-a", start, 600, gpu_j=100_000, cpu_j=8_000, gpus=1
            )
        )
        events.append(
            env.pod_interval(
                env.h100, env.ns1, "pod-b", start, 600, gpu_j=50_000, cpu_j=4_000, gpus=1
            )
        )
        events.append(
            env.pod_interval(
                env.a100, env.ns2, "pod-c", start, 600, gpu_j=300_000, cpu_j=12_000, gpus=2
            )
        )
    for idle_for in (600, 1200, 1800):
        events.append(env.idle(env.h100, env.ns1, "pod-a", hour + 30 * MIN, idle_for, 1))
    events.append(env.idle(env.a100, env.ns2, "pod-c", hour + 50 * MIN, 600, 2))
    events.append(env.activity(env.h100, env.ns1, "pod-a", hour + 5 * MIN, 50.0))
    events.append(env.activity(env.h100, env.ns1, "pod-a", hour + 15 * MIN, 70.0))
    events.append(env.culled("warn", env.ns1, "pod-a", hour + 40 * MIN))
    events.append(env.culled("stop", env.ns1, "pod-a", hour + 55 * MIN))
    events.append(env.culled("warn", env.ns1, "pod-b", hour + 41 * MIN, Outcome.DRY_RUN))
    await env.publish(*events)
    return events


async def _counters(env: AccountingEnv, namespace: str) -> dict[str, float]:
    """The service's Prometheus counters for `namespace`, by metric name."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{env.daemons[0].url}/metrics", timeout=5)).text
    return {
        f"{s.name}{s.labels.get('action', '')}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("nodeward_accounting_")
        and s.name.endswith("_total")
        and s.labels.get("namespace") == namespace
    }


def _check_counters(counters: dict[str, float]) -> None:
    assert counters["nodeward_accounting_energy_joules_total"] == pytest.approx(6 * 162_000)
    assert counters["nodeward_accounting_co2e_grams_total"] == _approx(6 * 162_000 / KWH * 100)
    assert counters["nodeward_accounting_gpu_seconds_total"] == pytest.approx(2 * 3600)
    assert counters["nodeward_accounting_idle_gpu_seconds_total"] == pytest.approx(1800)
    assert counters["nodeward_accounting_sessions_totalwarned"] == 1
    assert counters["nodeward_accounting_sessions_totalstopped"] == 1


def _check_namespaces(env: AccountingEnv, rows: dict[str, dict[str, str]]) -> None:
    assert set(rows) == {env.ns1, env.ns2}
    a, b = rows[env.ns1], rows[env.ns2]
    # ns1: pod-a 6 x 108 kJ, pod-b 6 x 54 kJ; ns2: pod-c 6 x 312 kJ.
    assert float(a["energy_kwh"]) == _approx(6 * 162_000 / KWH)
    assert float(b["energy_kwh"]) == _approx(6 * 312_000 / KWH)
    assert float(a["co2e_kg"]) == _approx(6 * 162_000 / KWH * 100 / 1000)
    assert float(b["co2e_kg"]) == _approx(6 * 312_000 / KWH * 100 / 1000)
    assert float(a["intensity_g_per_kwh"]) == pytest.approx(100.0)
    assert float(a["gpu_hours"]) == _approx(2.0)  # two pods, one GPU each, one hour
    assert float(b["gpu_hours"]) == _approx(2.0)  # one pod, two GPUs
    assert float(a["idle_gpu_hours"]) == _approx(0.5)  # 1 GPU idle 30 min
    assert float(b["idle_gpu_hours"]) == _approx(2 * 600 / 3600)
    assert (a["sessions_warned"], a["sessions_stopped"]) == ("1", "1")  # the dry run not counted
    assert (b["sessions_warned"], b["sessions_stopped"]) == ("0", "0")
    # h100 missed 300 s of readings: its namespace's figure is partial, and says so.
    assert float(a["gap_s"]) == pytest.approx(300.0)
    assert a["complete"] == "False"
    assert (float(b["gap_s"]), b["complete"]) == (0.0, "True")


async def test_report_totals_survive_redelivery_and_restart(accounting_env: EnvFactory) -> None:
    env = await accounting_env()
    await env.start()
    hour = hour_of(datetime.now(UTC)) - timedelta(hours=3)
    events = await _inject(env, hour)
    await wait_for(env.settled, timeout=30, what="every event handled")
    until = hour + timedelta(hours=1)

    _check_namespaces(env, await env.csv_rows(hour, until, "namespace"))
    _check_counters(await _counters(env, env.ns1))

    owners = await env.csv_rows(hour, until, "owner")
    assert float(owners["alice@example.com"]["energy_kwh"]) == _approx(6 * 108_000 / KWH)
    assert float(owners[env.ns1]["energy_kwh"]) == _approx(6 * 54_000 / KWH)  # no annotation
    assert float(owners["bob@example.com"]["energy_kwh"]) == _approx(6 * 312_000 / KWH)

    models = await env.csv_rows(hour, until, "model")
    h100, a100 = models[H100], models[A100]
    assert float(h100["gpu_kwh_per_gpu_hour"]) == _approx(6 * 150_000 / KWH / 2)
    assert float(a100["gpu_kwh_per_gpu_hour"]) == _approx(6 * 300_000 / KWH / 2)
    # pod-a's GPU at 60 % on average: 1 GPU-hour x 0.6 busy for its 600 kJ of GPU energy.
    assert float(h100["gpu_util_pct"]) == pytest.approx(60.0)
    assert float(h100["gpu_kwh_per_busy_gpu_hour"]) == _approx(6 * 100_000 / KWH / 0.6)
    assert a100["gpu_util_pct"] == ""  # not measured: unknown, not zero

    # The same events again (ids kept), then a restart that re-reads every stream.
    for event in (events[2], events[-2], events[-6]):
        await env.publish_again(event)
    await wait_for(env.settled, timeout=30, what="the repeats handled")
    _check_namespaces(env, await env.csv_rows(hour, until, "namespace"))
    _check_counters(await _counters(env, env.ns1))  # nothing counted twice
    await env.stop(env.daemons[0])
    await env.forget_consumers()
    await env.start()
    await wait_for(env.settled, timeout=30, what="every stream re-read")
    _check_namespaces(env, await env.csv_rows(hour, until, "namespace"))


async def test_a_silent_agent_is_a_gap_not_zero(accounting_env: EnvFactory) -> None:
    env = await accounting_env()
    await env.start()
    hour = hour_of(datetime.now(UTC)) - timedelta(hours=4)
    await _inject(env, hour)
    await wait_for(env.settled, timeout=30, what="every event handled")
    # Both agents fell silent after the first hour: the second hour is a gap on both nodes.
    code, out, err = await env.report(
        "--since", hour.isoformat(), "--until", (hour + timedelta(hours=2)).isoformat(),
        "--by", "node", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    rows = {r["node"]: r for r in json.loads(out)["rows"]}
    assert rows[env.h100]["gap_s"] == pytest.approx(300 + 3600)
    assert rows[env.a100]["gap_s"] == pytest.approx(3600)
    assert rows[env.a100]["silent_since"] == (hour + timedelta(hours=1)).isoformat()
    assert rows[env.a100]["complete"] is False
    code, table, err = await env.report(
        "--since", hour.isoformat(), "--until", (hour + timedelta(hours=2)).isoformat(),
        "--by", "node",
    )  # fmt: skip
    assert code == 0, err
    assert "silent since" in table
    assert "no energy reading" in table


async def test_report_refuses_bad_input_in_one_line(accounting_env: EnvFactory) -> None:
    env = await accounting_env()
    code, _, err = await env.report("--since", "7d", "--by", "team")
    assert code == 2
    assert "namespace, owner, node, model, group or experiment" in err
    code, _, err = await env.report("--since", "yesterday")
    assert code == 2
    assert "neither a duration" in err
