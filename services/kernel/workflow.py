"""A durable workflow: named steps, its state one KV record written with revision checks.

A workflow is a record type `R` (a pydantic model the service owns: what it decides from)
carrying a `FlowState` (`flow`: the engine's bookkeeping) and a current step (a field of
the service's record, so that readers keep reading it where they did), and a table of
named steps, each a plain async function of the record. `Workflow.step` runs the current
step once:

- a record that ended (`terminal`), or that was cancelled, is not run (`on_cancelled` takes
  back what the cancelled workflow left, once, in the process that sees it);
- the step either moves the workflow on (`Workflow.advance`, one revision-checked write of
  the new step and whatever the step decided with it) or waits (returns how long, None for
  the driver's tick);
- a step that raised is retried with a bounded exponential back-off (`Retry`; attempts and
  the next try are written to the record, so a restart keeps counting); past its `limit`
  the step's `exhausted` handler ends or escalates the workflow;
- a step that still waits past its `deadline` (unix time, from the record: e.g. the step's
  `flow.entered_at` plus a timeout) gets its `expired` handler (fail, escalate, or another
  step), as the workflow declares.

Every write is `TypedKV.update`: read, change, write only if nobody wrote in between; a
lost race re-reads and applies the change again, never overwriting. A change to a record
that is no longer this workflow (another id under the key) or that was cancelled is not
written (`Gone`, `Cancelled`).

Crash safety (a SIGKILL at any point): the record says which step runs; a restarted
service finds every unfinished record (`Workflow.unfinished`) and runs its step again. So a
step is idempotent, or records its progress before its side effect (write-ahead), and every
act in it is a kernel proposal (`ActionRunner.run`: guards, audit, notice) whose audit id is
derived from the workflow, so an act re-done after a crash is audited once. Iteration over
items inside a step (pods) keeps a durable cursor: `Workflow.each` records each item done
in `flow.cursor[step]`, and a re-run skips them.

`Driver` runs every unfinished workflow as its own task (one per key), for a service that
drives them concurrently under a lease; a service may instead call `Workflow.step` from its
own loop (one pass over every key).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from nats.js.errors import NoKeysError
from pydantic import BaseModel

from nodeward.aio import within
from nodeward.bus.kv import TypedKV
from nodeward.failpoints import Failpoints
from schemas.state.workflow import FlowState


def terminal_of(record: BaseModel) -> bool:
    """Whether a record's workflow has ended (its property `terminal`)."""
    terminal = getattr(record, "terminal", None)
    if not isinstance(terminal, bool):
        raise TypeError(f"{type(record).__name__} has no `terminal: bool` property")
    return terminal


def flow_of(record: BaseModel) -> FlowState:
    """The engine's part of a record (its field `flow`)."""
    flow = getattr(record, "flow", None)
    if not isinstance(flow, FlowState):
        raise TypeError(f"{type(record).__name__} has no `flow: FlowState` field")
    return flow


R = TypeVar("R", bound=BaseModel)
"""A workflow's record: a pydantic model with a field `flow: FlowState`."""

StepFn = Callable[[R], Awaitable[float | None]]
"""A step: moves the workflow on (`Workflow.advance`) or returns how long to wait (None: the
driver's tick). Idempotent, or write-ahead: run again after a crash, it does no harm."""
Handler = Callable[[R, str], Awaitable[None]]
"""What ends a step past its deadline or its retries: `handler(record, why)`."""


class Gone(RuntimeError):
    """The record under the key is no longer this workflow (deleted, or a newer one)."""


class Cancelled(RuntimeError):
    """The workflow was cancelled: it changes the record no more."""


@dataclass(frozen=True)
class Retry:
    """A failed step is tried again after `first_s`, doubling up to `cap_s`; after `limit`
    failures in a row (None: never) the step's `exhausted` handler runs."""

    first_s: float = 1.0
    cap_s: float = 60.0
    limit: int | None = None

    def delay(self, attempts: int) -> float:
        return float(min(self.cap_s, self.first_s * 2 ** max(attempts - 1, 0)))


@dataclass(frozen=True)
class Step(Generic[R]):
    """One named step: its function, deadline and what past it, retries and what after them."""

    run: StepFn[R]
    deadline: Callable[[R], float | None] | None = None
    expired: Handler[R] | None = None
    retry: Retry = Retry()
    exhausted: Handler[R] | None = None


@dataclass(frozen=True)
class Stepped(Generic[R]):
    """What one `Workflow.step` came to: the record after it (None: gone), whether the step
    changed, and how long to wait before the next (None: the driver's tick)."""

    record: R | None
    moved: bool
    wait_s: float | None = None


@dataclass(eq=False)
class Workflow(Generic[R]):
    """The steps of one kind of workflow over its records in one bucket (`prefix` keys).

    `step_of`/`with_step`: where the record keeps its current step; `identity`: what tells
    one workflow from the next under the same key; `terminal`: ended (by default the
    record's property `terminal`); `cancelled`: ended by a cancel (`on_cancelled` then takes
    back what is left); `errors`: failures expected of a step (logged as warnings, others
    with their traceback), both retried.
    """

    name: str
    store: TypedKV[R]
    steps: Mapping[str, Step[R]]
    _: KW_ONLY
    prefix: str
    key_of: Callable[[R], str]
    identity: Callable[[R], str]
    step_of: Callable[[R], str]
    with_step: Callable[[R, str], R]
    terminal: Callable[[R], bool] = terminal_of
    cancelled: Callable[[R], bool] = lambda r: flow_of(r).cancel_requested is not None
    on_cancelled: Callable[[R], Awaitable[None]] | None = None
    errors: tuple[type[BaseException], ...] = ()
    failpoints: Failpoints = field(default_factory=Failpoints.from_env)
    clock: Callable[[], float] = time.time
    log: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.log = structlog.get_logger().bind(workflow=self.name)

    # the record -------------------------------------------------------------------------
    async def get(self, key: str) -> R | None:
        found = await self.store.get(key)
        return found.value if found else None

    async def unfinished(self) -> list[str]:
        """The keys of every workflow not ended (what a restarted service resumes)."""
        try:
            keys = await self.store.kv.keys()
        except NoKeysError:
            return []
        found = []
        for key in keys:
            if not key.startswith(self.prefix):
                continue
            record = await self.get(key)
            if record is not None and not self.terminal(record):
                found.append(key)
        return found

    async def save(self, record: R, change: Callable[[R], R], *, cancelled_too: bool = False) -> R:
        """Apply `change` to the stored record of this workflow, revision-checked (a lost
        race applies it again to what won). Raises `Gone` or `Cancelled` (unless
        `cancelled_too`: a cancel's own bookkeeping) instead of writing."""
        ident = self.identity(record)

        def apply(current: R | None) -> R | None:
            if current is None or self.identity(current) != ident:
                return None
            if self.cancelled(current) and not cancelled_too:
                return None
            return change(current)

        stored = await self.store.update(self.key_of(record), apply)
        if stored is None or self.identity(stored.value) != ident:
            raise Gone(f"{self.name} {ident} is no longer stored")
        if self.cancelled(stored.value) and not cancelled_too:
            raise Cancelled(f"{self.name} {ident} was cancelled")
        return stored.value

    async def advance(self, record: R, to: str, change: Callable[[R], R] | None = None) -> R:
        """Move on to step `to`, with what the step decided (`change`), in one write; the
        new step starts with no failures and an empty cursor."""

        def moved(current: R) -> R:
            current = change(current) if change else current
            if self.step_of(current) == to:
                return current  # a note within the step: its bookkeeping stays
            flow = FlowState(
                entered_at=self.clock(), cancel_requested=flow_of(current).cancel_requested
            )
            return self.with_step(current, to).model_copy(update={"flow": flow})

        saved = await self.save(record, moved)
        self.failpoints.hit(f"{self.name}.{to}")  # crash tests: after each step's write
        return saved

    async def cancel(
        self,
        record: R,
        by: str,
        change: Callable[[R], R | None],
    ) -> R | None:
        """Cancel the workflow (an operator's control): `change` is the cancelled record
        (its terminal step), or None when it may not be cancelled now; written once,
        revision-checked. Returns the cancelled record, or None."""
        ident = self.identity(record)

        def apply(current: R | None) -> R | None:
            if current is None or self.identity(current) != ident or self.terminal(current):
                return None
            new = change(current)
            if new is None:
                return None
            flow = flow_of(new).model_copy(update={"cancel_requested": by})
            return new.model_copy(update={"flow": flow})

        stored = await self.store.update(self.key_of(record), apply)
        if stored is None or self.identity(stored.value) != ident:
            return None
        return stored.value if flow_of(stored.value).cancel_requested == by else None

    async def each(
        self,
        record: R,
        items: Iterable[str],
        act: Callable[[str], Awaitable[bool]],
        *,
        parallelism: int = 1,
        halt: asyncio.Event | None = None,
    ) -> bool:
        """Run `act(item)` for every item of the current step not done yet (at most
        `parallelism` at once); an item whose act returns True is recorded done in the
        step's cursor, so a re-run after a crash skips it. Every act in flight ends before
        this returns; then the first error, if any, is raised. With `halt` set no new item
        starts. True when every item is done."""
        step = self.step_of(record)
        done = set(flow_of(record).cursor.get(step, []))
        todo = [item for item in items if item not in done]
        gate = asyncio.Semaphore(parallelism)
        finished: list[str] = []

        async def one(item: str) -> None:
            async with gate:
                if halt is not None and halt.is_set():
                    return
                if not await act(item):
                    return

                def mark(current: R) -> R:
                    cursor = dict(flow_of(current).cursor)
                    cursor[step] = [*cursor.get(step, []), item]
                    return current.model_copy(
                        update={"flow": flow_of(current).model_copy(update={"cursor": cursor})}
                    )

                await self.save(record, mark)
                finished.append(item)
                self.failpoints.hit(f"{self.name}.{step}.item")  # crash tests: after each

        results = await asyncio.gather(*(one(i) for i in todo), return_exceptions=True)
        for error in results:
            if isinstance(error, BaseException):
                raise error
        return len(finished) == len(todo)

    # one step ---------------------------------------------------------------------------
    async def step(self, record: R) -> Stepped[R]:
        """Run the record's current step once (see the module's docstring)."""
        if self.cancelled(record):
            if self.on_cancelled is not None:
                await self.on_cancelled(record)
            return Stepped(record, moved=False)
        if self.terminal(record):
            return Stepped(record, moved=False)
        name = self.step_of(record)
        spec = self.steps[name]
        now = self.clock()
        not_before = flow_of(record).not_before
        if not_before is not None and now < not_before:
            return Stepped(record, moved=False, wait_s=not_before - now)
        log = self.log.bind(step=name)
        try:
            wait = await spec.run(record)
        except (Gone, Cancelled) as exc:
            log.info("workflow.stopped", why=str(exc))
            return Stepped(await self.get(self.key_of(record)), moved=True)
        except Exception as exc:
            if isinstance(exc, self.errors):
                log.warning("workflow.step_failed", error=str(exc))
            else:
                log.exception("workflow.step_error")
            return await self._failed(record, spec, exc)
        after = await self.get(self.key_of(record))
        if after is None or self.identity(after) != self.identity(record):
            return Stepped(after, moved=True)
        if self.step_of(after) != name or self.terminal(after) or self.cancelled(after):
            return Stepped(after, moved=True)
        if flow_of(after).attempts:  # it ran: the failures before are over
            after = await self._bookkeep(after, attempts=0, not_before=None, error=None)
        deadline = spec.deadline(after) if spec.deadline else None
        if deadline is not None and self.clock() >= deadline and spec.expired is not None:
            why = f"step {name} past its deadline"
            log.warning("workflow.expired", deadline=deadline)
            await spec.expired(after, why)
            return Stepped(await self.get(self.key_of(record)), moved=True)
        if deadline is not None:
            left = max(deadline - self.clock(), 0.0)
            wait = left if wait is None else min(wait, left)
        return Stepped(after, moved=False, wait_s=wait)

    async def _failed(self, record: R, spec: Step[R], exc: Exception) -> Stepped[R]:
        current = await self.get(self.key_of(record))
        if current is None or self.identity(current) != self.identity(record):
            return Stepped(current, moved=True)
        if self.step_of(current) != self.step_of(record) or self.cancelled(current):
            return Stepped(current, moved=True)  # it moved on before it failed
        attempts = flow_of(current).attempts + 1
        why = str(exc) or type(exc).__name__
        if spec.retry.limit is not None and attempts >= spec.retry.limit and spec.exhausted:
            await spec.exhausted(current, f"{attempts} failed tries; last: {why}")
            return Stepped(await self.get(self.key_of(record)), moved=True)
        delay = spec.retry.delay(attempts)
        try:
            current = await self._bookkeep(
                current, attempts=attempts, not_before=self.clock() + delay, error=why[:500]
            )
        except (Gone, Cancelled):
            return Stepped(await self.get(self.key_of(record)), moved=True)
        return Stepped(current, moved=False, wait_s=delay)

    async def _bookkeep(self, record: R, **flow: Any) -> R:
        return await self.save(
            record,
            lambda r: r.model_copy(update={"flow": flow_of(r).model_copy(update=flow)}),
        )


class Driver(Generic[R]):
    """Runs every unfinished workflow of `workflow` as its own task until it ends, waits
    between steps (`tick` at most, or until woken), and stops starting steps when halted."""

    def __init__(self, workflow: Workflow[R], *, tick: float) -> None:
        self.workflow = workflow
        self.tick = tick
        self.halt = asyncio.Event()
        """Set: no new step starts (the ones running finish)."""
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._wakes: dict[str, asyncio.Event] = {}

    def wake(self, key: str | None = None) -> None:
        """Run `key`'s next step now (None: every workflow's)."""
        for k, event in self._wakes.items():
            if key is None or k == key:
                event.set()

    async def spawn(self) -> None:
        """Start a task for each unfinished workflow that has none."""
        for key in await self.workflow.unfinished():
            task = self.tasks.get(key)
            if task is None or task.done():
                self.tasks[key] = asyncio.create_task(self._run(key))

    async def stop(self) -> None:
        """Halt, and let the steps in flight finish."""
        self.halt.set()
        running = [t for t in self.tasks.values() if not t.done()]
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _run(self, key: str) -> None:
        wake = self._wakes.setdefault(key, asyncio.Event())
        with structlog.contextvars.bound_contextvars(key=key):
            while not self.halt.is_set():
                wake.clear()
                record = await self.workflow.get(key)
                if record is None:
                    return
                try:
                    stepped = await self.workflow.step(record)
                except Exception:
                    self.workflow.log.exception("workflow.driver_failed")
                    stepped = Stepped(record, moved=False)
                after = stepped.record
                if after is None or self.workflow.terminal(after):
                    if after is not None and self.workflow.cancelled(after) and stepped.moved:
                        await self.workflow.step(after)  # its on_cancelled, here and now
                    return
                if stepped.moved:
                    continue
                wait = self.tick if stepped.wait_s is None else min(stepped.wait_s, self.tick)
                with contextlib.suppress(TimeoutError):
                    await within(_first(self.halt, wake), max(wait, 0.05))


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
