"""The kernel's durable workflow engine (`services.kernel.workflow`) against a real NATS KV.

A crash is a `Crash` (a BaseException: nothing in the engine catches it, as nothing runs
after a SIGKILL) raised at a point; the "restarted service" is a new `Workflow` over the
same bucket. The world's side effects are counted per step, so a test sees what a re-run
repeats. The services' own SIGKILL tests (tests/integration/test_recovery.py,
test_maintenance_crash.py) kill real processes at the engine's failpoints.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from pydantic import BaseModel, Field

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.failpoints import Failpoints
from schemas.state.workflow import FlowState
from services.kernel.workflow import Cancelled, Driver, Retry, Step, Workflow, flow_of
from services.maintenance.state import MaintenanceState
from services.recovery.state import RecoveryRecord
from tests.conftest import wait_for

KEY = "job.j1"


class Job(BaseModel):
    id: str
    step: str = "a"
    notes: list[str] = Field(default_factory=list)
    flow: FlowState = Field(default_factory=FlowState)

    @property
    def terminal(self) -> bool:
        return self.step in ("done", "failed", "cancelled")


class Crash(BaseException):
    """The process dies here."""


class CrashAt(Failpoints):
    """The engine's failpoints, crashing at one."""

    def __init__(self, point: str | None) -> None:
        super().__init__()
        self.point = point

    def hit(self, name: str) -> None:
        if name == self.point:
            raise Crash(name)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class World:
    """Side effects, counted; `crash` names the point to die at (`<step>.before`,
    `<step>.after`: around the step's side effect)."""

    def __init__(self, crash: str | None = None) -> None:
        self.done: Counter[str] = Counter()
        self.crash = crash

    def point(self, name: str) -> None:
        if name == self.crash:
            self.crash = None
            raise Crash(name)


def three_steps(
    store: TypedKV[Job],
    world: World,
    *,
    failpoints: Failpoints | None = None,
    clock: Callable[[], float] | None = None,
    more: dict[str, Step[Job]] | None = None,
) -> Workflow[Job]:
    """a -> b -> c -> done; each step does its side effect once (write-ahead: its note
    first, then the effect, then the move), so a re-run after a crash repeats nothing."""
    flow: Workflow[Job]

    def step(name: str, to: str) -> Step[Job]:
        async def run(job: Job) -> float | None:
            if f"{name}: doing" not in job.notes:
                job = await flow.save(
                    job, lambda j: j.model_copy(update={"notes": [*j.notes, f"{name}: doing"]})
                )
            world.point(f"{name}.before")
            if f"{name}: done" not in job.notes:
                world.done[name] += 1  # the effect (idempotent by its note)
                job = await flow.save(
                    job, lambda j: j.model_copy(update={"notes": [*j.notes, f"{name}: done"]})
                )
            world.point(f"{name}.after")
            await flow.advance(job, to)
            return None

        return Step(run)

    steps = {"a": step("a", "b"), "b": step("b", "c"), "c": step("c", "done"), **(more or {})}
    flow = Workflow(
        "job",
        store,
        steps,
        prefix="job.",
        key_of=lambda j: f"job.{j.id}",
        identity=lambda j: j.id,
        step_of=lambda j: j.step,
        with_step=lambda j, to: j.model_copy(update={"step": to}),
        terminal=lambda j: j.terminal,
        cancelled=lambda j: j.step == "cancelled",
        failpoints=failpoints or CrashAt(None),
        clock=clock or Clock(),
    )
    return flow


async def finish(flow: Workflow[Job], key: str = KEY, limit: int = 50) -> Job:
    """Run steps until the workflow ends (a restarted service's loop)."""
    for _ in range(limit):
        assert key in await flow.unfinished() or (await flow.get(key)) is None
        job = await flow.get(key)
        assert job is not None
        stepped = await flow.step(job)
        if stepped.record is not None and stepped.record.terminal:
            return stepped.record
    raise AssertionError(f"not finished after {limit} steps")


@pytest.fixture
async def store(bus: Bus) -> TypedKV[Job]:
    kv = await bus.kv(f"wf-{uuid.uuid4().hex[:10]}", history=5)
    return TypedKV(kv, Job)


CRASHES = [f"{s}.{w}" for s in "abc" for w in ("before", "after")] + ["job.b", "job.c", "job.done"]


@pytest.mark.parametrize("crash", CRASHES)
async def test_a_workflow_killed_at_each_point_resumes_at_its_step_and_repeats_nothing(
    store: TypedKV[Job], crash: str
) -> None:
    world = World(crash if "." in crash and not crash.startswith("job.") else None)
    first = three_steps(
        store, world, failpoints=CrashAt(crash if crash.startswith("job.") else None)
    )
    await store.put(KEY, Job(id="j1"))
    with pytest.raises(Crash):
        await finish(first)
    stopped = await first.get(KEY)
    assert stopped is not None and stopped.terminal == (crash == "job.done")
    # A restarted service: a new engine over the same bucket finds it and goes on.
    again = three_steps(store, world)
    if crash == "job.done":  # killed right after its last write: nothing left to resume
        assert await again.unfinished() == []
    else:
        assert await again.unfinished() == [KEY]
        assert (await finish(again)).step == "done"
    assert world.done == Counter({"a": 1, "b": 1, "c": 1})
    assert await again.unfinished() == []


async def test_a_lost_race_reads_again_and_never_overwrites(store: TypedKV[Job]) -> None:
    await store.put(KEY, Job(id="j1"))
    # Two replicas' engines, each with its own view of the bucket (a remembered revision).
    replicas = [three_steps(TypedKV(store.kv, Job, remember=8), World()) for _ in range(2)]
    job = await replicas[0].get(KEY)
    assert job is not None

    async def note(flow: Workflow[Job], text: str) -> None:
        await flow.save(job, lambda j: j.model_copy(update={"notes": [*j.notes, text]}))

    await asyncio.gather(*(note(replicas[i % 2], f"n{i}") for i in range(20)))
    stored = await replicas[1].get(KEY)
    assert stored is not None
    assert sorted(stored.notes) == sorted(f"n{i}" for i in range(20))  # none lost


async def test_a_step_past_its_deadline_ends_as_the_workflow_declares(store: TypedKV[Job]) -> None:
    clock = Clock()
    expired: list[str] = []
    flow: Workflow[Job]

    async def waits(job: Job) -> float | None:
        return 5.0  # the condition it waits for never comes

    async def give_up(job: Job, why: str) -> None:
        expired.append(why)
        await flow.advance(job, "failed")

    wait = Step(waits, deadline=lambda j: (j.flow.entered_at or 0) + 30, expired=give_up)
    flow = three_steps(store, World(), clock=clock, more={"b": wait})
    await store.put(KEY, Job(id="j1"))
    job = await flow.get(KEY)
    assert job is not None
    await flow.step(job)  # a -> b, entered at 1000
    job = await flow.get(KEY)
    assert job is not None and job.step == "b" and job.flow.entered_at == 1_000.0
    clock.now += 10
    stepped = await flow.step(job)
    assert not stepped.moved and stepped.wait_s == 5.0  # within its deadline: it waits
    clock.now += 25
    stepped = await flow.step(job)
    assert stepped.moved and stepped.record is not None and stepped.record.step == "failed"
    assert expired == ["step b past its deadline"]


async def test_a_failing_step_backs_off_bounded_then_its_handler_ends_it(
    store: TypedKV[Job],
) -> None:
    clock = Clock()
    ended: list[str] = []
    flow: Workflow[Job]

    async def broken(job: Job) -> float | None:
        raise RuntimeError("the API is down")

    async def escalate(job: Job, why: str) -> None:
        ended.append(why)
        await flow.advance(job, "failed")

    retry = Retry(first_s=1.0, cap_s=3.0, limit=4)
    flow = three_steps(
        store, World(), clock=clock, more={"a": Step(broken, retry=retry, exhausted=escalate)}
    )
    await store.put(KEY, Job(id="j1"))
    waits = []
    for _ in range(3):
        job = await flow.get(KEY)
        assert job is not None
        stepped = await flow.step(job)
        assert not stepped.moved
        waits.append(stepped.wait_s)
        again = await flow.step(stepped.record)  # type: ignore[arg-type]
        assert again.wait_s is not None and again.wait_s > 0  # not before its back-off
        clock.now += stepped.wait_s or 0
    assert waits == [1.0, 2.0, 3.0]  # doubling, capped
    job = await flow.get(KEY)
    assert job is not None and job.flow.attempts == 3 and job.flow.error == "the API is down"
    stepped = await flow.step(job)
    assert stepped.record is not None and stepped.record.step == "failed"
    assert ended == ["4 failed tries; last: the API is down"]


async def test_a_cancel_stops_the_workflow_and_its_steps_write_no_more(
    store: TypedKV[Job],
) -> None:
    undone: list[str] = []
    entered = asyncio.Event()
    proceed = asyncio.Event()
    flow: Workflow[Job]

    async def slow(job: Job) -> float | None:
        entered.set()
        await proceed.wait()  # the cancel lands while the step works
        await flow.save(job, lambda j: j.model_copy(update={"notes": [*j.notes, "late"]}))
        await flow.advance(job, "b")
        return None

    async def take_back(job: Job) -> None:
        undone.append(job.id)

    flow = three_steps(store, World(), more={"a": Step(slow)})
    flow.on_cancelled = take_back
    await store.put(KEY, Job(id="j1"))
    job = await flow.get(KEY)
    assert job is not None
    running = asyncio.create_task(flow.step(job))
    await entered.wait()
    cancelled = await flow.cancel(
        job, "operator/jdoe", lambda j: j.model_copy(update={"step": "cancelled"})
    )
    assert cancelled is not None and cancelled.flow.cancel_requested == "operator/jdoe"
    proceed.set()
    stepped = await running
    assert stepped.moved and stepped.record is not None and stepped.record.step == "cancelled"
    assert "late" not in stepped.record.notes  # the step's write after the cancel: refused
    with pytest.raises(Cancelled):
        await flow.save(job, lambda j: j)
    await flow.step(stepped.record)
    assert undone == ["j1"]  # what it left is taken back
    assert await flow.unfinished() == []
    # A cancel of a workflow that ended is refused.
    assert await flow.cancel(stepped.record, "operator/x", lambda j: j) is None


async def test_each_keeps_a_durable_cursor_across_a_crash(store: TypedKV[Job]) -> None:
    items = [f"pod-{i}" for i in range(6)]
    acted: Counter[str] = Counter()
    crash = {"pod-3"}
    dead: list[str] = []
    flow: Workflow[Job]

    async def one(item: str) -> bool:
        if item in crash or dead:  # the process died at pod-3: nothing after it runs
            crash.clear()
            dead.append(item)
            raise Crash(item)
        acted[item] += 1
        return True

    async def per_pod(job: Job) -> float | None:
        if await flow.each(job, items, one, parallelism=1):
            await flow.advance(job, "done")
        return None

    flow = three_steps(store, World(), more={"a": Step(per_pod)})
    await store.put(KEY, Job(id="j1"))
    with pytest.raises(Crash):
        await finish(flow)
    job = await flow.get(KEY)
    assert job is not None and job.flow.cursor == {"a": ["pod-0", "pod-1", "pod-2"]}
    dead.clear()
    assert (await finish(three_steps(store, World(), more={"a": Step(per_pod)}))).step == "done"
    assert acted == Counter(dict.fromkeys(items, 1))  # each pod once, the crash included


@pytest.mark.parametrize(
    ("model", "raw"),
    [
        (
            RecoveryRecord,
            {
                "node": "n1",
                "incident": "i1",
                "plan": "reboot",
                "remediator": "reboot-annotation",
                "step": "rebooting",
                "started_at": 1.0,
                "updated_at": 2.0,
            },
        ),
        (
            MaintenanceState,
            {
                "maintenance_id": "m1",
                "node": "n1",
                "phase": "checkpointing",
                "requested_at": "2026-01-01T00:00:00Z",
                "trigger_id": "t1",
                "start_at": "2026-01-01T00:00:00Z",
                "deadline_s": 60,
            },
        ),
    ],
)
async def test_a_record_from_before_the_engine_loads_at_its_step(
    bus: Bus, model: type[BaseModel], raw: dict[str, object]
) -> None:
    # An upgrade with workflows in flight: the older release wrote no `flow`.
    kv = await bus.kv(f"wf-{uuid.uuid4().hex[:10]}", history=5)
    await kv.put("node.n1", json.dumps(raw).encode())
    stored = await TypedKV(kv, model).get("node.n1")
    assert stored is not None
    assert flow_of(stored.value) == FlowState()
    step = "step" if "step" in raw else "phase"
    assert stored.value.model_dump(mode="json")[step] == raw[step]  # resumed where it was


async def test_the_driver_runs_each_unfinished_workflow_to_its_end_and_halts(
    store: TypedKV[Job],
) -> None:
    world = World()
    flow = three_steps(store, world)
    for i in range(3):
        await store.put(f"job.{i}", Job(id=str(i)))
    await store.put("job.ended", Job(id="ended", step="done"))
    driver = Driver(flow, tick=0.05)
    await driver.spawn()
    assert sorted(driver.tasks) == ["job.0", "job.1", "job.2"]  # not the one that ended

    async def all_done() -> bool:
        return await flow.unfinished() == []

    await wait_for(all_done, what="every workflow done")
    await driver.stop()
    assert world.done == Counter({"a": 3, "b": 3, "c": 3})
    # Halted, a new workflow is not stepped.
    await store.put("job.late", Job(id="late"))
    await driver.spawn()
    await asyncio.gather(*driver.tasks.values())
    late = await flow.get("job.late")
    assert late is not None and late.step == "a"
