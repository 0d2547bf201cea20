"""The Grafana dashboards, as code: the user, cluster, sustainability and operations views.

Each dashboard is a list of rows of `Panel`s: a title that says its unit, the unit, and its
PromQL. They read the recording rules (`files/rules/recording.yaml`) wherever an aggregate
exists, the raw series only for what is not aggregated, and the exporters a cluster already
runs for what they measure best (`EXPORTERS`; docs/observability.md has the joins). `build`
turns them into Grafana's JSON with grafana-foundation-sdk, Grafana's own builders
generated from its schemas; `python -m launch.observability.generate` writes them into the
chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.models import common as models
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

Kind = Literal["timeseries", "stacked", "stat", "bars"]
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# What another exporter measures and nodeward reads rather than measuring again: the series
# each needs, by the exporter's own metric names (docs/observability.md, "Joins").
EXPORTERS = {
    "dcgm-exporter": ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"),
    "kepler": ("kepler_container_joules_total",),
    "kube-state-metrics": ("kube_pod_container_resource_requests",),
    "cadvisor": ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes"),
}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """One panel; `title` names the unit as people say it, `unit` is Grafana's unit id."""

    title: str
    unit: str
    queries: Sequence[Query]
    kind: Kind = "timeseries"
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel]


@dataclass(frozen=True)
class Dashboard:
    name: str  # the file and the uid's tail
    title: str
    description: str
    rows: Sequence[Row]
    namespace_variable: bool = False
    tags: Sequence[str] = field(default_factory=tuple)


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


NS = 'namespace=~"$namespace"'

USER = Dashboard(
    name="user",
    title="nodeward / a team's use",
    description="One namespace (or several): its GPUs, CPU and memory, power and energy, "
    "and its sessions.",
    namespace_variable=True,
    rows=[
        Row(
            "GPUs",
            [
                Panel(
                    "GPUs allocated (GPU-hours per hour)",
                    "short",
                    [
                        q(
                            f"namespace:nodeward_accounting_gpu_hours:increase1h{{{NS}}}",
                            "{{namespace}}",
                        )
                    ],
                    description="What accounting charged: GPUs held by the namespace's pods, "
                    "as a mean over the last hour.",
                ),
                Panel(
                    "Idle GPU-hours per hour",
                    "short",
                    [
                        q(
                            f"namespace:nodeward_accounting_idle_gpu_hours:increase1h{{{NS}}}",
                            "{{namespace}}",
                        )
                    ],
                    description="GPU time held by sessions the idle agents judged idle.",
                ),
                Panel(
                    "GPU utilisation of the team's pods (%, DCGM exporter)",
                    "percent",
                    [q(f"avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{{{NS}}})", "{{namespace}}")],
                    description="From dcgm-exporter's per-pod labels; empty without it.",
                ),
                Panel(
                    "GPU memory used by the team's pods (bytes, DCGM exporter)",
                    "decmbytes",
                    [q(f"sum by (namespace) (DCGM_FI_DEV_FB_USED{{{NS}}})", "{{namespace}}")],
                    description="dcgm-exporter's framebuffer in use, MiB; empty without it.",
                ),
            ],
        ),
        Row(
            "CPU and memory",
            [
                Panel(
                    "CPU used (cores)",
                    "short",
                    [
                        q(
                            "sum by (namespace) (rate(container_cpu_usage_seconds_total"
                            f'{{{NS}, container!=""}}[$__rate_interval]))',
                            "{{namespace}}",
                        )
                    ],
                    description="The kubelet's cAdvisor series, as every cluster has them.",
                ),
                Panel(
                    "Memory in use (bytes, working set)",
                    "bytes",
                    [
                        q(
                            "sum by (namespace) (container_memory_working_set_bytes"
                            f'{{{NS}, container!=""}})',
                            "{{namespace}}",
                        )
                    ],
                ),
            ],
        ),
        Row(
            "Power and energy",
            [
                Panel(
                    "Power of the team's pods (W)",
                    "watt",
                    [q(f"namespace:nodeward_pod_power_watts:rate5m{{{NS}}}", "{{namespace}}")],
                    description="The energy agents' split of each node's measured power among "
                    "its pods (GPUs by use, the rest by CPU share).",
                ),
                Panel(
                    "Energy charged per hour (kWh)",
                    "kwatth",
                    [
                        q(
                            f"namespace:nodeward_accounting_energy_kwh:increase1h{{{NS}}}",
                            "{{namespace}}",
                        )
                    ],
                ),
                Panel(
                    "CO2e charged per hour (g)",
                    "massg",
                    [
                        q(
                            f"namespace:nodeward_accounting_co2e_grams:increase1h{{{NS}}}",
                            "{{namespace}}",
                        )
                    ],
                ),
                Panel(
                    "Energy over the time range (kWh)",
                    "kwatth",
                    [
                        q(
                            "sum(increase(nodeward_accounting_energy_joules_total"
                            f"{{{NS}}}[$__range])) / 3.6e6"
                        )
                    ],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "CO2e over the time range (kg)",
                    "masskg",
                    [
                        q(
                            "sum(increase(nodeward_accounting_co2e_grams_total"
                            f"{{{NS}}}[$__range])) / 1000"
                        )
                    ],
                    kind="stat",
                    width=6,
                ),
            ],
        ),
        Row(
            "Sessions",
            [
                Panel(
                    "Session pods by verdict (count)",
                    "short",
                    [q(f"sum by (state) (namespace:nodeward_sessions:sum{{{NS}}})", "{{state}}")],
                    kind="stacked",
                    description="Notebooks and other sessions, by the idle agents' last "
                    "verdict: active, idle or unknown.",
                ),
                Panel(
                    "Sessions warned and stopped per hour (count)",
                    "short",
                    [
                        q(
                            f"namespace:nodeward_accounting_sessions:increase1h{{{NS}}}",
                            "{{namespace}} {{action}}",
                        )
                    ],
                ),
            ],
        ),
    ],
)

CLUSTER = Dashboard(
    name="cluster",
    title="nodeward / cluster capacity",
    description="Capacity planning: GPUs free and used per model and profile, use over time, "
    "idle sessions, and power against the racks' limits.",
    rows=[
        Row(
            "GPUs",
            [
                Panel(
                    "Free GPUs per model and profile (count)",
                    "short",
                    [
                        q(
                            'model_profile:nodeward_gpus:max{state="free"}',
                            "{{model}} {{profile}}",
                        )
                    ],
                ),
                Panel(
                    "GPUs by state (count)",
                    "short",
                    [q("sum by (state) (model_profile:nodeward_gpus:max)", "{{state}}")],
                    kind="stacked",
                    description="free, used, quarantined, cordoned, in maintenance, unhealthy.",
                ),
                Panel(
                    "GPUs in use (% of all)",
                    "percentunit",
                    [
                        q(
                            'sum(model_profile:nodeward_gpus:max{state="used"})'
                            " / sum(model_profile:nodeward_gpus:max)"
                        )
                    ],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "GPUs out of service (count)",
                    "short",
                    [
                        q(
                            "sum(model_profile:nodeward_gpus:max"
                            '{state=~"quarantined|cordoned|maintenance|unhealthy"})'
                        )
                    ],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "GPU utilisation by model (%)",
                    "percentunit",
                    [q("model:nodeward_gpu_utilization_ratio:avg", "{{model}}")],
                    description="The GPU agents' NVML/AMD SMI reading, joined to each GPU's "
                    "model through nodeward_gpu_info.",
                ),
                Panel(
                    "GPUs requested by namespace (count, kube-state-metrics)",
                    "short",
                    [
                        q(
                            "sum by (namespace) (kube_pod_container_resource_requests"
                            '{resource=~"nvidia_com_gpu|amd_com_gpu"})',
                            "{{namespace}}",
                        )
                    ],
                    kind="stacked",
                    description="Requests as the scheduler sees them; empty without "
                    "kube-state-metrics.",
                ),
            ],
        ),
        Row(
            "Sessions",
            [
                Panel(
                    "Session pods by verdict (count)",
                    "short",
                    [q("cluster:nodeward_sessions:sum", "{{state}}")],
                    kind="stacked",
                ),
                Panel(
                    "Idle session pods now (count)",
                    "short",
                    [q('sum(cluster:nodeward_sessions:sum{state="idle"})')],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "Idle GPU-hours per hour, all teams",
                    "short",
                    [q("sum(namespace:nodeward_accounting_idle_gpu_hours:increase1h)")],
                    kind="stat",
                    width=6,
                ),
            ],
        ),
        Row(
            "Power",
            [
                Panel(
                    "Rack power against its cap (W)",
                    "watt",
                    [
                        q("rack:nodeward_node_power_watts:max", "{{rack}} busiest node"),
                        q("rack:nodeward_power_cap_watts:min", "{{rack}} cap per node"),
                    ],
                    description="A rack's cap is the limit each of its nodes is held to "
                    "(agents.energy.caps.racks).",
                ),
                Panel(
                    "Power per rack (W)",
                    "watt",
                    [q("rack:nodeward_node_power_watts:sum", "{{rack}}")],
                    kind="stacked",
                ),
                Panel(
                    "GPU power by model (W)",
                    "watt",
                    [q("model:nodeward_gpu_power_watts:sum", "{{model}}")],
                    kind="stacked",
                ),
                Panel(
                    "Fleet power now (W)",
                    "watt",
                    [q("cluster:nodeward_node_power_watts:sum")],
                    kind="stat",
                ),
            ],
        ),
    ],
)

SUSTAINABILITY = Dashboard(
    name="sustainability",
    title="nodeward / sustainability",
    description="Power, energy and CO2e over time, for the fleet and per team.",
    rows=[
        Row(
            "Fleet",
            [
                Panel("Fleet power (W)", "watt", [q("cluster:nodeward_node_power_watts:sum")]),
                Panel(
                    "Energy per hour (kWh)",
                    "kwatth",
                    [q("cluster:nodeward_energy_kwh:increase1h")],
                ),
                Panel(
                    "CO2e per hour (kg)",
                    "masskg",
                    [q("cluster:nodeward_co2e_grams:increase1h / 1000")],
                ),
                Panel(
                    "Carbon intensity of the energy used (g CO2e per kWh)",
                    "short",
                    [
                        q(
                            "cluster:nodeward_co2e_grams:increase1h"
                            " / (cluster:nodeward_energy_kwh:increase1h > 0)"
                        )
                    ],
                    description="CO2e over energy for the last hour: the grid's intensity as "
                    "the energy agents' carbon provider gave it.",
                ),
            ],
        ),
        Row(
            "Per team",
            [
                Panel(
                    "Energy per team per hour (kWh)",
                    "kwatth",
                    [q("namespace:nodeward_accounting_energy_kwh:increase1h", "{{namespace}}")],
                    kind="stacked",
                ),
                Panel(
                    "CO2e per team per hour (g)",
                    "massg",
                    [q("namespace:nodeward_accounting_co2e_grams:increase1h", "{{namespace}}")],
                    kind="stacked",
                ),
                Panel(
                    "Energy per team over the time range (kWh)",
                    "kwatth",
                    [
                        q(
                            "sort_desc(sum by (namespace) (increase("
                            "nodeward_accounting_energy_joules_total[$__range])) / 3.6e6)",
                            "{{namespace}}",
                        )
                    ],
                    kind="bars",
                ),
                Panel(
                    "Power per team (W)",
                    "watt",
                    [q("namespace:nodeward_pod_power_watts:rate5m", "{{namespace}}")],
                    kind="stacked",
                ),
            ],
        ),
        Row(
            "Coverage",
            [
                Panel(
                    "Energy per node per hour (kWh)",
                    "kwatth",
                    [q("node:nodeward_energy_kwh:increase1h", "{{node}}")],
                ),
                Panel(
                    "Node time without energy readings (s per hour)",
                    "s",
                    [
                        q(
                            "sum by (node) (increase("
                            "nodeward_accounting_uncovered_seconds_total[1h]))",
                            "{{node}}",
                        )
                    ],
                    description="Time the energy agents could not measure: charged as "
                    "nothing, so a gap here under-charges every team on the node.",
                ),
                Panel(
                    "Pods' power as Kepler estimates it (W, Kepler)",
                    "watt",
                    [
                        q(
                            "sum by (container_namespace) "
                            "(rate(kepler_container_joules_total[$__rate_interval]))",
                            "{{container_namespace}}",
                        )
                    ],
                    description="For comparison where Kepler runs; empty without it.",
                ),
            ],
        ),
    ],
)

OPERATIONS = Dashboard(
    name="operations",
    title="nodeward / operations",
    description="What nodeward did and whether it is healthy: faults, quarantines, refusals by "
    "guard, the breaker, dead letters, consumer lag and recovery steps.",
    rows=[
        Row(
            "Faults",
            [
                Panel(
                    "Failed GPUs now (count)",
                    "short",
                    [q("cluster:nodeward_gpus_failed:count")],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "Circuit breaker open (1 open)",
                    "short",
                    [q("max(job:nodeward_breaker_tripped:max)")],
                    kind="stat",
                    width=6,
                ),
                Panel(
                    "Worst GPU health per node (0 healthy, 1 degraded, 2 failed, 3 unknown)",
                    "short",
                    [q("node:nodeward_gpu_health_state:max", "{{node}}")],
                ),
                Panel(
                    "XIDs in the last hour (count)",
                    "short",
                    [
                        q(
                            "sum by (node, xid) ("
                            "(nodeward_gpu_xid_events_total"
                            " unless nodeward_gpu_xid_events_total offset 1h)"
                            " and on (job, instance) (up offset 1h)"
                            " or increase(nodeward_gpu_xid_events_total[1h]))",
                            "{{node}} XID {{xid}}",
                        )
                    ],
                    description="A GPU's XID counter is born with its first XID, which "
                    "increase() cannot see: a series born within the hour counts whole.",
                ),
            ],
        ),
        Row(
            "Actions",
            [
                Panel(
                    "Actions per 5 minutes (count)",
                    "short",
                    [
                        q(
                            "job:nodeward_remediations:increase5m",
                            "{{job}} {{action}} {{outcome}}",
                        )
                    ],
                    description="Quarantines, releases, culls, renewals, ... by outcome.",
                ),
                Panel(
                    "Actions a guard refused or skipped per 5 minutes (count)",
                    "short",
                    [
                        q(
                            "sum by (guard, outcome) (job:nodeward_remediations_guarded:increase5m)",
                            "{{guard}} ({{outcome}})",
                        )
                    ],
                ),
                Panel(
                    "Recovery steps per 5 minutes (count)",
                    "short",
                    [
                        q(
                            'job:nodeward_remediations:increase5m{job="recovery"}',
                            "{{action}} {{outcome}}",
                        )
                    ],
                ),
                Panel(
                    "Pods admitted by the webhook per 5 minutes (count)",
                    "short",
                    [
                        q(
                            "sum by (kind) (increase(nodeward_admission_mutations_total[5m]))",
                            "{{kind}}",
                        )
                    ],
                ),
            ],
        ),
        Row(
            "Bus",
            [
                Panel(
                    "Dead-lettered events per 15 minutes (count)",
                    "short",
                    [
                        q(
                            "consumer:nodeward_events_dead_lettered:increase15m",
                            "{{consumer}} {{reason}}",
                        )
                    ],
                ),
                Panel(
                    "Consumer lag (messages)",
                    "short",
                    [q("consumer:nodeward_consumer_pending:max", "{{consumer}}")],
                    description="Not yet delivered plus delivered and not acknowledged.",
                ),
                Panel(
                    "Handler latency, 99th percentile (s)",
                    "s",
                    [q("consumer:nodeward_handler_seconds:p99_5m", "{{consumer}}")],
                ),
                Panel(
                    "Agents connected to NATS (count)",
                    "short",
                    [
                        q(
                            'sum by (container) (nodeward_bus_connected{job="agent"})',
                            "{{container}}",
                        )
                    ],
                ),
                Panel(
                    "Notifications failed per 15 minutes (count)",
                    "short",
                    [
                        q(
                            "sum by (channel) (increase(nodeward_notifications_failed_total[15m]))",
                            "{{channel}}",
                        )
                    ],
                ),
                Panel(
                    "Idle reports per hour (count)",
                    "short",
                    [
                        q(
                            "sum(increase(nodeward_session_idle_reports_total[1h]))",
                            "session.idle events",
                        )
                    ],
                    description="The idle agents' evidence that a session is idle, which the "
                    "culler acts on.",
                ),
            ],
        ),
    ],
)

DASHBOARDS = (USER, CLUSTER, SUSTAINABILITY, OPERATIONS)


def _target(i: int, query: Query, instant: bool) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
    if query.legend:
        t = t.legend_format(query.legend)
    return t.instant() if instant else t.range()


def _panel(p: Panel, panel_id: int) -> Any:
    builder: Any
    if p.kind in ("timeseries", "stacked"):
        builder = (
            timeseries.Panel().line_width(1).fill_opacity(10 if p.kind == "timeseries" else 60)
        )
        if p.kind == "stacked":
            builder = builder.stacking(common.StackingConfig().mode(models.StackingMode.NORMAL))
        builder = builder.legend(
            common.VizLegendOptions()
            .display_mode(models.LegendDisplayMode.LIST)
            .placement(models.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        instant = False
    elif p.kind == "stat":
        builder = stat.Panel().graph_mode(models.BigValueGraphMode.AREA)
        instant = False
    else:
        builder = bargauge.Panel().orientation(models.VizOrientation.HORIZONTAL)
        instant = True
    builder = (
        builder.id(panel_id)
        .title(p.title)
        .unit(p.unit)
        .datasource(DATASOURCE)
        .height(8 if p.kind != "stat" else 5)
        .span(p.width)
    )
    if p.description:
        builder = builder.description(p.description)
    for i, query in enumerate(p.queries):
        builder = builder.with_target(_target(i, query, instant))
    return builder


def build(spec: Dashboard) -> Any:
    """The dashboard's Grafana model (grafana-foundation-sdk)."""
    d = (
        dashboard.Dashboard(spec.title)
        .uid(f"nodeward-{spec.name}")
        .description(spec.description)
        .tags(["nodeward", *spec.tags])
        .editable()
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
    )
    if spec.namespace_variable:
        d = d.with_variable(
            dashboard.QueryVariable("namespace")
            .label("Namespace")
            .datasource(DATASOURCE)
            .query("label_values(namespace:nodeward_accounting_gpu_hours:increase1h, namespace)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(False)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
    ids = iter(range(1, 1000))
    for row in spec.rows:
        d = d.with_row(dashboard.Row(row.title).id(next(ids)))
        for panel in row.panels:
            d = d.with_panel(_panel(panel, next(ids)))
    return d.build()
