"""`nodeward report --by group|experiment`: usage charged by the namespaces' directory
labels (NamespaceOwner), namespaces without one under (unknown)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.directory import EXPERIMENT, GROUP, OWNER, NamespaceOwner
from services.accounting.report import UNKNOWN, Window, build, to_csv
from services.accounting.state import IdlePeriod, UsageCell

HOUR = datetime(2026, 12, 1, 10, tzinfo=UTC)
WINDOW = Window.of(HOUR, HOUR + timedelta(hours=1))

OWNERS = {
    "user-alice": NamespaceOwner.of({OWNER: "alice", GROUP: "physics", EXPERIMENT: "atlas"}, {}),
    "user-grace": NamespaceOwner.of({OWNER: "grace", GROUP: "physics", EXPERIMENT: "cms"}, {}),
    "user-carol": NamespaceOwner.of({OWNER: "carol", GROUP: "computing"}, {}),
}


def cell(namespace: str, kwh: float, gpu_h: float, co2e_g: float = 0.0) -> UsageCell:
    return UsageCell(
        hour=HOUR,
        node="gpu-1",
        namespace=namespace,
        pod=f"{namespace}-0",
        owner=namespace.removeprefix("user-"),
        energy_j=kwh * 3_600_000,
        gpu_energy_j=kwh * 3_600_000,
        co2e_g=co2e_g,
        carbon_energy_j=kwh * 3_600_000 if co2e_g else 0.0,
        gpu_s=gpu_h * 3600,
    )


CELLS = [
    cell("user-alice", 2.0, 4.0, co2e_g=400),
    cell("user-grace", 1.0, 2.0, co2e_g=100),
    cell("user-carol", 0.5, 1.0),
    cell("user-dave", 0.25, 0.5),  # the directory has not labelled it
    cell("gone", 0.125, 0.25),  # deleted since: no labels to read
]


def by_key(by: str) -> dict[str, dict[str, object]]:
    rows = build(by, WINDOW, CELLS, [], [], owners=OWNERS, now=HOUR)  # type: ignore[arg-type]
    return {r.key: r.columns() for r in rows}


def test_by_group_sums_the_namespaces_of_each_group() -> None:
    rows = by_key("group")
    assert set(rows) == {"physics", "computing", UNKNOWN}
    assert rows["physics"]["energy_kwh"] == 3.0
    assert rows["physics"]["gpu_hours"] == 6.0
    assert rows["physics"]["co2e_kg"] == 0.5
    assert rows["physics"]["pods"] == 2
    assert rows["computing"]["energy_kwh"] == 0.5
    assert rows[UNKNOWN]["energy_kwh"] == 0.375 and rows[UNKNOWN]["pods"] == 2


def test_by_experiment_and_a_group_without_one_is_unknown() -> None:
    rows = by_key("experiment")
    assert set(rows) == {"atlas", "cms", UNKNOWN}
    assert rows["atlas"]["gpu_hours"] == 4.0 and rows["cms"]["gpu_hours"] == 2.0
    # carol's namespace has a group but no experiment label.
    assert rows[UNKNOWN]["energy_kwh"] == 0.875


def test_idle_gpu_time_is_charged_the_same_way() -> None:
    period = IdlePeriod(
        node="gpu-1",
        namespace="user-carol",
        pod="user-carol-0",
        owner="carol",
        idle_since=HOUR,
        idle_for_s=1800,
        gpus_held=2,
    )
    rows = build("group", WINDOW, CELLS, [], [period], owners=OWNERS, now=HOUR)
    computing = next(r for r in rows if r.key == "computing")
    assert computing.columns()["idle_gpu_hours"] == 1.0


def test_no_directory_labels_at_all_is_one_unknown_row_and_csv_names_the_column() -> None:
    rows = build("group", WINDOW, CELLS, [], [], now=HOUR)
    assert [r.key for r in rows] == [UNKNOWN]
    assert to_csv("group", rows).splitlines()[0].startswith("group,energy_kwh,")
