"""Adding one event to a rollup: pure functions, each returning the new record, or None when
the event is already counted in it (a redelivery, a replay after a restart)."""

from __future__ import annotations

from datetime import datetime

from schemas.energy import CarbonIntensity, EnergyNode, EnergyPod
from schemas.session import SessionIdle
from services.accounting.state import HOUR, IdlePeriod, NodeHour, UsageCell, hour_of


def carbon_label(carbon: CarbonIntensity) -> str:
    return f"{carbon.provider}/{carbon.basis.value}/{carbon.zone}"


def midpoint(start: datetime, end: datetime) -> datetime:
    return start + (end - start) / 2


def add_pod_energy(cell: UsageCell, event_id: str, data: EnergyPod) -> UsageCell | None:
    """The pod's interval into its hour (the hour of the interval's midpoint), with its GPUs'
    measured utilisation where it says it."""
    if cell.has(event_id):
        return None
    seconds = (data.interval.end - data.interval.start).total_seconds()
    update: dict[str, object] = {
        "counted": [*cell.counted, event_id],
        "energy_j": cell.energy_j + data.energy_j,
        "cpu_energy_j": cell.cpu_energy_j + data.cpu_energy_j,
        "gpu_energy_j": cell.gpu_energy_j + data.gpu_energy_j,
    }
    if data.gpus is None:
        update["gpu_unknown_j"] = cell.gpu_unknown_j + data.energy_j
    else:
        update["gpu_s"] = cell.gpu_s + data.gpus * seconds
        if data.gpu_utilization_pct is not None and data.gpus > 0:
            measured = data.gpus * seconds
            update["gpu_util_s"] = cell.gpu_util_s + measured
            update["gpu_busy_s"] = cell.gpu_busy_s + measured * data.gpu_utilization_pct / 100
    if data.carbon is not None and data.co2e_g is not None:
        update["co2e_g"] = cell.co2e_g + data.co2e_g
        update["carbon_energy_j"] = cell.carbon_energy_j + data.energy_j
        label = carbon_label(data.carbon)
        if label not in cell.carbon:
            update["carbon"] = [*cell.carbon, label]
    return cell.model_copy(update=update)


def add_utilisation(cell: UsageCell, event_id: str, pct: float) -> UsageCell | None:
    if cell.has(event_id):
        return None
    return cell.model_copy(
        update={
            "counted": [*cell.counted, event_id],
            "util_sum": cell.util_sum + pct,
            "util_samples": cell.util_samples + 1,
        }
    )


def add_session_action(cell: UsageCell, event_id: str, action: str) -> UsageCell | None:
    """A culler's applied `warn` or `stop`."""
    if cell.has(event_id):
        return None
    field = "warned" if action == "warn" else "stopped"
    return cell.model_copy(
        update={"counted": [*cell.counted, event_id], field: getattr(cell, field) + 1}
    )


def node_hours(data: EnergyNode) -> list[tuple[datetime, float, float]]:
    """The node interval split over the hours it spans: (hour, seconds, covered seconds)."""
    start, end = data.interval.start, data.interval.end
    total = (end - start).total_seconds()
    covered = data.covered_s if data.energy_j is not None else 0.0
    covered = min(covered if covered is not None else total, total)
    out = []
    hour = hour_of(start)
    while hour < end:
        lo, hi = max(start, hour), min(end, hour + HOUR)
        seconds = (hi - lo).total_seconds()
        if seconds > 0:
            out.append((hour, seconds, covered * seconds / total))
        hour += HOUR
    return out


def add_node_interval(
    record: NodeHour | None,
    event_id: str,
    data: EnergyNode,
    *,
    hour: datetime,
    seconds: float,
    covered_s: float,
    model: str | None,
) -> NodeHour | None:
    """One hour's part of a node's interval."""
    if record is not None and record.has(event_id):
        return None
    start = max(data.interval.start, hour)
    end = min(data.interval.end, hour + HOUR)
    share = seconds / max((data.interval.end - data.interval.start).total_seconds(), 1e-9)
    energy = (data.energy_j or 0.0) * share
    with_carbon = data.energy_j is not None and data.co2e_g is not None
    co2e = (data.co2e_g or 0.0) * share if with_carbon else 0.0
    carbon_energy = energy if with_carbon else 0.0
    if record is None:  # the hour's first: counted from nothing
        record = NodeHour(hour=hour, node=data.node, first_start=start, last_end=end)
    return record.model_copy(
        update={
            "counted": [*record.counted, event_id],
            "model": record.model or model,
            "first_start": min(record.first_start, start),
            "last_end": max(record.last_end, end),
            "interval_s": record.interval_s + seconds,
            "covered_s": record.covered_s + covered_s,
            "energy_j": record.energy_j + energy,
            "co2e_g": record.co2e_g + co2e,
            "carbon_energy_j": record.carbon_energy_j + carbon_energy,
        }
    )


IDLE_FIELDS = ("node", "namespace", "pod", "idle_since", "idle_for_s", "gpus_held")
"""What an idle period takes from its first `SessionIdle`."""


def extend_idle(
    record: IdlePeriod | None, data: SessionIdle, owner: str, model: str | None
) -> IdlePeriod | None:
    """The idle period with the longest idle time yet reported (idempotent: a maximum)."""
    if record is None:  # the session's and its idleness's fields, as the event says them
        return IdlePeriod(owner=owner, model=model, **data.model_dump(include=set(IDLE_FIELDS)))
    if data.idle_for_s <= record.idle_for_s and data.gpus_held <= record.gpus_held:
        return None
    return record.model_copy(
        update={
            "idle_for_s": max(record.idle_for_s, data.idle_for_s),
            "gpus_held": max(record.gpus_held, data.gpus_held),
        }
    )
