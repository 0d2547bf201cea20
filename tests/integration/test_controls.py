"""Operator controls against the real services, nats-server and the sim cluster: the
`nodeward` command sends a request on the bus, the owning service acts through the kernel
and answers in one line. Each works on what nodeward did and refuses what it did not."""

from __future__ import annotations

import asyncio
import contextlib
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from launch.cli import main
from nodeward.kube.nodes import taints_of
from schemas import make_event
from schemas.falco import ISOLATE_LABEL
from schemas.gpu import HealthState
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.remediation import Outcome
from schemas.state.cordon import TAINT_KEY
from services.falco.actions.isolate import ISOLATION_ANNOTATION
from services.maintenance.state import MaintenanceState
from sim.falco_samples import DROP_AND_EXECUTE
from tests.conftest import wait_for
from tests.integration import cordon_fixtures
from tests.integration.cordon_fixtures import (
    CordonEnv,
    EnvFactory,
    audits,
    failed,
    read_stream,
)
from tests.integration.falco_fixtures import EnvFactory as FalcoFactory
from tests.integration.maintenance_fixtures import EnvFactory as MaintenanceFactory


async def nodeward(*args: str) -> tuple[int, str, str]:
    """The `nodeward` command in this process (its own event loop, in a thread): exit code,
    stdout, and its stderr lines (not the log lines of the services this process runs)."""

    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        return code, out.getvalue(), err.getvalue()

    code, out, err = await asyncio.to_thread(run)
    said = "".join(line for line in err.splitlines(keepends=True) if line.startswith("nodeward"))
    return code, out, said


BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"
BOB_SIBLING = "bob-llm-finetune-6d5f9c7b8d-x2kfp"


def tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in taints_of(node))


def cordon_config(env: CordonEnv, tmp_path: Path) -> str:
    """A config file naming the test's cordon buckets, as an operator's would."""
    service = env.settings.services["cordon"]
    path = tmp_path / "operator.yaml"
    path.write_text(
        yaml.safe_dump(
            {"services": {"cordon": {"bucket": service["bucket"], "breaker": service["breaker"]}}}
        )
    )
    return str(path)


async def _applied(env: CordonEnv, name: str) -> bool:
    return any(
        r.outcome == Outcome.APPLIED and r.guard is None
        for r in await audits(env.bus, name, "quarantine")
    )


async def test_quarantine_release_undoes_ours_and_refuses_a_hand_cordon(
    cordon_env: EnvFactory, nats_url: str, tmp_path: Path
) -> None:
    env = await cordon_env(nodes={4: {"unschedulable": True}})
    await env.start()
    ours, by_hand = env.nodes[1], env.nodes[4]
    await env.publish(failed(ours))
    await wait_for(lambda: _applied(env, ours), timeout=5, what="the quarantine")
    conf = cordon_config(env, tmp_path)
    common = ("--nats", nats_url, "--config", conf)

    code, out, _ = await nodeward("quarantine", "list", *common)
    assert code == 0
    assert ours in out and by_hand not in out

    # A node cordoned by hand, with no quarantine of nodeward's: refused, stays cordoned.
    code, out, err = await nodeward(
        "quarantine",
        "release",
        by_hand,
        "--reason",
        "done",
        "--operator",
        "alice",
        *common,
    )
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"nodeward: cordon: refused: {by_hand} has no quarantine by nodeward and "
        "stays cordoned; nodeward undoes only what it did"
    ]
    assert (await env.node(by_hand))["spec"].get("unschedulable") is True
    [refusal] = [r for r in await audits(env.bus, by_hand, "release")]
    assert (refusal.outcome, refusal.guard) == (Outcome.SKIPPED, "not_ours")
    assert refusal.details["operator"] == "alice"

    # nodeward's own quarantine: released, audited as the operator's, told to on-call.
    code, out, err = await nodeward(
        "quarantine",
        "release",
        ours,
        "--reason",
        "GPU reseated",
        "--operator",
        "alice",
        *common,
    )
    assert code == 0, err
    assert out.startswith(f"released {ours} from quarantine ") and "uncordoned" in out
    node = await env.node(ours)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    [release] = [r for r in await audits(env.bus, ours, "release") if r.outcome == "applied"]
    assert release.details["operator"] == "alice"
    assert release.details["operator_reason"] == "GPU reseated"
    assert "asked by operator alice: GPU reseated" in release.reason
    notes = await cordon_fixtures.notifications(env.bus, ours)
    assert any(n.title == f"{ours}: release applied" for n in notes)

    # The GPU has not recovered: its next report does not quarantine it again ...
    await env.publish(failed(ours, seq=2))

    async def respected() -> bool:
        return any(
            r.guard == "operator_released" for r in await audits(env.bus, ours, "quarantine")
        )

    await wait_for(respected, timeout=5, what="the operator's release respected")
    assert not tainted(await env.node(ours))
    # ... and once it has recovered, a new failure does.
    await env.publish(cordon_fixtures.health(ours, HealthState.HEALTHY, seq=3), failed(ours, seq=4))

    async def requarantined() -> bool:
        return tainted(await env.node(ours))

    await wait_for(requarantined, timeout=5, what="a new failure quarantined")

    # Nothing to release twice: the second answer says so.
    code, _, err = await nodeward("quarantine", "release", by_hand, "--reason", "again", *common)
    assert code == 1 and "no quarantine by nodeward" in err


async def test_breaker_status_and_reset(
    cordon_env: EnvFactory, nats_url: str, tmp_path: Path
) -> None:
    env = await cordon_env()
    await env.start()
    common = ("--nats", nats_url, "--config", cordon_config(env, tmp_path))

    code, out, _ = await nodeward("breaker", "status", *common)
    assert code == 0 and out.startswith("circuit breaker closed")
    code, _, err = await nodeward(
        "breaker", "reset", "--reason", "why not", "--operator", "bob", *common
    )
    assert code == 1 and "the circuit breaker is not tripped" in err

    sick = env.nodes[:4]  # the breaker admits 3 of 10
    await env.publish(*(failed(n) for n in sick))

    async def tripped() -> str | None:
        code, out, _ = await nodeward("breaker", "status", *common)
        return out if code == 0 and "TRIPPED" in out else None

    await wait_for(tripped, timeout=10, what="the breaker tripped")
    code, out, err = await nodeward(
        "breaker", "reset", "--reason", "fleet checked", "--operator", "bob", *common
    )
    assert code == 0, err
    assert out.startswith("circuit breaker reset")
    code, out, _ = await nodeward("breaker", "status", *common)
    assert out.startswith("circuit breaker closed")
    [reset] = [
        e.data
        for e in await _audit_events(env)
        if e.data.action == "breaker_reset" and e.data.outcome == "applied"
    ]
    assert (
        reset.details["operator"] == "bob" and reset.details["operator_reason"] == "fleet checked"
    )


async def _audit_events(env: CordonEnv) -> list[Any]:
    return await read_stream(env.bus, "AUDIT", "remediation.breaker_reset.>")


async def test_a_control_nobody_serves_says_which_service(nats_url: str) -> None:
    code, out, err = await nodeward(
        "falco",
        "release",
        "ml-team/nobody-0",
        "--reason",
        "x",
        "--nats",
        nats_url,
        "--timeout",
        "1",
    )
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "nodeward: error: no answer from the falco service on control.falco.release "
        "(no replica is serving it); is it running?"
    ]


async def test_a_reason_is_required(nats_url: str) -> None:
    code, _, err = await nodeward("quarantine", "release", "gpu-a", "--nats", nats_url)
    assert code == 2 and "--reason" in err


async def test_falco_release_lifts_our_isolation_and_not_a_hand_one(
    falco_env: FalcoFactory, nats_url: str
) -> None:
    env = await falco_env()
    await env.start()
    ns = env.ns("user-bob")
    await env.publish_raw(env.alert(DROP_AND_EXECUTE))

    async def isolated_by_us() -> bool:
        return any(r.outcome == "applied" for r in await env.audits(ns, BOB, "isolate"))

    await wait_for(isolated_by_us, timeout=10, what="bob's pod isolated")
    await env.admin.pods.set_labels(ns, BOB_SIBLING, {ISOLATE_LABEL: "true"})  # by hand

    code, out, err = await nodeward(
        "falco",
        "release",
        f"{ns}/{BOB_SIBLING}",
        "--reason",
        "ok",
        "--operator",
        "carol",
        "--nats",
        nats_url,
    )
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"nodeward: falco: refused: {ns}/{BOB_SIBLING} is labelled {ISOLATE_LABEL}=true but not "
        "by nodeward (no isolation record of its own), and stays isolated; nodeward undoes "
        "only what it did"
    ]
    sibling = await env.pod(ns, BOB_SIBLING)
    assert sibling["metadata"]["labels"][ISOLATE_LABEL] == "true"

    code, out, err = await nodeward(
        "falco",
        "release",
        f"{ns}/{BOB}",
        "--reason",
        "miner was a benchmark",
        "--operator",
        "carol",
        "--nats",
        nats_url,
    )
    assert code == 0, err
    assert out.startswith(f"lifted the isolation of {ns}/{BOB}")
    pod = await env.pod(ns, BOB)
    assert ISOLATE_LABEL not in pod["metadata"]["labels"]
    assert ISOLATION_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    [release] = [r for r in await env.audits(ns, BOB, "release") if r.outcome == "applied"]
    assert release.details["operator"] == "carol"
    assert release.details["operator_reason"] == "miner was a benchmark"
    assert release.actor == "service/falco"

    code, _, err = await nodeward(
        "falco", "release", f"{ns}/{BOB}", "--reason", "again", "--nats", nats_url
    )
    assert code == 1 and "is not isolated by nodeward" in err


async def test_maintenance_cancel_before_the_cordon_and_a_hand_cordon_is_left(
    maintenance_env: MaintenanceFactory, nats_url: str
) -> None:
    env = await maintenance_env()
    await env.start()
    spare = f"{env.node}-spare"
    await env.admin.nodes.set_unschedulable(spare, True)  # by hand
    later = Maintenance(
        node=env.node,
        phase=MaintenancePhase.REQUESTED,
        maintenance_id=f"mnt-later-{env.node}",
        reason="firmware update",
        requested_by="test",
        start_at=datetime.now(UTC) + timedelta(hours=1),
    )
    await env.bus.publish(make_event(later, source="test/maintenance"))
    await wait_for(lambda: env.phase_is(MaintenancePhase.NOTIFIED), timeout=10, what="notified")

    code, _, err = await nodeward(
        "maintenance",
        "finish",
        spare,
        "--reason",
        "done",
        "--operator",
        "dora",
        "--nats",
        nats_url,
    )
    assert code == 1
    assert err.strip().splitlines() == [
        f"nodeward: checkpoint: refused: nodeward holds no maintenance cordon on {spare} "
        "(it stays cordoned); nodeward undoes only what it did"
    ]
    assert (await env.admin.nodes.get(spare))["spec"].get("unschedulable") is True

    code, out, err = await nodeward(
        "maintenance",
        "cancel",
        env.node,
        "--reason",
        "vendor postponed",
        "--operator",
        "dora",
        "--nats",
        nats_url,
    )
    assert code == 0, err
    assert out.strip() == (
        f"cancelled maintenance {later.maintenance_id} of {env.node} (notified); "
        "it was not cordoned yet"
    )
    state = await env.state()
    assert state is not None and state.phase == MaintenancePhase.CANCELLED
    assert state.ended_by == "dora"
    assert MaintenancePhase.CANCELLED in [p.phase for p in await env.phases()]
    [cancel] = [
        r.data
        for r in await read_stream(env.bus, "AUDIT", f"remediation.cancel.{env.node}")
        if r.data.outcome == "applied"
    ]
    assert cancel.details["operator"] == "dora"
    assert cancel.details["operator_reason"] == "vendor postponed"
    assert not (await env.admin.nodes.get(env.node))["spec"].get("unschedulable")
    # The owners warned of it hear that it is off.
    told = [
        e.data
        for e in await read_stream(env.bus, "NOTIFY", "notify.*.maintenance")
        if e.data.audience == "user:ml-team/train-0"
    ]
    assert [n.title for n in told][-1] == (
        f"Maintenance of node {env.node} cancelled: your pod ml-team/train-0 stays"
    )
    assert "cancelled by dora" in told[-1].body


async def test_maintenance_cancel_after_the_drain_says_what_was_done_then_finish(
    maintenance_env: MaintenanceFactory, nats_url: str
) -> None:
    env = await maintenance_env(fail=("train-0",))  # held until the deadline
    await env.start()
    await env.bus.publish(env.request(deadline_s=8))

    async def draining() -> MaintenanceState | None:
        state = await env.phase_is(MaintenancePhase.DRAINING)
        return state if state is not None and state.drain is not None else None

    await wait_for(draining, timeout=40, what="the drain begun, train-0 held")
    code, out, err = await nodeward(
        "maintenance",
        "cancel",
        env.node,
        "--reason",
        "too late?",
        "--operator",
        "dora",
        "--nats",
        nats_url,
    )
    assert code == 1 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"nodeward: checkpoint: refused: the drain of {env.node} for ")
    assert f"{env.node} cordoned by nodeward, 2 pod(s) checkpointed" in line
    assert "1 held until the deadline" in line
    assert (await env.admin.nodes.get(env.node))["spec"].get("unschedulable") is True

    code, _, err = await nodeward(
        "maintenance", "finish", env.node, "--reason", "early", "--nats", nats_url
    )
    assert code == 1 and "is still draining" in err

    await wait_for(lambda: env.phase_is(MaintenancePhase.DONE), timeout=20, what="done")
    code, out, err = await nodeward(
        "maintenance",
        "finish",
        env.node,
        "--reason",
        "firmware flashed",
        "--operator",
        "dora",
        "--nats",
        nats_url,
    )
    assert code == 0, err
    assert out.strip().endswith(f"of {env.node}; uncordoned it")
    assert not (await env.admin.nodes.get(env.node))["spec"].get("unschedulable")
    [finish] = [
        r.data
        for r in await read_stream(env.bus, "AUDIT", f"remediation.finish.{env.node}")
        if r.data.outcome == "applied"
    ]
    assert finish.details["operator"] == "dora"

    code, _, err = await nodeward(
        "maintenance", "finish", env.node, "--reason", "twice", "--nats", nats_url
    )
    assert code == 1 and "holds no maintenance cordon" in err


async def test_of_two_replicas_exactly_one_answers(cordon_env: EnvFactory, nats_url: str) -> None:
    env = await cordon_env()
    await env.start()
    await env.start()  # a second replica: same consumer, same bucket, same control subjects
    name = env.nodes[2]
    await env.publish(failed(name))
    await wait_for(lambda: _applied(env, name), timeout=5, what="the quarantine")
    code, out, err = await nodeward(
        "quarantine",
        "release",
        name,
        "--reason",
        "once",
        "--operator",
        "erin",
        "--nats",
        nats_url,
    )
    assert code == 0, err
    assert out.count("released") == 1
    # Had both replicas answered, the second would have found nothing to release and
    # audited a refusal: one release, and nothing else, is on the audit stream.
    records = [(r.outcome.value, r.guard) for r in await audits(env.bus, name, "release")]
    assert records == [("applied", None)]
