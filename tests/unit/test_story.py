"""The story `nodeward up` prints: one line per step, in the story's order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from launch.story import Story
from nodeward.cli.common import line_width
from schemas import make_event
from schemas.cloudevents import encode
from schemas.common import ObjectRef
from schemas.gpu import GpuHealth, HealthReason, HealthState
from schemas.node import NodeCause, NodeHealth, Unresponsiveness
from schemas.notify import Notification, Severity
from schemas.remediation import Outcome, Remediation
from schemas.state.cordon import NodeRecord, Quarantine
from tests.helpers.records import gpu_health, node_action, notebook_idle

T0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


@dataclass
class Wire:
    subject: str
    headers: dict[str, str]
    data: bytes


def wire(data: Any, at: datetime) -> Any:
    """`data` as the bus carries it, the event's own time `at`."""
    return wire_of(make_event(data, source="test/story").model_copy(update={"time": at}))


def wire_of(event: Any) -> Any:
    w = encode(event)
    return Wire(w.subject, dict(w.headers), w.body)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def health(state: HealthState, previous: HealthState | None, heartbeat: bool = False) -> GpuHealth:
    xid = HealthReason(code="xid", xid=79, message="fallen off the bus")
    reasons = [xid] if state == HealthState.FAILED else []
    return gpu_health(
        "gpu-a",
        0,
        "GPU-0",
        state,
        T0,
        previous_state=previous,
        heartbeat=heartbeat,
        reasons=reasons,
    )


def applied(incident: str) -> bytes:
    """A node's KV record: the marks of quarantine `incident` applied."""
    q = Quarantine(
        incident=incident,
        rule="xid",
        reason="GPU 0 failed",
        gpus=["0"],
        started_at=T0,
        cordoned=True,
        taints=["NoSchedule"],
    )
    return NodeRecord(quarantine=q).model_dump_json().encode()


def quarantine_decision(trigger: str, at: datetime) -> Any:
    return make_event(
        node_action("quarantine", "gpu-a", "GPU 0 failed", trigger_event_id=trigger),
        source="service/cordon",
    ).model_copy(update={"time": at})


def test_lines_come_out_in_the_story_order_whatever_order_they_arrive_in() -> None:
    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)
    ms = timedelta(milliseconds=1)
    decision = quarantine_decision("inc-1", T0 + 2 * ms)
    notice = Notification(  # what the decision's audit sends on-call
        severity=Severity.CRITICAL,
        topic="gpu-health",
        title="gpu-a: quarantine applied",
        audit_event_id=decision.id,
    )
    # The startup report and heartbeats are not news.
    story.on_event(wire(health(HealthState.HEALTHY, None), T0), T0)  # type: ignore[arg-type]
    story.on_event(wire(health(HealthState.HEALTHY, None, heartbeat=True), T0), T0)  # type: ignore[arg-type]
    # Arrival order differs from the story order (separate subscriptions): the notice the
    # decision's audit sent comes before the decision itself.
    story.on_event(wire(notice, T0 + 3 * ms), T0 + 3 * ms)  # type: ignore[arg-type]
    story.on_record("node.gpu-a", applied("inc-1"), T0 + ms)
    story.on_event(wire_of(decision), T0 + 2 * ms)  # type: ignore[arg-type]
    story.on_event(wire(health(HealthState.FAILED, HealthState.HEALTHY), T0), T0)  # type: ignore[arg-type]
    story.now = lambda: T0 + 4 * ms
    story.on_file("notice-1.json")
    story.flush()
    assert lines == []  # held until they have waited `hold`
    clock.now = 1.0
    story.flush()
    labels = [line.split()[0] for line in lines]
    assert labels == ["GPU", "DECISION", "CORDON", "DELIVERED"]
    assert "healthy -> failed (XID 79: fallen off the bus)" in lines[0]
    assert "20:00:00.000" in lines[0] and "event time" not in lines[0]
    # One line for the decision and the notice its audit sent, never the title again.
    assert "quarantine node/gpu-a: applied" in lines[1]
    assert lines[1].endswith("- GPU 0 failed; notice to oncall (critical)")
    assert not any("gpu-a: quarantine applied" in line for line in lines)
    assert "gpu-a tainted nodeward.io/gpu-unhealthy:NoSchedule, cordoned" in lines[2]
    assert lines[3].endswith("outbox/notice-1.json")
    # Told in time order: the CORDON line, told after its decision, at the decision's time;
    # the decision at its notice's level (critical), not WARN for every decision.
    assert [line.split()[1] for line in lines] == sorted(line.split()[1] for line in lines)
    assert lines[2].split()[1] == lines[1].split()[1] == "20:00:00.002"
    assert lines[1].split()[2] == "CRIT" and lines[0].split()[2] == "CRIT"
    # The subject and type are `nodeward tail`'s, not the story's.
    assert "remediation.v1" not in lines[1] and "remediation.quarantine" not in lines[1]
    # The same incident's record again (a later KV write) is not a new step.
    story.on_record("node.gpu-a", applied("inc-1"), T0 + 5 * ms)
    # Nor is the decision's notice redelivered after its line went out.
    story.on_event(wire(notice, T0 + 3 * ms), T0 + 6 * ms)  # type: ignore[arg-type]
    story.flush(everything=True)
    assert len(lines) == 4


def test_a_notice_of_its_own_is_a_notify_line_and_a_decisions_follows_it() -> None:
    lines: list[tuple[str, str]] = []
    story = Story(emit=lambda line, sev: lines.append((line, sev)), hold=0)
    warn = make_event(
        Remediation(
            action="warn",
            target=ObjectRef(kind="Pod", namespace="ml-a", name="nb-0"),
            outcome=Outcome.APPLIED,
            reason="idle for 1m",
            actor="service/culler",
        ),
        source="service/culler",
    ).model_copy(update={"time": T0})
    story.on_event(wire_of(warn), T0)  # type: ignore[arg-type]
    audit_notice = Notification(
        severity=Severity.INFO,
        topic="idle-session",
        title="nb-0: warn applied",
        audit_event_id=warn.id,
    )
    owner = Notification(  # the owner's own notice: no audit record says it
        severity=Severity.WARNING,
        topic="idle-session",
        title="Your notebook ml-a/nb-0 will be stopped",
        audience="user:ml-a/nb-0",
    )
    story.on_event(wire(audit_notice, T0), T0)  # type: ignore[arg-type]
    story.on_event(wire(owner, T0), T0)  # type: ignore[arg-type]
    story.flush(everything=True)
    assert [line.split()[0] for line, _ in lines] == ["DECISION", "NOTIFY"]
    assert lines[0][0].endswith("- idle for 1m; notice to oncall (info)")
    assert "to user:ml-a/nb-0: Your notebook ml-a/nb-0 will be stopped" in lines[1][0]
    assert lines[1][1] == "warning"


def test_a_notice_whose_decision_never_came_is_still_told() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    orphan = Notification(
        severity=Severity.CRITICAL,
        topic="gpu-health",
        title="gpu-b: quarantine applied",
        audit_event_id="not-seen",
    )
    story.on_event(wire(orphan, T0), T0)  # type: ignore[arg-type]
    story.flush(everything=True)
    assert len(lines) == 1 and lines[0].startswith("NOTIFY ")
    assert lines[0].endswith("to oncall: gpu-b: quarantine applied")


def test_a_release_is_its_own_step() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    release = node_action("release", "gpu-a", "every GPU healthy for 15s")
    story.on_event(wire(release, T0), T0)  # type: ignore[arg-type]
    story.flush(everything=True)
    assert lines[0].startswith("RELEASE ") and "every GPU healthy for 15s" in lines[0]


def test_a_dead_letter_and_a_delivered_file_are_told_too(tmp_path: Path) -> None:
    from launch.story import outbox_title
    from schemas import example_event

    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    dead = example_event("dlq.v1")
    w = encode(dead)
    story.on_event(Wire(w.subject, dict(w.headers), w.body))  # type: ignore[arg-type]
    notice = tmp_path / "0001-quarantine.txt"
    notice.write_text("Date: 2026-11-29 20:00:00 UTC\nSubject: gpu-a: quarantine applied\n\nbody")
    story.on_file(notice.name, outbox_title(notice))
    story.flush(everything=True)
    assert lines[0].startswith("DLQ ") and "cordon could not process gpu.health." in lines[0]
    assert lines[1].startswith("DELIVERED ")
    assert lines[1].endswith("outbox/0001-quarantine.txt: gpu-a: quarantine applied")
    (tmp_path / "plain.txt").write_text("no headers here\n\nSubject: in the body")
    assert outbox_title(tmp_path / "plain.txt") is None


async def test_the_outbox_watch_tells_new_files_only(tmp_path: Path) -> None:
    import asyncio

    from launch.story import watch_outbox
    from tests.conftest import wait_for

    outbox = tmp_path / "outbox"
    outbox.mkdir()
    (outbox / "old.txt").write_text("Subject: old\n\n")
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    stop, listed = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(watch_outbox(outbox, story, stop, listed))
    try:
        await asyncio.wait_for(listed.wait(), 5)
        (outbox / "2026-11-29").mkdir()
        (outbox / "2026-11-29" / "n1.txt").write_text("Subject: gpu-a quarantined\n\nbody")

        def told() -> bool:
            story.flush()
            return bool(lines)

        await wait_for(told, timeout=5, what="the new file")
    finally:
        stop.set()
        await task
    assert len(lines) == 1
    assert lines[0].endswith("outbox/2026-11-29/n1.txt: gpu-a quarantined")


def test_an_idle_session_is_told_once_per_idle_period() -> None:
    from schemas.session import IdleEvidence, SessionIdle

    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)

    def idle(since: datetime, idle_for: float) -> SessionIdle:
        cpu = IdleEvidence(signal="cpu", idle_since=since, detail="0.01 cores")
        return notebook_idle("ml-a", "nb-0", "gpu-a", since, idle_for, cpu)

    for i in range(3):  # the agent restates the same idle period every interval
        at = T0 + timedelta(seconds=30 * i)
        story.on_event(wire(idle(T0, 30.0 * (i + 1)), at), at)  # type: ignore[arg-type]
    at = T0 + timedelta(minutes=6)
    story.on_event(wire(idle(T0 + timedelta(minutes=5), 30.0), at), at)  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    assert len(lines) == 2
    assert (
        "IDLE" in lines[0]
        and "ml-a/nb-0 on gpu-a idle 30s" in lines[0]
        and "cpu 0.01 cores" in lines[0]
    )


def test_a_falco_alert_is_told_at_the_clocks_time_before_its_decisions() -> None:
    """A sample alert carries its own time, hours before the clock: the line shows when the
    bus stored it, with the alert's own time beside it."""
    from schemas.falco import FalcoAlert, FalcoPriority
    from sim.falco_samples import DROP_AND_EXECUTE, samples

    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _severity: lines.append(line), clock=clock)
    raw = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
    alert = FalcoAlert.model_validate(raw)
    pod = ObjectRef(kind="Pod", namespace="user-bob", name=alert.pod or "")
    isolate = Remediation(
        action="isolate",
        target=pod,
        outcome=Outcome.APPLIED,
        reason="Falco Critical",
        actor="service/falco",
    )
    decided = T0 + timedelta(milliseconds=5)
    story.on_event(wire(isolate, decided), decided)  # type: ignore[arg-type]
    story.on_event(wire(alert, T0 - timedelta(hours=5)), T0)  # type: ignore[arg-type]
    test_rule = alert.model_copy(  # Falcosidekick's /test event: not told
        update={
            "rule": "Test rule",
            "source": "internal",
            "priority": FalcoPriority.DEBUG,
            "output": "This is a test from falcosidekick",
        }
    )
    story.on_event(wire(test_rule, T0), T0)  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    assert [line.split()[0] for line in lines] == ["FALCO", "DECISION"]
    assert [line.split()[1] for line in lines] == ["20:00:00.000", "20:00:00.005"]
    assert lines[0].endswith("(event time 15:00:00)")
    assert "event time" not in lines[1]
    assert "Critical 'Drop and execute new binary in container' on pod user-bob/" in lines[0]


def test_restarts_are_one_line_each_and_other_decisions_stay_decisions() -> None:
    from nodeward.supervisor import Restart, restart_audit

    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)
    died = Restart("cordon", "task consume failed: RuntimeError: boom", 1, 600.0)
    server = restart_audit("nats-server", "exited (signal 9)", "back on 127.0.0.1:4222 after 0.8 s")
    for data in (died.audit(), server):
        story.on_event(wire(data, T0), T0)  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    cordon, nats = lines
    assert cordon.startswith("RESTART ") and nats.startswith("RESTART ")
    assert cordon.endswith(
        " cordon: task consume failed: RuntimeError: boom; restarted (1st time in 10 min)"
    )
    assert nats.endswith(" nats-server: exited (signal 9); back on 127.0.0.1:4222 after 0.8 s")


def test_an_event_a_few_seconds_off_the_clock_shows_the_clocks_time_only() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    failed = health(HealthState.FAILED, HealthState.HEALTHY)
    story.on_event(wire(failed, T0 - timedelta(seconds=3)), T0)  # type: ignore[arg-type]
    story.on_event(wire(failed, T0 - timedelta(days=1, seconds=20)), T0)  # type: ignore[arg-type]
    story.flush(everything=True)
    assert [line.split()[1] for line in lines] == ["20:00:00.000", "20:00:00.000"]
    assert "event time" not in lines[0]
    assert lines[1].endswith("(event time 2026-11-28 19:59:40)")


def test_each_step_of_a_recovery_is_told() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    steps = [
        ("recover", "gpu-a: XID 79; the catalog says reboot_node: reboot"),
        ("drain", "maintenance mnt-recovery-1 of gpu-a"),
        ("reboot", "gpu-a rebooted: bootID a -> b"),
        ("validate", "gpu-a validated: 8 GPU(s)"),
        ("release", "gpu-a back in service"),
    ]
    for i, (action, reason) in enumerate(steps):
        step = node_action(action, "gpu-a", reason, actor="service/recovery")
        story.on_event(wire(step, T0 + timedelta(seconds=i)), T0 + timedelta(seconds=i))
    story.flush(everything=True)
    assert [line.split()[0] for line in lines] == ["RECOVERY"] * 4 + ["RELEASE"]
    assert "reboot node/gpu-a: applied" in lines[2] and "bootID a -> b" in lines[2]


def test_a_hung_node_is_told_as_node_lines_and_its_ladder_by_step() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    causes = (
        "Ready=Unknown since 20:00:00 (NodeStatusUnknown: Kubelet stopped posting node status.)"
    )
    hung = f"hung: {causes} (ladder gpu, step 3)"
    cause = NodeCause(
        kind=Unresponsiveness.NOT_READY, condition="Ready", status="Unknown",
        reason="NodeStatusUnknown", message="Kubelet stopped posting node status.", since=T0,
    )  # fmt: skip
    down = NodeHealth(
        node="gpu-a", responsive=False, causes=[cause], since=T0,
        summary=f"gpu-a unresponsive: {causes}",
    )  # fmt: skip
    up = NodeHealth(node="gpu-a", responsive=True, since=T0, summary="gpu-a responsive again")
    ladder = {"ladder": "gpu"}
    steps: list[tuple[str, str, Outcome, dict[str, Any]]] = [
        ("recover", f"gpu-a unresponsive: {causes}: the ladder gpu (reboot, power-cycle, oncall)",
         Outcome.APPLIED, {}),
        ("reboot", "reboot of gpu-a failed: not back within 0:00:20", Outcome.FAILED, {"rung": 0}),
        ("power-off", f"BMC hard power off of gpu-a, {hung}", Outcome.APPLIED,
         {**ladder, "rung": 2, "bmc": "127.0.0.1:623"}),
        ("power-off", "gpu-a is off: the BMC's chassis status says so", Outcome.APPLIED, {}),
        ("fence", f"powered off (the BMC says so): its pods and their volumes may move of gpu-a, {hung}",
         Outcome.APPLIED, {**ladder, "rung": 2, "taint": "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"}),
        ("power-on", f"BMC power on of gpu-a, {hung}", Outcome.APPLIED,
         {**ladder, "rung": 2, "bmc": "127.0.0.1:623"}),
    ]  # fmt: skip
    story.on_event(wire(down, T0), T0)
    for i, (action, reason, outcome, details) in enumerate(steps, start=1):
        at = T0 + timedelta(seconds=i)
        step = node_action(
            action, "gpu-a", reason, actor="service/recovery", outcome=outcome,
            policy="hang", details=details,
        )  # fmt: skip
        story.on_event(wire(step, at), at)
    story.on_event(wire(up, T0 + timedelta(seconds=9)), T0 + timedelta(seconds=9))
    story.flush(everything=True)
    assert [line.split()[0] for line in lines] == ["NODE", *["RECOVERY"] * 6, "NODE"]
    assert lines[0].endswith(f"CRIT gpu-a unresponsive: {causes}")
    said = [line.partition(" node/gpu-a: ")[2] for line in lines[1:-1]]
    assert said == [
        "applied [hang] - gpu-a unresponsive: Ready=Unknown since 20:00:00: the ladder gpu "
        "(reboot, power-cycle, oncall)",
        "failed [hang, step 1] - not back within 0:00:20",
        "applied [hang, step 3] - BMC hard power off (BMC 127.0.0.1:623)",
        "applied [hang] - gpu-a is off: the BMC's chassis status says so",
        "applied [hang, step 3] - out-of-service taint on: powered off (the BMC says so): its "
        "pods and their volumes may move",
        "applied [hang, step 3] - BMC power on (BMC 127.0.0.1:623)",
    ]
    assert lines[-1].endswith("INFO gpu-a responsive again")


def test_a_line_waits_until_every_followed_source_has_delivered_up_to_it() -> None:
    """The decision comes first on AUDIT's subscription; the failure that caused it is
    still on its way on GPU's. Nothing goes out until GPU is known caught up past the
    decision, and nothing waits past `patience` for a source that cannot be asked."""
    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), clock=clock, patience=10)
    for source in ("GPU", "AUDIT"):
        story.follow(source)
    ms = timedelta(milliseconds=1)
    story.seen("AUDIT", T0 + 2 * ms)
    story.on_event(wire_of(quarantine_decision("inc-1", T0 + 2 * ms)), T0 + 2 * ms)  # type: ignore[arg-type]
    story.flush()
    assert lines == [] and story.behind() == ["GPU"]
    story.caught_up("GPU", T0 + ms)  # asked before the decision was stored: not enough
    story.flush()
    assert lines == [] and story.behind() == ["GPU"]
    story.seen("GPU", T0)
    story.on_event(wire(health(HealthState.FAILED, HealthState.HEALTHY), T0), T0)  # type: ignore[arg-type]
    story.caught_up("GPU", T0 + 3 * ms)
    assert story.behind() == []
    story.flush()
    assert [line.split()[0] for line in lines] == ["GPU", "DECISION"]

    # A source that cannot be asked (the bus is away) holds a line `patience` at most.
    story.follow("NOTIFY")
    story.seen("AUDIT", T0 + 9 * ms)
    story.on_event(wire_of(quarantine_decision("inc-2", T0 + 9 * ms)), T0 + 9 * ms)  # type: ignore[arg-type]
    clock.now = 9.9
    story.flush()
    assert len(lines) == 2 and story.behind() == ["GPU", "NOTIFY"]
    clock.now = 10.0
    story.flush()
    assert len(lines) == 3
    # A source that is gone (its stream missing) holds nothing.
    story.unfollow("NOTIFY")
    story.unfollow("GPU")
    story.seen("AUDIT", T0 + 10 * ms)
    story.on_event(wire_of(quarantine_decision("inc-3", T0 + 10 * ms)), T0 + 10 * ms)  # type: ignore[arg-type]
    story.flush()
    assert len(lines) == 4


def test_a_cordon_line_waits_for_the_decision_that_names_its_incident() -> None:
    """The service writes the record before it publishes the decision, so the record may
    come first even with every source caught up; the decision never coming (a service
    killed in between) holds the line `patience` at most."""
    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), clock=clock, patience=10)

    ms = timedelta(milliseconds=1)
    story.on_record("node.gpu-a", applied("inc-1"), T0 + ms)
    story.flush()
    assert lines == []
    story.on_event(wire_of(quarantine_decision("inc-1", T0 + 2 * ms)), T0 + 2 * ms)  # type: ignore[arg-type]
    story.flush()
    assert [line.split()[0] for line in lines] == ["DECISION", "CORDON"]
    story.on_record("node.gpu-b", applied("inc-2"), T0 + 3 * ms)
    clock.now = 9.9
    story.flush()
    assert len(lines) == 2
    clock.now = 10.0
    story.flush()
    assert lines[2].startswith("CORDON ") and "gpu-b" in lines[2]


def _decision(outcome: Outcome, reason: str, action: str = "renew") -> Any:
    return make_event(
        Remediation(
            action=action,
            target=ObjectRef(kind="Secret", name="alice-oauth", namespace="ml-vision"),
            outcome=outcome,
            reason=reason,
            actor="service/credentials",
        ),
        source="service/credentials",
    ).model_copy(update={"time": T0})


def test_levels_mean_something_and_lines_are_short() -> None:
    """A routine renewal is INFO, a refusal WARN; ids are shortened and a long reason is cut
    (`nodeward status --node` and `tail` say the whole)."""
    lines: list[tuple[str, str]] = []
    story = Story(emit=lambda line, sev: lines.append((line, sev)))
    renewed = _decision(Outcome.APPLIED, "due: it would expire at 08:42 UTC")
    story.on_event(wire_of(renewed), T0)  # type: ignore[arg-type]
    note = Notification(
        severity=Severity.INFO, topic="credentials", title="renewed", audit_event_id=renewed.id
    )
    story.on_event(wire(note, T0), T0)  # type: ignore[arg-type]
    incident = "01a23b08-84b0-7d5f-a158-268b65d52b9a"
    long = f"drain for maintenance mnt-recovery-{incident}: " + "every pod but DaemonSets " * 20
    story.on_event(wire_of(_decision(Outcome.REFUSED, long, "drain")), T0)  # type: ignore[arg-type]
    story.flush(everything=True)
    (renew, renew_sev), (drain, drain_sev) = lines
    assert renew.split()[2] == "INFO" and renew_sev == "info", renew
    assert renew.endswith("; notice to oncall (info)")
    assert drain.split()[2] == "WARN" and drain_sev == "warning", drain
    assert "mnt-recovery-01a23b08:" in drain and incident not in drain
    assert len(drain) < 200 and drain.endswith("…"), drain


def test_on_a_terminal_each_line_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns a long decision is one line of 80, cut with `…`; at 200, the whole line
    (its detail cut at `MAX_DETAIL`); in a pipe without `COLUMNS`, whole too."""
    long = "drain for maintenance: " + "every pod but DaemonSets " * 20

    def told(width: Any) -> str:
        lines: list[str] = []
        story = Story(emit=lambda line, _sev: lines.append(line), width=width)
        story.on_event(wire_of(_decision(Outcome.REFUSED, long, "drain")), T0)  # type: ignore[arg-type]
        story.flush(everything=True)
        (line,) = lines
        return line

    monkeypatch.setenv("COLUMNS", "80")
    at_80 = told(line_width)
    assert len(at_80) == 80 and at_80.endswith("…") and at_80.startswith("DECISION")
    monkeypatch.setenv("COLUMNS", "200")
    at_200 = told(line_width)
    assert 80 < len(at_200) <= 200 and at_200[:79] == at_80[:79]
    monkeypatch.delenv("COLUMNS")
    assert told(line_width) == at_200  # pytest's stdout is no terminal: the whole line
