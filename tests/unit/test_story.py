"""The story `nodeward up` prints: one line per step, in the story's order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nodeward.cli.story import Story
from schemas import make_event
from schemas.cloudevents import encode
from schemas.common import ObjectRef
from schemas.gpu import GpuHealth, HealthReason, HealthState
from schemas.notify import Notification, Severity
from schemas.remediation import Outcome, Remediation
from schemas.state.cordon import NodeRecord, Quarantine

T0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


@dataclass
class Wire:
    subject: str
    headers: dict[str, str]
    data: bytes


def wire(data: Any, at: datetime) -> Any:
    event = make_event(data, source="test/story")
    event = event.model_copy(update={"time": at})
    w = encode(event)
    return Wire(w.subject, dict(w.headers), w.body)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def health(state: HealthState, previous: HealthState | None, heartbeat: bool = False) -> GpuHealth:
    return GpuHealth(
        node="gpu-a",
        gpu_index=0,
        gpu_uuid="GPU-0",
        state=state,
        previous_state=previous,
        heartbeat=heartbeat,
        reasons=[HealthReason(code="xid", xid=79, message="fallen off the bus")]
        if state == HealthState.FAILED
        else [],
        observed_at=T0,
    )


def test_lines_come_out_in_the_story_order_whatever_order_they_arrive_in() -> None:
    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)
    decision = Remediation(
        action="quarantine",
        target=ObjectRef(kind="Node", name="gpu-a"),
        outcome=Outcome.APPLIED,
        reason="GPU 0 failed",
        actor="service/cordon",
        trigger_event_id="inc-1",
    )
    notice = Notification(
        severity=Severity.CRITICAL, topic="gpu-health", title="gpu-a: quarantine applied"
    )
    record = NodeRecord(
        quarantine=Quarantine(
            incident="inc-1",
            rule="xid",
            reason="GPU 0 failed",
            gpus=["0"],
            started_at=T0,
            phase="applied",
            cordoned=True,
            taints=["NoSchedule"],
        )
    )
    ms = timedelta(milliseconds=1)
    # The startup report and heartbeats are not news.
    story.on_event(wire(health(HealthState.HEALTHY, None), T0))  # type: ignore[arg-type]
    story.on_event(wire(health(HealthState.HEALTHY, None, heartbeat=True), T0))  # type: ignore[arg-type]
    # Arrival order differs from the story order (separate subscriptions).
    story.on_event(wire(notice, T0 + 3 * ms))  # type: ignore[arg-type]
    story.on_record("node.gpu-a", record.model_dump_json().encode(), T0 + ms)
    story.on_event(wire(decision, T0 + 2 * ms))  # type: ignore[arg-type]
    story.on_event(wire(health(HealthState.FAILED, HealthState.HEALTHY), T0))  # type: ignore[arg-type]
    story.on_file("notice-1.json")
    story.flush()
    assert lines == []  # held until they have waited `hold`
    clock.now = 1.0
    story.flush()
    labels = [line.split()[0] for line in lines]
    assert labels == ["GPU", "DECISION", "CORDON", "NOTIFY", "DELIVERED"]
    assert "healthy -> failed (XID 79: fallen off the bus)" in lines[0]
    assert "quarantine node/gpu-a: applied" in lines[1]
    assert "gpu-a tainted nodeward.io/gpu-unhealthy:NoSchedule, cordoned" in lines[2]
    assert "gpu-a: quarantine applied" in lines[3]
    assert lines[4].endswith("outbox/notice-1.json")
    # The same incident's record again (a later KV write) is not a new step.
    story.on_record("node.gpu-a", record.model_dump_json().encode(), T0 + 5 * ms)
    story.flush(everything=True)
    assert len(lines) == 5


def test_a_release_is_its_own_step() -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0)
    release = Remediation(
        action="release",
        target=ObjectRef(kind="Node", name="gpu-a"),
        outcome=Outcome.APPLIED,
        reason="every GPU healthy for 15s",
        actor="service/cordon",
    )
    story.on_event(wire(release, T0))  # type: ignore[arg-type]
    story.flush(everything=True)
    assert lines[0].startswith("RELEASE ") and "every GPU healthy for 15s" in lines[0]


def test_a_dead_letter_and_a_delivered_file_are_told_too(tmp_path: Path) -> None:
    from nodeward.cli.story import outbox_title
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

    from nodeward.cli.story import watch_outbox
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
    from schemas.session import IdleEvidence, SessionIdle, SessionKind

    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)

    def idle(since: datetime, idle_for: float) -> SessionIdle:
        return SessionIdle(
            namespace="ml-a",
            pod="nb-0",
            node="gpu-a",
            kind=SessionKind.NOTEBOOK,
            idle_since=since,
            idle_for_s=idle_for,
            evidence=[IdleEvidence(signal="cpu", idle_since=since, detail="0.01 cores")],
        )

    for i in range(3):  # the agent restates the same idle period every interval
        story.on_event(wire(idle(T0, 30.0 * (i + 1)), T0 + timedelta(seconds=30 * i)))  # type: ignore[arg-type]
    story.on_event(wire(idle(T0 + timedelta(minutes=5), 30.0), T0 + timedelta(minutes=6)))  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    assert len(lines) == 2
    assert (
        "IDLE" in lines[0]
        and "ml-a/nb-0 on gpu-a idle 30s" in lines[0]
        and "cpu 0.01 cores" in lines[0]
    )


def test_a_falco_alert_is_told_before_its_decisions() -> None:
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
    story.on_event(wire(isolate, T0 + timedelta(milliseconds=5)))  # type: ignore[arg-type]
    story.on_event(wire(alert, T0))  # type: ignore[arg-type]
    test_rule = alert.model_copy(  # Falcosidekick's /test event: not told
        update={
            "rule": "Test rule",
            "source": "internal",
            "priority": FalcoPriority.DEBUG,
            "output": "This is a test from falcosidekick",
        }
    )
    story.on_event(wire(test_rule, T0))  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    assert [line.split()[0] for line in lines] == ["FALCO", "DECISION"]
    assert "Critical 'Drop and execute new binary in container' on pod user-bob/" in lines[0]


def test_restarts_are_one_line_each_and_other_decisions_stay_decisions() -> None:
    from nodeward.supervisor import Restart, restart_audit

    lines: list[str] = []
    clock = Clock()
    story = Story(emit=lambda line, _sev: lines.append(line), hold=0.4, clock=clock)
    died = Restart("cordon", "task consume failed: RuntimeError: boom", 1, 600.0)
    server = restart_audit("nats-server", "exited (signal 9)", "back on 127.0.0.1:4222 after 0.8 s")
    for data in (died.audit(), server):
        story.on_event(wire(data, T0))  # type: ignore[arg-type]
    clock.now = 1.0
    story.flush()
    cordon, nats = lines
    assert cordon.startswith("RESTART ") and nats.startswith("RESTART ")
    assert cordon.endswith(
        " cordon: task consume failed: RuntimeError: boom; restarted (1st time in 10 min)"
    )
    assert nats.endswith(" nats-server: exited (signal 9); back on 127.0.0.1:4222 after 0.8 s")
