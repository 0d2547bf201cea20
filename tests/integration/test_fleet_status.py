"""`gather_status` and `nodeward status` against a real JetStream: KV records as each service
writes them, last events, DLQ counts, the audit trail; per node maintenance, marks,
isolated pods, energy, idle sessions and agent liveness; `--json` and `--node`."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.bus.server import EmbeddedNats
from nodeward.cli.common import bucket_name
from nodeward.cli.status import render
from nodeward.config import BusSettings
from nodeward.durations import format_age
from nodeward.fleet_status import gather_status
from nodeward.kube.nodes import taints_of
from nodeward.views import registered
from schemas import example_event, make_event
from schemas.common import ObjectRef
from schemas.credentials import CredentialFailed, CredentialKind, CredentialRenewed
from schemas.energy import (
    CarbonBasis,
    CarbonIntensity,
    EnergyNode,
    EnergyReading,
    Interval,
    PowerSource,
)
from schemas.gpu import (
    GpuHealth,
    GpuHeartbeat,
    GpuState,
    GpuTelemetry,
    HealthState,
    MigInstance,
)
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome, Remediation
from schemas.state.breaker import BreakerState
from schemas.state.cordon import NODES, TAINT_KEY, NodeRecord, Quarantine
from schemas.state.lease import LeaseRecord
from schemas.state.marks import MarkEntry, MarkIntent, MarkSpec, intents
from services.credentials.state import LOCKS
from services.culler.state import SESSIONS, SessionRecord
from services.maintenance.state import MAINTENANCES, MaintenanceState, PodPlan
from tests.conftest import wait_for
from tests.e2e.test_cli import run
from tests.helpers.records import node_action
from tests.integration.cordon_fixtures import EnvFactory, failed


def _health(node: str, index: int, state: HealthState, heartbeat: bool = False) -> GpuHealth:
    return GpuHealth(
        node=node,
        gpu_index=index,
        gpu_uuid=f"GPU-{node}-{index}",
        state=state,
        heartbeat=heartbeat,
        observed_at=datetime.now(UTC),
    )


async def test_status_reads_kv_streams_dlq_and_audit(own_bus: Bus, own_nats: EmbeddedNats) -> None:
    kv = await own_bus.kv(NODES.name)
    now = datetime.now(UTC)
    await TypedKV(kv, NODES.record).put(
        NODES.key("gpu-a"),
        NodeRecord(
            quarantine=Quarantine(
                incident="inc-1",
                rule="xid-node-action",
                reason="GPU 1 failed: XID 79",
                gpus=["1"],
                started_at=now - timedelta(seconds=30),
                cordoned=True,
                taints=["NoSchedule"],
            )
        ),
    )
    breaker = await own_bus.kv("breaker")  # shared by every service that removes nodes
    await TypedKV(breaker, BreakerState).put("breaker", BreakerState(admitted={"Node/gpu-a": 1.0}))
    for event_data in (
        _health("gpu-a", 0, HealthState.HEALTHY),
        _health("gpu-a", 1, HealthState.HEALTHY),
        _health("gpu-a", 1, HealthState.FAILED),  # the newest on its subject wins
        _health("gpu-b", 0, HealthState.HEALTHY, heartbeat=True),
    ):
        await own_bus.publish(make_event(event_data, source="test/status"))
    for i in range(3):
        await own_bus.publish(
            make_event(
                node_action("quarantine", f"gpu-{i}", f"action {i}"),
                source="service/cordon",
            )
        )
    for _ in range(2):
        await own_bus.publish(example_event("dlq.v1"))  # dlq.GPU.cordon

    fleet = await gather_status(own_bus.nc, nats_url=own_nats.url, actions=2)

    nodes = {n.name: n for n in fleet.nodes}
    assert set(nodes) == {"gpu-a", "gpu-b"}
    assert nodes["gpu-a"].gpus == {"0": "healthy", "1": "failed"}
    assert nodes["gpu-a"].health == "failed" and nodes["gpu-a"].agent_live
    q = nodes["gpu-a"].quarantine
    assert q is not None and q.reason == "GPU 1 failed: XID 79" and 29 <= q.age_s < 60
    assert nodes["gpu-b"].quarantine is None and nodes["gpu-b"].health == "healthy"
    assert fleet.breaker.admitted == 1 and not fleet.breaker.open
    assert fleet.dlq == {"dlq.GPU.cordon": 2}
    assert [a.reason for a in fleet.recent_actions] == ["action 2", "action 1"]  # newest first
    assert fleet.missing == []


async def test_status_shows_the_quarantine_the_cordon_service_wrote(
    cordon_env: EnvFactory, nats_url: str
) -> None:
    """The real service quarantines a node; status, reading the bucket the service is
    configured with through the same declaration, shows what the service recorded and
    what the node carries."""
    env = await cordon_env()
    await env.start()
    name = env.nodes[0]
    await env.publish(failed(name))
    bucket = bucket_name(env.settings, "cordon", NODES)
    assert bucket == env.settings.services["cordon"]["bucket"] != NODES.name
    kv = await env.bus.kv(bucket)

    async def applied() -> NodeRecord | None:
        found = await TypedKV(kv, NODES.record).get(NODES.key(name))
        q = found.value.quarantine if found else None
        return found.value if q is not None else None

    written = await wait_for(applied, timeout=10, what="the service's quarantine record")
    assert written.quarantine is not None
    assert env.settings.services["cordon"]["breaker"]["bucket"]  # this test's own window
    # The views as the services are configured: the cordon service's bucket and breaker.
    fleet = await gather_status(env.bus.nc, nats_url=nats_url, views=registered(env.settings))
    shown = next(n for n in fleet.nodes if n.name == name)
    q = shown.quarantine
    assert q is not None
    assert (q.reason, q.rule, q.gpus, q.phase, q.cordoned, q.taints) == (
        written.quarantine.reason,
        written.quarantine.rule,
        written.quarantine.gpus,
        "applied",
        True,
        ["NoSchedule"],
    )
    node = await env.node(name)
    assert node["spec"].get("unschedulable") is True
    assert [t["effect"] for t in taints_of(node) if t["key"] == TAINT_KEY] == q.taints
    assert shown.health == "failed" and fleet.breaker.admitted == 1


# -- everything per node: maintenance, marks, isolations, energy, sessions, agents -------

MID = "m-0001"


def _energy(node: str, watts: float, co2e_g: float) -> EnergyNode:
    end = datetime.now(UTC)
    return EnergyNode(
        node=node,
        interval=Interval(start=end - timedelta(seconds=60), end=end),
        readings=[
            EnergyReading(
                source=PowerSource.IPMI_SDR,
                component="system",
                energy_j=watts * 60,
                avg_power_w=watts,
            )
        ],
        energy_j=watts * 60,
        avg_power_w=watts,
        carbon=CarbonIntensity(
            g_per_kwh=50,
            zone="CH",
            provider="static",
            basis=CarbonBasis.LIFECYCLE,
            observed_at=end,
        ),
        co2e_g=co2e_g,
        energy_total_j=7.2e6,
        co2e_total_g=100.0,
    )


def _isolation(pod: str, node: str, outcome: Outcome, action: str = "isolate") -> Remediation:
    ns, name = pod.split("/")
    return Remediation(
        action=action,
        target=ObjectRef(kind="Pod", namespace=ns, name=name),
        outcome=outcome,
        reason="Falco Critical 'Terminal shell in container'",
        policy="critical-isolate",
        actor="service/falco",
        details={"falco_rule": "Terminal shell in container", "hostname": node},
    )


def _maintenance(node: str, phase: MaintenancePhase, now: datetime) -> MaintenanceState:
    return MaintenanceState(
        maintenance_id=MID,
        node=node,
        phase=phase,
        reason="firmware update",
        requested_by="alice",
        requested_at=now - timedelta(minutes=5),
        trigger_id="t-1",
        start_at=now - timedelta(minutes=4),
        started_at=now - timedelta(minutes=4),
        deadline_s=600,
        cordoned=True,
        pods={
            "team-a/train-0": PodPlan(
                namespace="team-a", name="train-0", opted_in=True, status="checkpointed"
            )
        },
    )


def _held(node: str) -> MarkIntent:
    """The maintenance owner's NodeMarks intent once its cordon is applied."""
    return MarkIntent(
        owner="maintenance",
        node=node,
        incident=MID,
        phase="applied",
        spec=MarkSpec(cordon=True),
        entry=MarkEntry(incident=MID, cordon=True),
    )


async def _seed_fleet(bus: Bus) -> datetime:
    """gpu-m in maintenance (draining), gpu-d drained and still cordoned (done), gpu-i with
    a pod isolated by Falco (and one whose isolation was undone), gpu-e reporting energy,
    gpu-s with a warned idle session; every node's GPUs healthy."""
    now = datetime.now(UTC)
    checkpoint = await bus.kv(MAINTENANCES.name)
    states = TypedKV(checkpoint, MaintenanceState)
    await states.put(
        MAINTENANCES.key("gpu-m"), _maintenance("gpu-m", MaintenancePhase.DRAINING, now)
    )
    await states.put(MAINTENANCES.key("gpu-d"), _maintenance("gpu-d", MaintenancePhase.DONE, now))
    marks = TypedKV(checkpoint, MarkIntent)
    for node in ("gpu-m", "gpu-d"):
        await marks.put(intents(MAINTENANCES.name).key(node), _held(node))
    culler = TypedKV(await bus.kv(SESSIONS.name), SessionRecord)
    await culler.put(
        SESSIONS.key("user-carol", "carol-jupyter"),
        SessionRecord(
            node="gpu-s",
            reason="idle",
            idle_since=now - timedelta(hours=2),
            warned_at=now - timedelta(minutes=1),
            deadline=now + timedelta(minutes=59),
        ),
    )
    events: list[Any] = [
        _health(n, 0, HealthState.HEALTHY) for n in ("gpu-m", "gpu-d", "gpu-i", "gpu-e", "gpu-s")
    ]
    events += [
        _isolation("team-b/web-0", "gpu-i", Outcome.APPLIED),
        _isolation("team-b/web-1", "gpu-i", Outcome.APPLIED),
        _isolation("team-b/web-1", "gpu-i", Outcome.APPLIED, action="release"),
        _energy("gpu-e", 3850.0, 1.3475),
    ]
    await bus.publish_many([make_event(e, source="test/status") for e in events])
    return now


async def test_status_shows_maintenance_isolations_energy_and_sessions_per_node(
    own_bus: Bus, own_nats: EmbeddedNats
) -> None:
    now = await _seed_fleet(own_bus)

    fleet = await gather_status(own_bus.nc, nats_url=own_nats.url)

    nodes = {n.name: n for n in fleet.nodes}
    assert set(nodes) == {"gpu-m", "gpu-d", "gpu-i", "gpu-e", "gpu-s"}
    assert all(n.health == "healthy" for n in nodes.values())
    m = nodes["gpu-m"]
    assert m.maintenance is not None and m.maintenance.phase == "draining"
    assert m.maintenance.active and m.maintenance.pods == {"team-a/train-0": "checkpointed"}
    assert m.maintenance.deadline_at == now - timedelta(minutes=4) + timedelta(seconds=600)
    assert "maintenance draining" in m.attention and m.cordoned
    # Drained and done, but still cordoned by nodeward: never just "healthy".
    d = nodes["gpu-d"]
    assert d.maintenance is not None and not d.maintenance.active
    assert d.attention == ["cordoned by maintenance (applied)"]
    i = nodes["gpu-i"]
    assert [p.pod for p in i.isolated] == ["team-b/web-0"]  # web-1's isolation was lifted
    assert i.isolated[0].rule == "Terminal shell in container" and i.rank == 0
    e = nodes["gpu-e"].energy
    assert e is not None and (e.avg_power_w, e.co2e_g, e.g_per_kwh) == (3850.0, 1.3475, 50)
    assert e.interval_s == 60 and e.energy_total_j == 7.2e6
    assert nodes["gpu-e"].agents["energy"].state == "live"
    assert nodes["gpu-e"].attention == []
    s = nodes["gpu-s"]
    assert [(v.pod, v.state) for v in s.sessions] == [("user-carol/carol-jupyter", "warned")]
    assert s.sessions[0].deadline == now + timedelta(minutes=59)
    assert s.attention == ["1 idle session(s) warned"]
    assert [n.name for n in fleet.needing_attention()] == ["gpu-i", "gpu-d", "gpu-m", "gpu-s"]

    console = Console(width=220, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "maintenance draining, cordoned" in text
    assert "cordoned by maintenance (maintenance done)" in text
    assert "│ team-b/web-0 │ gpu-i" in text and "│ team-b/web-1 │" not in text
    assert "3.85 kW 1.35 gCO2e" in text
    assert "user-carol/carol-jupyter" in text
    assert f"{(now + timedelta(minutes=59)):%H:%M:%S} (in 58m" in text


async def test_an_agent_that_stops_publishing_shows_stale(
    own_bus: Bus, own_nats: EmbeddedNats
) -> None:
    """gpu-x's agents publish once and stop; gpu-y's keep publishing: with a 1 s timeout
    gpu-x's GPU and energy agents show stale and gpu-y's live."""

    async def publish(node: str) -> None:
        await own_bus.publish_many(
            [
                make_event(_health(node, 0, HealthState.HEALTHY, heartbeat=True), source="t"),
                make_event(_energy(node, 500.0, 0.4), source="t"),
            ]
        )

    await publish("gpu-x")

    async def shown() -> dict[str, Any] | None:
        await publish("gpu-y")
        fleet = await gather_status(
            own_bus.nc, nats_url=own_nats.url, agent_timeout=timedelta(seconds=1)
        )
        nodes = {n.name: n for n in fleet.nodes}
        x, y = nodes["gpu-x"], nodes["gpu-y"]
        stale = {k for k, a in x.agents.items() if a.state == "stale"}
        live = {k for k, a in y.agents.items() if a.state == "live"}
        return {"x": x, "y": y} if stale == live == {"gpu", "energy"} else None

    got = await wait_for(shown, timeout=15, interval=0.2, what="gpu-x's agents stale")
    x = got["x"]
    assert not x.agent_live and x.agents["idle"].state == "never"
    assert x.attention[:2] == [
        f"gpu agent silent {format_age(x.agents['gpu'].age_s or 0)}",
        f"energy agent silent {format_age(x.agents['energy'].age_s or 0)}",
    ]
    assert got["y"].attention == []


async def test_the_cli_json_carries_everything_and_node_shows_one(
    own_bus: Bus, own_nats: EmbeddedNats
) -> None:
    await _seed_fleet(own_bus)
    url = own_nats.url

    got = await asyncio.to_thread(run, "status", "--json", "--nats", url)
    assert got.returncode == 0, got.stderr
    fleet = json.loads(got.stdout)
    nodes = {n["name"]: n for n in fleet["nodes"]}
    assert nodes["gpu-m"]["maintenance"]["phase"] == "draining"
    assert nodes["gpu-m"]["marks"][0]["owner"] == "maintenance"
    assert nodes["gpu-i"]["isolated"][0]["pod"] == "team-b/web-0"
    assert nodes["gpu-e"]["energy"]["avg_power_w"] == 3850.0
    assert nodes["gpu-e"]["energy"]["co2e_g"] == 1.3475
    assert nodes["gpu-s"]["sessions"][0]["deadline"] is not None
    assert set(nodes["gpu-e"]["agents"]) == {"gpu", "energy", "idle"}
    assert {"breaker", "dlq", "recent_actions", "rows"} <= set(fleet)

    detail = await asyncio.to_thread(run, "status", "--node", "gpu-m", "--nats", url)
    assert detail.returncode == 0, detail.stderr
    assert "node gpu-m: healthy" in detail.stdout
    assert "maintenance m-0001: draining" in detail.stdout
    assert "team-a/train-0: checkpointed" in detail.stdout

    isolated = await asyncio.to_thread(run, "status", "--node", "gpu-i", "--json", "--nats", url)
    report = json.loads(isolated.stdout)
    assert report["node"]["isolated"][0]["pod"] == "team-b/web-0"
    assert [a["target"] for a in report["recent_actions"]] == [
        "pod/team-b/web-1",
        "pod/team-b/web-1",
        "pod/team-b/web-0",
    ]

    bad = await asyncio.to_thread(run, "status", "--node", "Gpu_01", "--nats", url)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "not a Kubernetes name" in bad.stderr
    unknown = await asyncio.to_thread(run, "status", "--node", "gpu-zz", "--nats", url)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().splitlines() == [
        "nodeward: error: no node gpu-zz in what nodeward holds (GPU health, KV, energy, sessions)"
    ]


async def test_status_shows_credential_renewals_and_the_locks_held(
    own_bus: Bus, own_nats: EmbeddedNats
) -> None:
    """The newest outcome per credential from the CREDENTIALS stream, and a renewal in
    progress from the renewers' locks in KV (`services.credentials.state.LOCKS`)."""
    now = datetime.now(UTC)
    kind = CredentialKind.OAUTH2
    await own_bus.publish_many(
        [
            make_event(
                CredentialFailed(
                    namespace="user-a", secret="tok", kind=kind, error="401", retryable=True
                ),
                source="service/credentials",
                time=now - timedelta(minutes=5),
            ),
            make_event(
                CredentialRenewed(
                    namespace="user-a", secret="tok", kind=kind, expires_at=now + timedelta(hours=1)
                ),
                source="service/credentials",
                time=now,
            ),
            make_event(
                CredentialFailed(
                    namespace="user-b",
                    secret="krb",
                    kind=CredentialKind.KERBEROS,
                    error="ticket not renewable past its renew_till",
                    retryable=False,
                ),
                source="service/credentials",
            ),
        ]
    )
    locks = TypedKV(await own_bus.kv(LOCKS.name), LeaseRecord)
    await locks.put(
        LOCKS.key("user-c", "oauth-c"),
        LeaseRecord(holder="renewer-1", expires_at=now.timestamp() + 60, acquired_at=0),
    )
    await locks.put(
        LOCKS.key("user-d", "expired"),
        LeaseRecord(holder="renewer-2", expires_at=now.timestamp() - 60, acquired_at=0),
    )

    fleet = await gather_status(own_bus.nc, nats_url=own_nats.url)

    said = [(r.text, r.severity) for r in fleet.rows if r.section == "credentials"]
    # user-a/tok's newest outcome is its renewal; user-d's lock has expired.
    assert said[0] == ("1 renewed, 1 failed, 1 renewing now", "critical")
    assert len(said) == 2 and said[1][0].startswith("user-b/krb: failed ")
    assert said[1][1] == "critical" and said[1][0].endswith(
        "ticket not renewable past its renew_till"
    )
    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "credentials: 1 renewed, 1 failed, 1 renewing now" in text
    assert "user-b/krb: failed" in text and "renew_till" in text


def _beat(
    node: str, states: dict[int, tuple[HealthState, int]], *, boot: str, interval: float = 30
) -> GpuHeartbeat:
    return GpuHeartbeat(
        node=node,
        gpus=[
            GpuState(
                gpu_index=i,
                gpu_uuid=f"GPU-{node}-{i}",
                state=state,
                sequence=seq,
                changed_at=datetime.now(UTC),
            )
            for i, (state, seq) in states.items()
        ]
        + [
            GpuState(
                gpu_index=7,
                gpu_uuid=f"GPU-{node}-7",
                mig=MigInstance(gpu_instance_id=1, compute_instance_id=0, profile="1g.10gb"),
                state=HealthState.HEALTHY,
                sequence=1,
                changed_at=datetime.now(UTC),
            )
        ],
        interval_s=interval,
        observed_at=datetime.now(UTC),
        agent_boot_id=boot,
    )


def _change(node: str, index: int, state: HealthState, *, boot: str, seq: int) -> GpuHealth:
    return _health(node, index, state).model_copy(update={"agent_boot_id": boot, "sequence": seq})


async def test_gpu_states_come_from_each_nodes_heartbeat_and_the_changes_since(
    own_bus: Bus, own_nats: EmbeddedNats
) -> None:
    """gpu-h: its GPUs' start states, then a heartbeat (GPU 1 failed at change 2, which the
    stream no longer holds as its last change: the heartbeat says it), then GPU 0 fails
    (change 2, after the heartbeat). gpu-s: a heartbeat long past its interval, then a
    change: its last changes are read. gpu-n: no heartbeat at all. gpu-t: telemetry only."""
    h, s, n = "gpu-h", "gpu-s", "gpu-n"
    healthy, failed_ = HealthState.HEALTHY, HealthState.FAILED
    await own_bus.publish_many(
        [
            make_event(_change(h, 0, healthy, boot="b1", seq=1), source="t"),
            make_event(_change(h, 1, healthy, boot="b1", seq=1), source="t"),
            make_event(_beat(s, {0: (healthy, 1)}, boot="s1", interval=0.001), source="t"),
            make_event(_change(n, 0, failed_, boot="n1", seq=3), source="t"),
            make_event(GpuTelemetry.example().model_copy(update={"node": "gpu-t"}), source="t"),
        ]
    )
    # The heartbeat is stored after the start states, as a running fleet's are.
    await asyncio.sleep(1.5)  # store times apart by more than CLOCK_SLACK, not a sync
    await own_bus.publish_many(
        [make_event(_beat(h, {0: (healthy, 1), 1: (failed_, 2)}, boot="b1"), source="t")]
    )
    await own_bus.publish_many(
        [
            make_event(_change(h, 0, failed_, boot="b1", seq=2), source="t"),
            make_event(_change(s, 0, failed_, boot="s1", seq=2), source="t"),
        ]
    )
    fleet = await gather_status(own_bus.nc, nats_url=own_nats.url)
    nodes = {x.name: x for x in fleet.nodes}
    assert nodes[h].gpus == {"0": "failed", "1": "failed", "7-mig1-0": "healthy"}
    assert nodes[h].agent_live and nodes[h].health == "failed"
    assert nodes[s].gpus == {"0": "failed", "7-mig1-0": "healthy"}
    assert nodes[n].gpus == {"0": "failed"}
    # A node without a heartbeat is alive by its telemetry (read for such nodes only).
    assert nodes["gpu-t"].agents["gpu"].state == "live" and nodes["gpu-t"].health == "unknown"
    assert nodes[h].agent_seen_at is not None and nodes[s].agents["gpu"].state == "live"
    assert "stream GPU" not in fleet.missing


async def test_gpu_states_from_heartbeats_of_a_partitioned_stream(own_nats: EmbeddedNats) -> None:
    """With `bus.partitions` > 1 the streams store each subject with its partition appended:
    status still reads each node's heartbeat (and the changes since) from them."""
    bus = await Bus.connect(BusSettings(url=own_nats.url, partitions=4), source="test/status")
    try:
        healthy, failed_ = HealthState.HEALTHY, HealthState.FAILED
        await bus.publish_many(
            [
                make_event(
                    _beat(f"gpu-{i}", {0: (healthy, 1), 1: (failed_, 2)}, boot="b"), source="t"
                )
                for i in range(6)
            ]
        )
        await bus.publish_many(
            [make_event(_change("gpu-0", 0, failed_, boot="b", seq=3), source="t")]
        )
        stored = await bus.js.stream_info("HEARTBEATS", subjects_filter=">")
        assert stored.state.subjects and all(
            len(subject.split(".")) == 4 for subject in stored.state.subjects
        )  # partitioned: gpu.heartbeat.<node>.<p>
        fleet = await gather_status(bus.nc, nats_url=own_nats.url)
        nodes = {x.name: x for x in fleet.nodes}
        assert nodes["gpu-0"].gpus == {"0": "failed", "1": "failed", "7-mig1-0": "healthy"}
        assert all(nodes[f"gpu-{i}"].gpus["1"] == "failed" for i in range(1, 6))
        assert all(nodes[f"gpu-{i}"].agent_live for i in range(6))
    finally:
        await bus.close(grace=2)
