"""services.cordon against the sim cluster and a real NATS: what an operator would check.

Each test gets a fresh 10-node sim with unique node names, its own durable consumer and
KV bucket, so tests run in parallel against the session's nats-server.
"""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from nodeward.bus.kv import TypedKV
from nodeward.config import section
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.nodes import condition_of, taints_of
from schemas.cloudevents import encode
from schemas.gpu import HealthState
from schemas.notify import Severity
from schemas.remediation import Outcome
from schemas.state.cordon import TAINT_KEY
from services.cordon.marks import HEALTH_LABEL, QUARANTINE_ANNOTATION
from services.cordon.service import CordonSettings, reset_breaker
from services.kernel import BreakerState
from sim.cluster.seed import PdbSeed, PodSeed
from tests.conftest import wait_for
from tests.helpers.kube import daemonset_pod
from tests.integration.cordon_fixtures import (
    EnvFactory,
    audits,
    failed,
    health,
    notifications,
    read_stream,
)


def tainted(node: dict[str, Any]) -> bool:
    return any(
        t.get("key") == TAINT_KEY and t.get("effect") == "NoSchedule" for t in taints_of(node)
    )


def label(node: dict[str, Any]) -> str | None:
    return (node["metadata"].get("labels") or {}).get(HEALTH_LABEL)


def cordoned_failed(node: dict[str, Any]) -> bool:
    """Tainted (NoSchedule), cordoned, its GPUHealthy condition False and labelled failed."""
    cond = condition_of(node, "GPUHealthy")
    return bool(
        tainted(node)
        and node["spec"].get("unschedulable")
        and cond is not None
        and cond["status"] == "False"
        and label(node) == "failed"
    )


def quarantine_note(node: dict[str, Any]) -> dict[str, Any] | None:
    raw = (node["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION)
    return json.loads(raw) if raw else None


def outcomes(records: list[Any], action: str | None = None) -> list[tuple[str, str | None]]:
    return [(r.outcome.value, r.guard) for r in records if action is None or r.action == action]


async def test_failed_gpu_quarantines_node(cordon_env: EnvFactory) -> None:
    """Taint, cordon, condition, label, note, audit and notice, all of them.

    How fast is a figure (``bench/detect_to_quarantine.py``); here it is printed only.
    """
    env = await cordon_env()
    await env.start()
    name = env.nodes[0]
    event = failed(name)
    began = time.monotonic()
    await env.publish(event)

    async def quarantined() -> bool:
        node = await env.node(name)
        return cordoned_failed(node) and bool(quarantine_note(node))

    await wait_for(quarantined, timeout=20, what="taint, cordon, condition, label, annotation")
    applied = await wait_for(lambda: _applied(env.bus, name), timeout=20, what="audit")
    notes = await wait_for(lambda: notifications(env.bus, name), timeout=20, what="notification")
    print(f"quarantined, audited and told in {time.monotonic() - began:.2f}s")

    node = await env.node(name)
    cond = condition_of(node, "GPUHealthy")
    assert cond is not None and cond["reason"] == "GPUFailed" and "XID 79" in cond["message"]
    note = quarantine_note(node)
    assert note is not None
    assert note["by"] == "service/cordon"
    assert note["event_id"] == event.id
    assert note["gpus"] == ["0"]
    assert note["prior_unschedulable"] is False
    assert "XID 79" in note["reason"]
    events = await env.admin.client.request(
        "GET", "/apis/events.k8s.io/v1/namespaces/default/events"
    )
    mine = [
        e
        for e in events["items"]
        if e["regarding"]["name"] == name and e["reportingController"] == "nodeward"
    ]
    assert [e["reason"] for e in mine] == ["GPUQuarantined"]
    assert applied[0].trigger_event_id == event.id
    assert applied[0].policy == "gpu-lost" or applied[0].policy == "xid-node-action"
    assert notes[0].severity == Severity.CRITICAL
    assert notes[0].audit_event_id is not None


async def _applied(bus: Any, name: str) -> list[Any]:
    return [
        r
        for r in await audits(bus, name, "quarantine")
        if r.outcome == Outcome.APPLIED and r.guard is None
    ]


async def _released(bus: Any, name: str) -> list[Any]:
    return [r for r in await audits(bus, name, "release") if r.outcome == Outcome.APPLIED]


async def test_healthy_and_degraded_do_not_quarantine(cordon_env: EnvFactory) -> None:
    env = await cordon_env()
    await env.start()
    name = env.nodes[1]
    await env.publish(
        health(name, HealthState.DEGRADED, seq=1),
        health(name, HealthState.HEALTHY, seq=2),
        health(name, HealthState.DEGRADED, seq=3, gpu=1),
        # processed in order per node: once this stale one is audited, the rest were handled
        health(name, HealthState.HEALTHY, seq=1, gpu=1),
    )
    records = await wait_for(lambda: audits(env.bus, name), timeout=5, what="stale audit")
    assert outcomes(records) == [("skipped", "stale")]
    node = await env.node(name)
    assert not tainted(node)
    assert not node["spec"].get("unschedulable")
    assert label(node) == "healthy"
    assert quarantine_note(node) is None


async def test_breaker_refuses_beyond_30_percent_and_never_blocks_release(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env()
    daemon = await env.start()
    sick = env.nodes[:6]
    await env.publish(*(failed(n) for n in sick))

    async def decided() -> list[Any]:
        found = [r for n in sick for r in await audits(env.bus, n, "quarantine")]
        return found if len(found) >= 6 else []

    records = await wait_for(decided, timeout=5, what="6 decisions")
    assert (
        sorted(outcomes(records)) == [("applied", None)] * 3 + [("refused", "circuit_breaker")] * 3
    )
    nodes = [await env.node(n) for n in sick]
    quarantined = [n["metadata"]["name"] for n in nodes if tainted(n)]
    assert len(quarantined) == 3
    assert sum(bool(n["spec"].get("unschedulable")) for n in nodes) == 3
    refused = [n for n in sick if n not in quarantined]
    for n in refused:
        notes = await notifications(env.bus, n)
        assert [x.severity for x in notes] == [Severity.CRITICAL]
        assert "circuit_breaker" in notes[0].title

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{daemon.url}/metrics")).text
    assert "nodeward_breaker_tripped 1.0" in metrics
    assert (
        'nodeward_remediations_total{action="quarantine",guard="circuit_breaker",outcome="refused"} 3.0'
        in metrics
    )

    # While tripped, a recovered node is still released.
    back = quarantined[0]
    await env.publish(health(back, HealthState.HEALTHY, seq=2))

    await wait_for(
        lambda: _released(env.bus, back), timeout=5, what="release while the breaker is tripped"
    )
    assert not tainted(await env.node(back))
    assert not (await env.node(back))["spec"].get("unschedulable")

    # Reset through KV: the next failure of a refused node quarantines it.
    config = section(env.settings, "services", "cordon", CordonSettings)
    state = await TypedKV(await env.bus.kv(config.breaker.bucket), BreakerState).get("breaker")
    assert state is not None and state.value.tripped_at is not None
    await reset_breaker(env.bus, config)
    await env.publish(failed(refused[0], seq=2))

    async def requarantined() -> bool:
        return tainted(await env.node(refused[0]))

    await wait_for(requarantined, timeout=5, what="quarantine after reset")


async def test_exempt_node_is_left_alone(cordon_env: EnvFactory) -> None:
    env = await cordon_env(nodes={2: {"labels": {"nodeward.io/exempt": "true"}}})
    await env.start()
    name = env.nodes[2]
    await env.publish(failed(name))
    records = await wait_for(lambda: audits(env.bus, name), timeout=5, what="audit")
    assert outcomes(records) == [("skipped", "exempt")]
    assert records[0].trigger_event_id is not None
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert quarantine_note(node) is None
    notes = await wait_for(lambda: notifications(env.bus, name), timeout=2)
    assert notes[0].severity == Severity.INFO
    # Heartbeats restating the failure are not audited again; in order per node, so once
    # the (stale) barrier event is audited, the heartbeat was handled.
    await env.publish(
        health(name, HealthState.FAILED, seq=2, xid=79, heartbeat=True),
        health(name, HealthState.HEALTHY, seq=1),
    )

    async def barrier() -> list[Any]:
        found = await audits(env.bus, name)
        return found if len(found) >= 2 else []

    records = await wait_for(barrier, timeout=5, what="stale barrier audit")
    assert outcomes(records) == [("skipped", "exempt"), ("skipped", "stale")]


async def test_release_after_healthy_period_undoes_only_our_marks(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(healthy_period="1s")
    await env.start()
    name = env.nodes[3]
    await env.publish(failed(name))
    await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    healthy_at = datetime.now(UTC)
    await env.publish(health(name, HealthState.HEALTHY, seq=2, at=healthy_at))

    await wait_for(lambda: _released(env.bus, name), timeout=5, what="release")
    assert datetime.now(UTC) - healthy_at >= timedelta(seconds=1)
    node = await env.node(name)
    assert not tainted(node)
    assert not node["spec"].get("unschedulable")
    assert label(node) == "healthy"
    assert quarantine_note(node) is None
    cond = condition_of(node, "GPUHealthy")
    assert cond is not None and cond["status"] == "True"

    async def release_notice() -> list[Any]:
        return [n for n in await notifications(env.bus, name) if "release" in n.title]

    # A release is news for on-call, not a page; it ends the quarantine's incident, which
    # resolves the quarantine's alert in Alertmanager.
    notes = await wait_for(release_notice, timeout=2, what="release notification")
    assert [n.severity for n in notes] == [Severity.INFO]
    [quarantined] = [n for n in await notifications(env.bus, name) if "quarantine" in n.title]
    assert quarantined.incident == notes[0].incident == f"gpu-health/node/{name}"
    assert (quarantined.resolves, notes[0].resolves) == (False, True)


async def test_operator_cordoned_node_stays_cordoned_on_release(cordon_env: EnvFactory) -> None:
    env = await cordon_env(nodes={4: {"unschedulable": True}})
    await env.start()
    name = env.nodes[4]
    await env.publish(failed(name))
    await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    node = await env.node(name)
    note = quarantine_note(node)
    assert tainted(node) and note is not None and note["prior_unschedulable"] is True
    assert note["cordoned"] is False
    await env.publish(health(name, HealthState.HEALTHY, seq=2))

    await wait_for(lambda: _released(env.bus, name), timeout=5, what="release")
    node = await env.node(name)
    assert not tainted(node)
    assert node["spec"].get("unschedulable") is True
    assert quarantine_note(node) is None


async def test_dry_run_changes_nothing_but_audits(cordon_env: EnvFactory) -> None:
    env = await cordon_env(dry_run=True)
    await env.start()
    name = env.nodes[5]
    await env.publish(failed(name))
    records = await wait_for(lambda: audits(env.bus, name), timeout=5, what="audit")
    assert outcomes(records) == [("dry_run", None)]
    assert records[0].dry_run is True
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert label(node) == "healthy" and quarantine_note(node) is None
    assert condition_of(node, "GPUHealthy") is None
    assert await wait_for(lambda: notifications(env.bus, name), timeout=2)
    writes = [r for r in env.sim.requests if r[0] != "admin" and r[1] in ("PATCH", "POST")]
    assert writes == []


async def test_stale_event_is_ignored_and_audited(cordon_env: EnvFactory) -> None:
    env = await cordon_env()  # a 10 min tally window: counted until the service stops
    daemon = await env.start()
    name = env.nodes[6]
    now = datetime.now(UTC)
    await env.publish(failed(name, seq=5, at=now))
    await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    # A replay from before the failure (lower sequence, same boot) must not release it,
    # nor must an older event from a previous agent boot.
    await env.publish(
        health(name, HealthState.HEALTHY, seq=3, at=now - timedelta(seconds=5)),
        health(name, HealthState.HEALTHY, seq=9, boot="boot-0", at=now - timedelta(seconds=60)),
    )

    async def stale() -> list[Any]:
        found = [r for r in await audits(env.bus, name, "ignore") if r.guard == "stale"]
        return found if len(found) == 2 else []

    async def one_stale() -> list[Any]:
        return [r for r in await audits(env.bus, name, "ignore") if r.guard == "stale"]

    # The first audited in full; the second, a restatement, counted and audited with the
    # window's count when the window closes: here, when the service stops.
    await wait_for(one_stale, timeout=5, what="the first stale audit")
    handled = daemon.metrics.registry.get_sample_value

    async def counted_one() -> bool:
        labels = {"action": "ignore", "outcome": "skipped", "guard": "stale"}
        return handled("nodeward_remediations_tallied_total", labels) == 1

    await wait_for(counted_one, timeout=5, what="the second stale event counted")
    await daemon.stop()
    first, counted = await wait_for(stale, timeout=5, what="two stale audits")
    assert "tally" not in first.details and counted.details["tally"]["counted"] == 1
    node = await env.node(name)
    assert tainted(node) and node["spec"].get("unschedulable")
    assert await notifications(env.bus, name)


async def test_old_failure_replayed_on_cold_start_does_not_quarantine(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(max_event_age="10m")
    await env.start()
    name = env.nodes[6]
    await env.publish(failed(name, at=datetime.now(UTC) - timedelta(hours=1)))
    records = await wait_for(lambda: audits(env.bus, name), timeout=5, what="audit")
    assert outcomes(records) == [("skipped", "too_old")]
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")


async def test_manual_uncordon_is_respected_and_audited(cordon_env: EnvFactory) -> None:
    env = await cordon_env()
    await env.start()
    name = env.nodes[7]
    await env.publish(failed(name, seq=1))
    await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    await env.admin.nodes.set_unschedulable(name, False)

    async def noticed() -> list[Any]:
        return [r for r in await audits(env.bus, name, "quarantine") if r.outcome == "undone"]

    records = await wait_for(noticed, timeout=5, what="manual uncordon audit")
    assert records[0].guard == "manual_uncordon" and records[0].details["by"] == "operator"
    # The same incident again (the GPU never recovered): not re-cordoned.
    await env.publish(failed(name, seq=2))

    async def skipped() -> list[Any]:
        return [r for r in await audits(env.bus, name, "quarantine") if r.outcome == "skipped"]

    await wait_for(skipped, timeout=5, what="skip audit")
    node = await env.node(name)
    assert not node["spec"].get("unschedulable")
    assert not tainted(node)


async def test_restart_mid_action_neither_duplicates_nor_loses(cordon_env: EnvFactory) -> None:
    env = await cordon_env()
    first = await env.start()
    name = env.nodes[8]
    fault = env.sim.fail_next(10_000, 500, method="PATCH", path_contains=f"/nodes/{name}/status")
    event = failed(name)
    await env.publish(event)

    async def failed_once() -> list[Any]:
        return [r for r in await audits(env.bus, name, "quarantine") if r.outcome == "failed"]

    await wait_for(failed_once, timeout=5, what="the condition write to fail")
    node = await env.node(name)
    assert tainted(node) and node["spec"].get("unschedulable")  # cut short mid-action
    await first.stop()
    fault.count = 0
    await env.start()

    async def done() -> bool:
        cond = condition_of(await env.node(name), "GPUHealthy")
        return cond is not None and cond["status"] == "False"

    await wait_for(done, timeout=10, what="the quarantine to complete after restart")
    await wait_for(lambda: _applied(env.bus, name), timeout=5, what="applied audit")
    node = await env.node(name)
    assert [t for t in taints_of(node) if t["key"] == TAINT_KEY] == [
        {"key": TAINT_KEY, "effect": "NoSchedule"}
    ]
    note = quarantine_note(node)
    assert note is not None and note["prior_unschedulable"] is False  # not our own cordon
    assert len(await _applied(env.bus, name)) == 1


async def test_drain_evicts_only_what_it_may_and_honours_budgets(
    cordon_env: EnvFactory,
) -> None:
    def pods(names: list[str]) -> dict[str, Any]:
        node = names[9]
        return {
            "pods": [
                PodSeed(name="train-0", namespace="ml-a", node=node, gpus=1),
                daemonset_pod("agent-x", "ml-a", node, "agent"),
                PodSeed(
                    name="pinned",
                    namespace="ml-a",
                    node=node,
                    labels={"nodeward.io/exempt": "true"},
                ),
                PodSeed(name="guarded-0", namespace="ml-a", node=node, labels={"app": "guarded"}),
                PodSeed(name="shielded", namespace="ml-exempt", node=node),
            ],
            "pdbs": [
                PdbSeed(
                    name="guarded", namespace="ml-a", selector={"app": "guarded"}, minAvailable=1
                )
            ],
        }

    env = await cordon_env(seed_extra=pods, drain={"enabled": True, "deadline": "0.3s"})
    await env.admin.client.request(
        "PATCH",
        "/api/v1/namespaces/ml-exempt",
        body={"metadata": {"labels": {"nodeward.io/exempt": "true"}}},
        content_type=MERGE_PATCH,
    )
    await env.start()
    name = env.nodes[9]
    await env.publish(failed(name))
    applied = await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    report = applied[0].details["drain"]
    assert report["evicted"] == ["ml-a/train-0"]
    assert set(report["kept"]) == {"ml-a/agent-x", "ml-a/pinned", "ml-exempt/shielded"}
    assert list(report["blocked"]) == ["ml-a/guarded-0"]
    left = {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in await env.admin.pods.on_node(name)
    }
    assert left == {"ml-a/agent-x", "ml-a/pinned", "ml-exempt/shielded", "ml-a/guarded-0"}
    incomplete = [r for r in await audits(env.bus, name, "drain") if r.outcome == "failed"]
    assert len(incomplete) == 1 and "guarded-0" in incomplete[0].reason


async def test_build_with_the_cordon_context_of_the_up_kubeconfig(
    bus: Any, nats_url: str, tmp_path: Any
) -> None:
    """How `nodeward up` wires it: the embedded sim's kubeconfig, context `nodeward-cordon`."""
    from nodeward.config import Settings
    from nodeward.kube import Cluster
    from services.cordon.service import build
    from sim.cluster import embedded_cluster

    async with embedded_cluster(tmp_path) as cluster:
        node = "gpu-h100-02"
        uid = tmp_path.name[-12:].replace("_", "-")
        settings = Settings(
            bus={"url": nats_url},
            cluster=cluster.settings_for("cordon").model_dump(),
            services={
                "cordon": {
                    "consumer": f"cordon-up-{uid}",
                    "bucket": f"cordon-up-{uid}",
                    "subjects": [f"gpu.health.{node}.>"],
                }
            },
        )
        assert settings.cluster.context == "nodeward-cordon"
        daemon = await build(settings)
        async with daemon:
            event = failed(node, at=datetime.now(UTC))
            await bus.publish(event)

            async def quarantined() -> list[Any]:
                found = [
                    r
                    for r in await audits(bus, node, "quarantine")
                    if r.trigger_event_id == event.id and r.outcome == Outcome.APPLIED
                ]
                return found

            await wait_for(quarantined, timeout=5, what="quarantine through the up kubeconfig")
            async with Cluster.connect(cluster.settings_for(None)) as admin:
                assert tainted(await admin.nodes.get(node))


async def test_rate_limited_quarantine_is_refused_audited_and_retried(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(rate_limit={"per_minute": 120, "burst": 1, "max_wait": "0s"})
    await env.start()
    first, second = env.nodes[0], env.nodes[1]
    await env.publish(failed(first))
    await wait_for(lambda: _applied(env.bus, first), timeout=5, what="first quarantine")
    await env.publish(failed(second))
    # The bucket is empty: refused (audited), then redelivered once a token is back.
    await wait_for(lambda: _applied(env.bus, second), timeout=5, what="retried quarantine")
    assert outcomes(await audits(env.bus, second, "quarantine")) == [
        ("refused", "rate_limit"),
        ("applied", None),
    ]
    assert tainted(await env.node(second))


async def test_redelivery_after_act_but_before_audit_publishes_the_audit(
    cordon_env: EnvFactory,
) -> None:
    """A restart between the quarantine being recorded applied and its audit: the
    redelivered event re-publishes the audit instead of reporting 'already quarantined'."""
    env = await cordon_env()
    name = env.nodes[3]
    event = failed(name)
    await _recorded_applied(env, name, event, reason="cut short")
    await env.admin.nodes.mark(name, add_taints=[(TAINT_KEY, "NoSchedule")], unschedulable=True)
    await env.start()
    await env.publish(event)
    applied = await wait_for(lambda: _applied(env.bus, name), timeout=5, what="the audit")
    assert applied[0].trigger_event_id == event.id
    assert outcomes(await audits(env.bus, name)) == [("applied", None)]


async def test_no_execute_and_a_custom_policy(cordon_env: EnvFactory, tmp_path: Any) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules:\n"
        "  - {name: degraded-too, when: {states: [failed, degraded]}, action: quarantine}\n"
        "  - {name: default, action: none}\n"
    )
    env = await cordon_env(no_execute=True, policy_file=str(policy))
    await env.start()
    name = env.nodes[2]
    await env.publish(health(name, HealthState.DEGRADED))
    applied = await wait_for(lambda: _applied(env.bus, name), timeout=5, what="quarantine")
    assert applied[0].policy == "degraded-too"
    effects = sorted(t["effect"] for t in taints_of(await env.node(name)) if t["key"] == TAINT_KEY)
    assert effects == ["NoExecute", "NoSchedule"]


async def test_event_naming_no_kubernetes_node_is_dead_lettered_at_once(
    cordon_env: EnvFactory,
) -> None:
    """A publisher that bypasses `nodeward publish`: names that are no Kubernetes name
    (`gpu-*`, `>`, `a b`) are refused by the contract, dead-lettered as invalid on the first
    delivery (no retries), and nothing is done to any node."""
    env = await cordon_env()
    await env.start()
    consumer = env.settings.services["cordon"]["consumer"]
    target = env.nodes[0]
    bad_names = ["gpu-*", ">", "a b"]
    for i, bad in enumerate(bad_names):
        wire = encode(failed(target, gpu=i))
        body = json.loads(wire.body) | {"node": bad}
        await env.bus.js.publish(wire.subject, json.dumps(body).encode(), headers=wire.headers)

    async def dead() -> list[Any] | None:
        events = await read_stream(env.bus, "DLQ", f"dlq.GPU.{consumer}")
        return events if len(events) == len(bad_names) else None

    began = time.monotonic()
    letters = [e.data for e in await wait_for(dead, timeout=5, what="three dead letters")]
    assert time.monotonic() - began < 5
    assert {d.reason for d in letters} == {"invalid"}
    assert {d.deliveries for d in letters} == {1}
    assert all("node" in d.error and "RFC 1123" in d.error for d in letters)

    async def settled() -> bool:
        info = await env.bus.js.consumer_info("GPU", consumer)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, what="nothing left unacknowledged")
    assert not tainted(await env.node(target))
    assert await audits(env.bus, target) == []


async def test_node_cannot_quarantine_another_node(cordon_env: EnvFactory) -> None:
    """The reproduction of issue 16: node 01, on its own subject `gpu.health.<01>.<gpu>`,
    says node 02's GPUs failed. 02 is not touched; each event is dead-lettered as
    `identity_mismatch` and audited as a security event; on-call hears once for the burst."""
    env = await cordon_env()
    await env.start()
    consumer = env.settings.services["cordon"]["consumer"]
    publisher, victim = env.nodes[0], env.nodes[1]
    burst = 5
    for gpu in range(burst):
        wire = encode(failed(victim, gpu=gpu, seq=gpu + 1))
        own_subject = f"gpu.health.{publisher}.{gpu}"
        await env.bus.js.publish(own_subject, wire.body, headers=wire.headers)

    async def dead() -> list[Any] | None:
        events = await read_stream(env.bus, "DLQ", f"dlq.GPU.{consumer}")
        return events if len(events) == burst else None

    letters = [e.data for e in await wait_for(dead, timeout=5, what="dead letters")]
    assert {d.reason for d in letters} == {"identity_mismatch"}
    assert {d.deliveries for d in letters} == {1}
    for d in letters:
        assert f"data.node '{victim}'" in d.error and f"'{publisher}'" in d.error
    refused = await audits(env.bus, victim, "identity_mismatch")
    assert len(refused) == burst
    assert {r.outcome for r in refused} == {Outcome.REFUSED}
    assert {r.details["publisher"] for r in refused} == {publisher}
    assert all(r.details["security"] for r in refused)

    async def notices() -> list[Any]:
        events = await read_stream(env.bus, "NOTIFY", "notify.critical.security")
        return [e.data for e in events if any(t.name == publisher for t in e.data.targets)]

    told = await wait_for(notices, what="on-call notice")

    async def settled() -> bool:
        info = await env.bus.js.consumer_info("GPU", consumer)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, what="nothing left unacknowledged")
    assert len(await notices()) == 1 == len(told)
    assert told[0].audience == "oncall" and victim in told[0].title
    node = await env.node(victim)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert await _applied(env.bus, victim) == []
    # Node 02's own agent is still heard.
    await env.publish(failed(victim, gpu=7, seq=100))
    await wait_for(lambda: _applied(env.bus, victim), what="a real failure still quarantines")


async def test_garbage_then_a_real_fault_is_still_handled(
    cordon_env: EnvFactory,
) -> None:
    """200 random garbage messages on the subjects cordon consumes (no headers, bad
    headers, valid headers with random bodies, forged names), then a real XID 79: it is
    quarantined, and every piece of garbage is dead-lettered. (How fast is a figure for a
    bench, not a property of a loaded machine.)"""
    env = await cordon_env()
    await env.start()
    consumer = env.settings.services["cordon"]["consumer"]
    rng = random.Random(16)
    template = encode(failed(env.nodes[2]))
    for i in range(200):
        node = rng.choice(env.nodes[3:])  # never the template's node (2), nor the target
        subject = f"gpu.health.{node}.{rng.randrange(8)}"
        body = rng.randbytes(rng.randrange(0, 4096))
        kind = i % 4
        if kind == 0:
            await env.bus.js.publish(subject, body)
        elif kind == 1:
            headers = {"ce-type": "gpu.health.v1", "ce-id": f"g{i}", "ce-specversion": "9"}
            await env.bus.js.publish(subject, body, headers=headers)
        elif kind == 2:
            headers = dict(template.headers) | {"ce-id": f"g{i}", "Nats-Msg-Id": f"g{i}"}
            await env.bus.js.publish(subject, body, headers=headers)
        else:  # well-formed, but about another node than its subject
            headers = dict(template.headers) | {"ce-id": f"g{i}", "Nats-Msg-Id": f"g{i}"}
            await env.bus.js.publish(subject, template.body, headers=headers)
    target = env.nodes[0]
    await env.publish(failed(target))
    await wait_for(lambda: _applied(env.bus, target), timeout=20, what="the real fault handled")

    async def settled() -> bool:
        info = await env.bus.js.consumer_info("GPU", consumer)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, timeout=20, what="all garbage dead-lettered")
    info = await env.bus.js.stream_info("DLQ", subjects_filter=f"dlq.GPU.{consumer}")
    assert info.state.subjects == {f"dlq.GPU.{consumer}": 200}
    assert [n for n in env.nodes if tainted(await env.node(n))] == [target]


async def test_a_quarantine_from_before_node_marks_is_released(cordon_env: EnvFactory) -> None:
    """An upgrade: a quarantine applied by the previous version (KV record and marks, no
    NodeMarks intent) is adopted and released like any other, its cordon lifted."""
    env = await cordon_env()
    name = env.nodes[4]
    event = failed(name)
    await _recorded_applied(env, name, event, reason="applied before NodeMarks")
    await env.admin.nodes.mark(
        name,
        add_taints=[(TAINT_KEY, "NoSchedule")],
        unschedulable=True,
        labels={HEALTH_LABEL: "failed"},
        annotations={QUARANTINE_ANNOTATION: '{"by":"service/cordon"}'},
    )
    await env.start()
    await env.publish(event, health(name, HealthState.HEALTHY, seq=2))
    await wait_for(lambda: _released(env.bus, name), timeout=10, what="the release")
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert label(node) == "healthy" and quarantine_note(node) is None
    assert "manual_uncordon" not in [g for _, g in outcomes(await audits(env.bus, name))]


async def test_a_repeated_application_xid_is_reported_once_to_on_call_and_the_owner(
    cordon_env: EnvFactory,
) -> None:
    """XID 13 three times within the window on one GPU: no quarantine (an application
    error), one `report` decision on AUDIT (on-call hears of it) and one notice to the owner
    of the pod holding the GPU; a fourth changes nothing, another GPU's XIDs count apart."""
    from schemas.base import make_event
    from schemas.common import PodRef
    from tests.helpers.records import app_xid
    from tests.integration.cordon_fixtures import read_stream

    env = await cordon_env(xid_repeats={"count": 3, "window": "10m"})
    consumer = env.settings.services["cordon"]["consumer"] + "-xids"
    await env.start()
    node = env.nodes[0]
    pod = PodRef(namespace="user-alice", name=f"train-{node}")

    def xid(gpu: int, n: int) -> Any:
        return make_event(
            app_xid(
                node,
                gpu,
                f"GPU-{node}-{gpu}",
                [pod],
                datetime.now(UTC) - timedelta(seconds=10 - n),
                name="ROBUST_CHANNEL_GR_EXCEPTION (Graphics Engine Exception)",
            ),
            source=f"agent/gpu/{node}",
        )

    await env.publish(xid(0, 1), xid(0, 2), xid(1, 1))  # two on GPU 0, one on GPU 1
    await env.publish(xid(0, 3))  # the third on GPU 0: reported

    async def reports() -> list[Any]:
        return await audits(env.bus, node, "report")

    found = await wait_for(reports, what="the repeated XID reported")
    await env.publish(xid(0, 4))  # a fourth within the window: nothing new

    async def owner_notices() -> list[Any]:
        events = await read_stream(env.bus, "NOTIFY", "notify.>", skip_invalid=True)
        return [e.data for e in events if e.data.audience == f"user:{pod.namespace}/{pod.name}"]

    told = await wait_for(owner_notices, what="the owner's notice")

    async def settled() -> bool:
        info = await env.bus.js.consumer_info("GPU", consumer)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, what="every XID handled")
    found = await reports()
    assert len(found) == 1 and found[0].outcome == Outcome.APPLIED
    assert found[0].details["gpu"] == 0 and found[0].details["count"] == 3
    assert "XID 13" in found[0].reason and f"user-alice/train-{node}" in found[0].reason
    assert len(await owner_notices()) == 1 == len(told)
    assert "XID 13" in told[0].title
    assert not tainted(await env.node(node))


async def test_node_cannot_release_another_node(cordon_env: EnvFactory) -> None:
    """The other half of issue 16's reproduction: node 02's own agent reports a failed GPU;
    node 01, on its own subject, says 02's GPUs are healthy again. 02 stays quarantined,
    while a witness (03) that really recovered is released in the same time."""
    env = await cordon_env()
    await env.start()
    consumer = env.settings.services["cordon"]["consumer"]
    forger, victim, witness = env.nodes[0], env.nodes[1], env.nodes[2]
    await env.publish(failed(victim, gpu=0, seq=1), failed(witness, gpu=0, seq=1))
    for name in (victim, witness):
        await wait_for(lambda n=name: _applied(env.bus, n), what=f"{name} quarantined")
    for seq in range(2, 6):
        wire = encode(health(victim, HealthState.HEALTHY, gpu=0, seq=seq))
        await env.bus.js.publish(f"gpu.health.{forger}.0", wire.body, headers=wire.headers)
    await env.publish(health(witness, HealthState.HEALTHY, gpu=0, seq=2))

    async def dead() -> list[Any] | None:
        events = await read_stream(env.bus, "DLQ", f"dlq.GPU.{consumer}")
        return events if len(events) == 4 else None

    letters = [e.data for e in await wait_for(dead, what="the forged releases dead-lettered")]
    assert {d.reason for d in letters} == {"identity_mismatch"}

    async def witness_released() -> bool:
        return any(r.outcome == Outcome.APPLIED for r in await audits(env.bus, witness, "release"))

    await wait_for(witness_released, what="the witness released after healthy_period")
    node = await env.node(victim)
    assert tainted(node) and node["spec"].get("unschedulable") is True
    assert await audits(env.bus, victim, "release") == []


async def _recorded_applied(env: Any, name: str, event: Any, **quarantine: Any) -> None:
    """The cordon service's KV record of an applied quarantine of `name` for `event`, as a
    service that stopped before its next step (or a previous version) left it."""
    from schemas.state.cordon import NodeRecord, Quarantine, node_key

    config = section(env.settings, "services", "cordon", CordonSettings)
    records = TypedKV(await env.bus.kv(config.bucket), NodeRecord)
    q = Quarantine(
        incident=event.id,
        rule="xid-node-action",
        gpus=["0"],
        started_at=event.time,
        cordoned=True,
        taints=["NoSchedule"],
        **quarantine,
    )
    await records.put(node_key(name), NodeRecord(quarantine=q))
