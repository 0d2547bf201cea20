"""services.checkpoint against the sim cluster and a real NATS: maintenance as an operator sees it.

Each test gets its own sim node (unique name), durable consumer and KV bucket, so tests run
in parallel against the session's nats-server.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from nodeward.bus import Bus
from schemas.dlq import DeadLetter
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.remediation import Remediation
from services.maintenance.service import (
    ARCHIVE_ANNOTATION,
    CORDON_ANNOTATION,
    MAINTENANCE_ANNOTATION,
)
from sim.cluster.seed import PodSeed
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import EnvFactory as CordonEnvFactory
from tests.integration.cordon_fixtures import failed, read_stream
from tests.integration.maintenance_fixtures import NS, EnvFactory, pod, standard_pods

ORDER = list(MaintenancePhase)
OPTED = {"train-0": ("trainer", "logger"), "notebook-0": ("main",), "ssh-0": ("main",)}


def phase_list(events: list[Maintenance]) -> list[str]:
    return [e.phase.value for e in events]


def in_order(events: list[Maintenance]) -> bool:
    ranks = [ORDER.index(e.phase) for e in events]
    return ranks == sorted(ranks)


async def audits(bus: Bus, action: str) -> list[Remediation]:
    return [e.data for e in await read_stream(bus, "AUDIT", f"remediation.{action}.>")]


async def dead_letters(bus: Bus, consumer: str) -> list[DeadLetter]:
    return [e.data for e in await read_stream(bus, "DLQ", f"dlq.MAINTENANCE.{consumer}")]


async def test_opted_in_pods_checkpointed_before_any_eviction_then_drained(
    maintenance_env: EnvFactory,
) -> None:
    env = await maintenance_env()
    await env.start()
    request = env.request(deadline_s=10)
    await env.bus.publish(request)
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="maintenance done"
    )

    # Every container of every opted-in pod checkpointed once; all before any eviction.
    calls = env.checkpoint_calls()
    assert sorted(calls) == sorted((p, c) for p, cs in OPTED.items() for c in cs)
    log = [(m, p) for who, m, p, s in env.sim.requests if who == "checkpoint" and s < 300]
    checkpoint_at = [i for i, (m, p) in enumerate(log) if "/proxy/checkpoint/" in p]
    evict_at = [i for i, (m, p) in enumerate(log) if p.endswith("/eviction")]
    assert checkpoint_at and evict_at and max(checkpoint_at) < min(evict_at)
    # ...and each pod's archives were written onto the pod before any eviction.
    annotated = [
        i for i, (m, p) in enumerate(log) if m == "PATCH" and "/pods/" in p and "ml-team" in p
    ]
    assert len(annotated) == 3 and max(annotated) < min(evict_at)

    # The record: archive path, node, time, image of each container.
    assert done.failures == []
    for name, containers in OPTED.items():
        plan = done.pods[f"{NS}/{name}"]
        assert plan.status == "checkpointed" and plan.annotated
        assert {c.pod.container for c in plan.checkpoints} == set(containers)
        for c in plan.checkpoints:
            assert c.path and c.path.startswith("/var/lib/kubelet/checkpoints/checkpoint-")
            assert c.node == env.node and c.at is not None
            assert c.image == f"registry.example.com/{c.pod.container}:1"
    assert done.pods[f"{NS}/web-0"].status == "not_opted_in"
    assert "nodeward/agent-x" not in done.pods  # DaemonSet pods are not the maintenance's

    # Drained: only the DaemonSet pod is left; the web pods went one at a time (their PDB).
    assert set(await env.pods()) == {"agent-x"}
    web = [p for ns, p, _ in env.sim.evictions if ns == NS and p.startswith("web-")]
    assert sorted(web) == ["web-0", "web-1"]
    node = await env.admin.nodes.get(env.node)
    assert node["spec"].get("unschedulable") is True
    cordon = json.loads(node["metadata"]["annotations"][CORDON_ANNOTATION])
    assert cordon["prior_unschedulable"] is False and cordon["by"] == "service/checkpoint"
    assert node["metadata"]["annotations"][MAINTENANCE_ANNOTATION] == "done"

    # The phases, in order, on the stream; a checkpointed event per pod, then the summary.
    events = await wait_for(
        lambda: _events_until_done(env), timeout=5, what="done event on the stream"
    )
    assert in_order(events), phase_list(events)
    assert phase_list(events)[:3] == ["requested", "notified", "checkpointing"]
    assert phase_list(events)[-2:] == ["draining", "done"]
    checkpointed = [e for e in events if e.phase == MaintenancePhase.CHECKPOINTED]
    assert len(checkpointed) == 4  # three pods, then the phase with every record
    assert len(checkpointed[-1].checkpoints) == 4
    assert len(events[-1].checkpoints) == 4 and events[-1].failures == []

    # Every pod's owner told when and what; on-call heard of each action.
    notices = await env.notices()
    users = {n.audience: n for n in notices if n.audience.startswith("user:")}
    assert set(users) == {
        f"user:{NS}/{p}" for p in ("train-0", "notebook-0", "ssh-0", "web-0", "web-1")
    }
    assert "checkpoints every container" in users[f"user:{NS}/train-0"].body
    assert "did not opt into checkpoints" in users[f"user:{NS}/web-0"].body
    assert all(n.deadline is not None for n in users.values())
    actions = {
        a.action for a in await audits(env.bus, "*") if a.details.get("node") == env.node
    } & {
        "announce",
        "cordon",
        "checkpoint",
        "drain",
        "complete",
    }
    assert actions == {"announce", "cordon", "checkpoint", "drain", "complete"}


async def _events_until_done(env: object) -> list[Maintenance] | None:
    events = await env.phases()  # type: ignore[attr-defined]
    return events if events and events[-1].phase == MaintenancePhase.DONE else None


async def test_failed_checkpoint_holds_the_pod_until_the_deadline_and_tells_why(
    maintenance_env: EnvFactory,
) -> None:
    env = await maintenance_env(fail=("ssh-0",))
    await env.start()
    await env.bus.publish(env.request(deadline_s=5))
    held = await wait_for(lambda: _held(env), timeout=15, what="the other pods evicted, ssh-0 held")
    deadline = held.deadline_at()
    assert deadline is not None
    assert "ssh-0" in await env.pods()
    assert held.pods[f"{NS}/ssh-0"].status == "failed"
    assert "checkpoint/restore support not available" in (held.pods[f"{NS}/ssh-0"].reason or "")

    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=15, what="maintenance done"
    )
    assert done.finished_at is not None and done.finished_at >= deadline
    assert "ssh-0" not in await env.pods()
    assert any(f.startswith(f"{NS}/ssh-0: evicted at the deadline") for f in done.failures)
    assert [f for f in done.failures if not f.startswith(f"{NS}/ssh-0")] == []
    # The owner was told why and when; on-call got the failed checkpoint.
    notices = await env.notices()
    owner = [n for n in notices if n.audience == f"user:{NS}/ssh-0" and "could not" in n.title]
    assert len(owner) == 1 and owner[0].deadline == deadline
    assert "checkpoint/restore support not available" in owner[0].body
    failed = [
        a
        for a in await audits(env.bus, "checkpoint")  # the stream is shared by other tests
        if a.outcome.value == "failed" and a.details.get("node") == env.node
    ]
    assert [a.target.name for a in failed] == ["ssh-0"]
    everything = [e.data for e in await read_stream(env.bus, "NOTIFY", "notify.*.maintenance")]
    oncall = [
        n
        for n in everything
        if n.audience == "oncall" and n.title == "ssh-0: checkpoint failed" and env.node in n.body
    ]
    assert [n.severity.value for n in oncall] == ["critical"]
    done_event = (await env.phases())[-1]
    assert done_event.phase == MaintenancePhase.DONE and done_event.failures == done.failures


async def _held(env: object) -> object | None:
    state = await env.state()  # type: ignore[attr-defined]
    if state is None or state.phase != MaintenancePhase.DRAINING or state.drain is None:
        return None
    pods = await env.pods()  # type: ignore[attr-defined]
    return state if set(pods) == {"ssh-0", "agent-x"} else None


async def test_gpu_pod_on_a_node_without_cuda_checkpoint_is_reported_not_checkpointed(
    maintenance_env: EnvFactory,
) -> None:
    exempt = pod("keep-0", "", opted_in=True, labels={"nodeward.io/exempt": "true"})
    env = await maintenance_env(
        lambda node: [*standard_pods(node), exempt.model_copy(update={"node": node})], cuda=False
    )
    await env.start()
    await env.bus.publish(env.request(deadline_s=1))
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="maintenance done"
    )
    assert "notebook-0" not in {p for p, _ in env.checkpoint_calls()}
    plan = done.pods[f"{NS}/notebook-0"]
    assert plan.status == "not_checkpointable" and plan.checkpoints == []
    assert "does not advertise CUDA checkpoint support" in (plan.reason or "")
    assert any(f.startswith(f"{NS}/notebook-0: evicted at the deadline") for f in done.failures)
    assert done.pods[f"{NS}/train-0"].status == "checkpointed"  # CPU pods still are
    assert f"{NS}/keep-0" not in done.pods and "keep-0" in await env.pods()  # exempt: stays
    skipped = [
        a
        for a in await audits(env.bus, "checkpoint")
        if a.guard == "no_cuda_checkpoint" and a.details.get("node") == env.node
    ]
    assert [a.target.name for a in skipped] == ["notebook-0"]
    owner = [n for n in await env.notices() if n.audience == f"user:{NS}/notebook-0"]
    assert owner and "cannot be checkpointed" in owner[0].body


async def test_a_budget_that_never_allows_ends_done_with_the_pods_listed(
    maintenance_env: EnvFactory,
) -> None:
    def pods(node: str) -> list[PodSeed]:
        # web-0 opted in: checkpointed, then kept by the budget, so its annotation stays.
        return [
            pod("web-0", node, opted_in=True, labels={"app": "web"}),
            pod("web-1", node, labels={"app": "web"}),
        ]

    env = await maintenance_env(pods, pdb={"minAvailable": 2}, evict_timeout="60s")
    await env.start()
    began = time.monotonic()
    await env.bus.publish(env.request(deadline_s=1))
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=30, what="maintenance done"
    )
    # Blocked until the deadline, then reported: no second wait of evict_timeout (60s).
    assert time.monotonic() - began < 30
    blocked = sorted(f.split(":")[0] for f in done.failures)
    assert blocked == [f"{NS}/web-0", f"{NS}/web-1"]
    assert all("not evicted" in f and "disruption budget" in f.lower() for f in done.failures)
    left = await env.pods()
    assert {"web-0", "web-1"} <= set(left)
    note = json.loads(left["web-0"]["metadata"]["annotations"][ARCHIVE_ANNOTATION])
    (record,) = done.pods[f"{NS}/web-0"].checkpoints
    assert note["maintenance"] == done.maintenance_id and note["node"] == env.node
    assert note["containers"]["main"]["path"] == record.path
    assert note["containers"]["main"]["image"] == "registry.example.com/main:1"
    assert note["containers"]["main"]["time"]


async def test_an_exempt_node_is_not_maintained(maintenance_env: EnvFactory) -> None:
    env = await maintenance_env(node_labels={"nodeward.io/exempt": "true"})
    await env.start()
    await env.bus.publish(env.request())
    failed = await wait_for(
        lambda: env.phase_is(MaintenancePhase.FAILED), timeout=10, what="maintenance failed"
    )
    assert failed.error == f"not maintained: Node {env.node} is labelled nodeward.io/exempt=true"
    node = await env.admin.nodes.get(env.node)
    assert not node["spec"].get("unschedulable") and env.checkpoint_calls() == []
    assert [e.phase.value for e in await env.phases()] == ["requested", "failed"]
    assert [n for n in await env.notices() if n.audience.startswith("user:")] == []


async def test_restart_mid_checkpointing_resumes_without_duplicates(
    maintenance_env: EnvFactory,
) -> None:
    env = await maintenance_env(parallelism=1)
    env.sim.checkpoint_delay = 0.3
    first = await env.start()
    await env.bus.publish(env.request(deadline_s=5))
    await wait_for(lambda: len(env.checkpoint_calls()) >= 1, timeout=10, what="first checkpoint")
    await env.stop(first)
    stopped = await env.state()
    assert stopped is not None and stopped.phase == MaintenancePhase.CHECKPOINTING
    recorded = [c for p in stopped.pods.values() for c in p.checkpoints]
    # The call in flight at the stop was finished and recorded; nothing evicted yet.
    assert len(recorded) == len(env.checkpoint_calls()) < 4
    assert env.sim.evictions == []

    await env.start()
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="maintenance done"
    )
    calls = env.checkpoint_calls()
    assert len(calls) == len(set(calls)) == 4
    assert sorted((c.pod.name, c.pod.container) for c in done.checkpoints()) == sorted(calls)
    events = await env.phases()
    assert in_order(events), phase_list(events)
    assert phase_list(events).count("checkpointing") == 1


async def test_unknown_node_and_malformed_request_are_dead_lettered(
    maintenance_env: EnvFactory,
) -> None:
    env = await maintenance_env()
    await env.start()
    consumer = env.settings.services["checkpoint"]["consumer"]
    ghost = f"{env.node}-x"
    await env.bus.publish(env.request(node=ghost))
    bad_id = str(uuid.uuid4())
    headers = {
        "ce-specversion": "1.0",
        "ce-id": bad_id,
        "ce-source": "t",
        "ce-type": "maintenance.v1",
        "ce-time": "2026-08-20T14:02:11Z",
        "ce-datacontenttype": "application/json",
        "Nats-Msg-Id": bad_id,
    }
    body = b'{"node": "%s", "phase": "someday"}' % env.node.encode()
    await env.bus.js.publish(f"maintenance.requested.{env.node}", body, headers=headers)

    dls = await wait_for(
        lambda: _at_least(dead_letters(env.bus, consumer), 2), timeout=10, what="two DLQ entries"
    )
    by_reason = {d.reason.value: d for d in dls}
    assert by_reason["permanent"].error == f"no node named {ghost} in the cluster"
    assert by_reason["invalid"].error.startswith("maintenance.v1: ")
    assert "\n" not in by_reason["invalid"].error
    failed = await env.phases(ghost)
    assert [e.phase for e in failed] == [MaintenancePhase.REQUESTED, MaintenancePhase.FAILED]
    assert failed[-1].error == f"no node named {ghost} in the cluster"
    assert await env.state() is None  # nothing started on the real node


async def _at_least(found: object, n: int) -> list[DeadLetter] | None:
    items = await found  # type: ignore[misc]
    return items if len(items) >= n else None


async def test_node_annotation_starts_maintenance_and_a_second_request_is_refused(
    maintenance_env: EnvFactory,
) -> None:
    env = await maintenance_env(annotation_interval="0.1s")
    await env.start()
    await env.admin.nodes.set_annotations(env.node, {MAINTENANCE_ANNOTATION: "requested"})
    state = await wait_for(env.state, timeout=10, what="maintenance from the annotation")
    assert state.requested_by == f"annotation/{MAINTENANCE_ANNOTATION}"
    second = env.request(deadline_s=5)
    await env.bus.publish(second)
    refused = await wait_for(
        lambda: _refusal(env, second.data.maintenance_id), timeout=10, what="refusal"
    )
    assert f"already in maintenance {state.maintenance_id}" in (refused.error or "")
    await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="done")


async def _refusal(env: object, mid: str) -> Maintenance | None:
    events = await env.phases()  # type: ignore[attr-defined]
    return next(
        (e for e in events if e.phase == MaintenancePhase.FAILED and e.maintenance_id == mid),
        None,
    )


async def test_dry_run_changes_nothing_and_tells_no_user(maintenance_env: EnvFactory) -> None:
    env = await maintenance_env(dry_run=True)
    await env.start()
    await env.bus.publish(env.request(deadline_s=1))
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=15, what="maintenance done"
    )
    assert done.dry_run and env.checkpoint_calls() == [] and env.sim.evictions == []
    node = await env.admin.nodes.get(env.node)
    assert not node["spec"].get("unschedulable")
    assert {p.status for p in done.pods.values() if p.opted_in} == {"dry_run"}
    assert [n for n in await env.notices() if n.audience.startswith("user:")] == []
    dry = {a.action for a in await audits(env.bus, "*") if a.dry_run and env.node in str(a.details)}
    assert {"announce", "cordon", "checkpoint", "drain"} <= dry


async def _is_done(env: object, mid: str) -> bool:
    state = await env.state()  # type: ignore[attr-defined]
    return bool(state and state.maintenance_id == mid and state.phase == MaintenancePhase.DONE)


async def test_a_later_start_time_warns_first_and_waits(maintenance_env: EnvFactory) -> None:
    env = await maintenance_env()
    await env.start()
    request = env.request(deadline_s=2)
    start_at = request.time + timedelta(seconds=4)
    request = request.model_copy(
        update={"data": request.data.model_copy(update={"start_at": start_at})}
    )
    await env.bus.publish(request)
    notified = await wait_for(
        lambda: env.phase_is(MaintenancePhase.NOTIFIED), timeout=5, what="owners told"
    )
    assert notified.start_at == start_at
    users = [n for n in await env.notices() if n.audience.startswith("user:")]
    assert len(users) == 5 and all(start_at.strftime("%H:%M:%S") in n.title for n in users)
    node = await env.admin.nodes.get(env.node)
    assert not node["spec"].get("unschedulable") and env.checkpoint_calls() == []
    done = await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=15, what="maintenance done"
    )
    assert done.started_at is not None and done.started_at >= start_at


async def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "launch",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_start_status_restore_and_clear_errors(
    maintenance_env: EnvFactory, tmp_path: Path
) -> None:
    env = await maintenance_env()
    await env.start()
    nats = env.bus.settings.url
    kubeconfig = str(env.sim.write_kubeconfig(tmp_path / "kubeconfig-cli"))
    common = ["--nats", nats, "--state-dir", str(tmp_path / "none")]
    config = tmp_path / "config.yaml"
    config.write_text(f"services:\n  checkpoint:\n    bucket: {env.bucket}\n")

    code, out, err = await _cli(
        "maintenance", "start", "no-such-node", "--kubeconfig", kubeconfig, *common
    )
    assert code == 1 and err.strip() == (
        f"nodeward: error: no node named no-such-node in the cluster of {kubeconfig}"
    )
    # No cluster to ask (no kubeconfig anywhere): a node no agent speaks for is refused
    # before anything is published, not left for the service to dead-letter.
    bare = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(tmp_path)}
    code, out, err = await _cli("maintenance", "start", "no-such-node", *common, env=bare)
    assert code == 1 and err.strip() == (
        "nodeward: error: no node named no-such-node is known: no agent of it on the bus, and "
        "no kubeconfig to ask the cluster (--kubeconfig, KUBECONFIG or ~/.kube/config)"
    ), err
    info = await env.bus.js.stream_info("MAINTENANCE", subjects_filter="maintenance.>")
    assert not any("no-such-node" in s for s in info.state.subjects or {})
    code, out, err = await _cli("maintenance", "start", "Bad_Node!", *common)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a Kubernetes node name" in err
    code, out, err = await _cli("maintenance", "start", env.node, "--deadline", "soon", *common)
    assert code == 2 and "--deadline" in err and len(err.strip().splitlines()) == 1
    code, out, err = await _cli("maintenance", "status", env.node, "--config", str(config), *common)
    assert (
        code == 1 and err.strip() == f"nodeward: error: no maintenance recorded for node {env.node}"
    )

    began = time.monotonic()
    code, out, err = await _cli(
        "maintenance", "start", env.node, "--reason", "BIOS update", "--deadline", "5s",
        "--kubeconfig", kubeconfig, "--config", str(config), *common,
    )  # fmt: skip
    assert code == 0, err
    assert f"of {env.node} accepted" in out
    await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="maintenance done")
    assert time.monotonic() - began < 20
    code, out, err = await _cli("maintenance", "status", env.node, "--config", str(config), *common)
    assert code == 0, err
    assert ": done" in out.splitlines()[0] and "BIOS update" in out
    # One attribution: the login user, as the operator controls (finish, cancel) name it.
    assert f"requested by {getpass.getuser()} at" in out, out
    assert f"{NS}/train-0" in out and "checkpointed" in out

    code, out, err = await _cli(
        "maintenance", "restore", f"{NS}/train-0", "--plan", "--registry", "reg.example/ckpt",
        "--config", str(config), *common,
    )  # fmt: skip
    assert code == 0, err
    assert "buildah add $newcontainer /var/lib/kubelet/checkpoints/checkpoint-train-0_" in out
    assert "io.kubernetes.cri-o.annotations.checkpoint.name=trainer" in out
    assert "image: reg.example/ckpt/checkpoint-ml-team-train-0-logger:" in out
    assert "kubectl apply -f -" in out and "name: train-0-restored" in out
    # A later maintenance of the node replaces its record; the plan is still there.
    later = env.request(deadline_s=1)
    await env.bus.publish(later)
    await wait_for(
        lambda: _is_done(env, later.data.maintenance_id), timeout=10, what="the later one done"
    )
    code, again, err = await _cli(
        "maintenance", "restore", f"{NS}/train-0", "--plan", "--registry", "reg.example/ckpt",
        "--config", str(config), *common,
    )  # fmt: skip
    assert code == 0 and again == out, err
    code, out, err = await _cli(
        "maintenance", "restore", f"{NS}/web-0", "--plan", "--config", str(config), *common
    )
    assert code == 1 and err.strip() == (
        f"nodeward: error: pod {NS}/web-0 has no recorded checkpoint: it did not opt in "
        "(label nodeward.io/checkpoint=true)"
    )


def test_archive_annotation_name_is_documented() -> None:
    page = (
        Path(__file__).resolve().parents[2] / "docs" / "services" / "maintenance.md"
    ).read_text()
    assert ARCHIVE_ANNOTATION in page and "nodeward.io/cuda-checkpoint" in page


async def test_quarantine_rule_with_maintenance_requests_it_once(
    cordon_env: CordonEnvFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules:\n"
        "  - name: xid-node-action\n"
        "    when: {states: [failed], recommended_actions: [reboot_node]}\n"
        "    action: quarantine\n"
        "    maintenance: true\n"
        "  - {name: default, action: none}\n"
    )
    env = await cordon_env(policy_file=str(policy))
    await env.start()
    name = env.nodes[0]
    event = failed(name)
    await env.publish(event, event)  # a redelivery asks once
    await env.publish(failed(name, gpu=1, seq=2))  # a second GPU of the same incident too

    async def requested() -> list[Maintenance] | None:
        got = [e.data for e in await read_stream(env.bus, "MAINTENANCE", f"maintenance.*.{name}")]
        return got or None

    asked = await wait_for(requested, timeout=5, what="maintenance.requested from the cordon")
    await wait_for(lambda: _audited_quarantine(env.bus, name), timeout=5, what="quarantine applied")
    asked = await requested()
    assert asked is not None and len(asked) == 1
    assert asked[0].phase == MaintenancePhase.REQUESTED
    assert asked[0].requested_by == "service/cordon"
    assert asked[0].maintenance_id == f"mnt-quarantine-{event.id}"
    assert "xid-node-action" in asked[0].reason


async def _audited_quarantine(bus: Bus, node: str) -> bool:
    events = await read_stream(bus, "AUDIT", f"remediation.quarantine.{node}")
    return any(e.data.outcome.value == "applied" for e in events)


async def test_a_replayed_old_request_starts_nothing(maintenance_env: EnvFactory) -> None:
    env = await maintenance_env()
    await env.start()
    old = env.request()
    old = old.model_copy(update={"time": old.time - timedelta(hours=1)})
    fresh = env.request(node=f"{env.node}-x")  # after the old one: handled means passed
    await env.bus.publish_many([old, fresh])
    consumer = env.settings.services["checkpoint"]["consumer"]
    await wait_for(
        lambda: _at_least(dead_letters(env.bus, consumer), 1), timeout=10, what="the later one"
    )
    assert await env.state() is None
    assert [e.phase for e in await env.phases()] == [MaintenancePhase.REQUESTED]


async def test_one_of_two_replicas_turns_an_annotation_into_one_request(
    maintenance_env: EnvFactory,
) -> None:
    """The annotation scan runs in the replica holding the workflow lease: two replicas
    scanning every 50 ms publish one request, and nothing is refused as a second one."""
    env = await maintenance_env(annotation_interval="0.05s")
    await env.start()
    await env.start()
    await env.admin.nodes.set_annotations(env.node, {MAINTENANCE_ANNOTATION: "requested"})
    await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=30, what="done")
    phases = await env.phases()
    requested = [p for p in phases if p.phase == MaintenancePhase.REQUESTED]
    assert len(requested) == 1, requested
    assert requested[0].requested_by == f"annotation/{MAINTENANCE_ANNOTATION}"
    assert not [p for p in phases if p.phase == MaintenancePhase.FAILED]
