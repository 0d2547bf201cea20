"""A service declared once: handlers registered by decorator, one call builds its daemon.

A service states what it is in one `Service` object in its `service.py`: its name, settings
section, Kubernetes access, the KV buckets it owns and the subjects it publishes. Its
handlers are plain async functions (or methods) registered on it by decorator, as kopf's
`@kopf.on.event` are:

    app = Service("sweeper", settings=SweeperSettings, access=ACCESS, buckets=("sweeper",))

    @app.prepare                        # optional: checks before anything is connected
    async def prepare(config: SweeperSettings) -> Policy: ...

    @app.setup
    async def setup(rt: Runtime[SweeperSettings]) -> Sweeper: ...

    @app.consumes("SESSIONS", subjects=setting("subjects"), types=[SessionIdle],
                  order_key=lambda e: e.data.pod, retry_delays=(1.0, 5.0), max_deliver=8)
    async def on_idle(sweeper: Sweeper, event, delivery) -> None: ...

    @app.control("release")             # answers control.sweeper.release
    @app.task("sweep")                  # a long-lived task: async def sweep(sweeper)
    @app.ready("swept")                 # a readiness check: def swept(sweeper) -> bool

    component, standalone = app.daemon()

`app.build(settings)` makes the daemon (its bus, its cluster port when it declares access),
runs `setup` once for the object the handlers act on, starts a durable consumer per
declaration (per lane for laned ones), answers the controls, runs the tasks and adds the
readiness checks; a daemon is ready once every declared consumer is bound. The durable names,
and from them the NATS grants (`grants()`: consumers, buckets, outputs, controls, partitioned
durables), come from the declarations evaluated on the settings' defaults, so a consumer
name is written in one place: the durable is the section's `consumer` (the service's name if
it has none) and the declaration's `suffix`. A service's plugin names its declarations
(`ServicePlugin(handlers="service:app")`) and `launch.access` takes its grants from them. The
metrics follow the declarations too: each consumer's are labelled with its derived durable
(`nodeward.bus`), each control's answers are counted per verb and reply status
(`nodeward_control_answers_total`), and the publish failures of every event type its grants
let it publish start at 0 (`nodeward_publish_failures_total`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from nats.js.kv import KeyValue
from prometheus_client import Counter

from nodeward.bus import Bus, ConsumerSpec, Delivery, Handler
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.config import Section, Settings, section
from nodeward.daemon import Daemon, TaskFactory
from nodeward.kube import Access, Cluster
from nodeward.nats_auth import ServiceGrants, service_publish
from nodeward.platform import Component, Standalone, UpContext, acting_daemon, bus_daemon
from schemas.base import Event
from schemas.control import ControlReply, ControlRequest

C = TypeVar("C", bound=Section)
T = TypeVar("T")

EventHandler = Callable[[Any, Event[Any], Delivery], Awaitable[None]]
"""`async def handler(service, event, delivery)`: `service` is what `setup` returned."""
ControlAnswer = Callable[[Any, ControlRequest], Awaitable[ControlReply]]
TaskBody = Callable[[Any], Awaitable[Any]]
Lanes = Callable[[str, Any], list[tuple[str, list[str]]]]
"""(base durable, settings section) -> (durable, subjects) per lane (`nodeward.bus.lanes`)."""


class Consuming(Section):
    """The base of a settings section whose service declares consumers."""

    consumer: str | None = None
    """the durable consumers' base name (`<consumer>`, `<consumer>-<suffix>`, per lane
    `<consumer>-urgent`); the service's name if unset"""


@dataclass(frozen=True)
class FromSettings(Generic[T]):
    """A declared value read from the service's settings section when the daemon is built."""

    read: Callable[[Any], T]


def setting(name: str) -> FromSettings[Any]:
    """The section's field `name`, a dotted path into a nested section (`xid_repeats.enabled`);
    a list is given as a tuple."""

    def read(config: Any) -> Any:
        value = config
        for part in name.split("."):
            value = getattr(value, part)
        return tuple(value) if isinstance(value, list) else value

    return FromSettings(read)


def _value(value: Any, config: Any) -> Any:
    return value.read(config) if isinstance(value, FromSettings) else value


@dataclass(frozen=True)
class Consumes:
    """One declared consumer: what it takes, how it retries, who handles it."""

    handler: EventHandler
    stream: str
    subjects: tuple[str, ...] | FromSettings[Any]
    types: frozenset[str]
    suffix: str | None = None
    """The durable is `<base>-<suffix>`; `<base>` itself without one."""
    lanes: Lanes | None = None
    leases: Callable[[Any], KeyValue] | None = None
    """Partitioned across replicas when `bus.partitions` > 1, its leases in this bucket."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """`ConsumerSpec` fields, each a value or `setting(...)`."""
    when: bool | FromSettings[Any] = True
    """Whether it runs (e.g. `setting("xids_enabled")`); granted either way."""

    def durable(self, base: str) -> str:
        return base if self.suffix is None else f"{base}-{self.suffix}"

    def specs(self, base: str, config: Any, *, every: bool = False) -> list[ConsumerSpec]:
        """Its consumers under `config`: one, or one per lane; none when it is off, unless
        `every` (what may run: its grants)."""
        if not every and not _value(self.when, config):
            return []
        subjects = list(_value(self.subjects, config))
        found = (
            self.lanes(self.durable(base), config)
            if self.lanes is not None
            else [(self.durable(base), subjects)]
        )
        options = {k: _value(v, config) for k, v in self.options.items()}
        return [
            ConsumerSpec(
                name=name, stream=self.stream, subjects=tuple(lane), types=self.types, **options
            )
            for name, lane in found
        ]


@dataclass(frozen=True)
class Task:
    name: str
    body: TaskBody
    graceful: bool = False


@dataclass
class Runtime(Generic[C]):
    """What `setup` builds the service from: its settings, daemon, bus and cluster."""

    name: str
    settings: Settings
    config: C
    daemon: Daemon
    bus: Bus
    cluster: Cluster | None
    up: UpContext | None = None
    """The `nodeward up` context, when `up` builds it."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """What the caller of `build` passed besides the settings."""
    prepared: Any = None
    """What `@prepare` returned (None without one)."""
    source: str = ""
    """Its events' source and its audits' actor: `service/<name>`."""

    @property
    def acting(self) -> Cluster:
        """The cluster port (a service that declares `access` has one)."""
        if self.cluster is None:
            raise RuntimeError(f"{self.name} declares no Kubernetes access")
        return self.cluster

    async def kv(self, bucket: str, *, history: int = 5, ttl_s: float | None = None) -> KeyValue:
        return await self.bus.kv(bucket, history=history, ttl_s=ttl_s)


@dataclass(frozen=True)
class Built(Generic[T]):
    """A built daemon and the object its handlers act on."""

    daemon: Daemon
    service: T


class Service(Generic[C]):
    """One service's declarations (see the module's docstring). Decorators only register:
    the functions are returned as they are, so a method can be declared in its class."""

    def __init__(
        self,
        name: str,
        *,
        settings: type[C],
        access: Access | None = None,
        buckets: Sequence[str] = (),
        publishes: Sequence[str] = (),
        reads: Sequence[str] = (),
        source: str | None = None,
        one_lease: bool = False,
    ) -> None:
        """`reads`: streams whose newest messages it reads by direct get (read-only, no
        consumer; `nodeward.bus.snapshot.last_stored_times`). `one_lease`: with `bus.partitions` > 1, its consumers that declare leases are
        claimed together, partition i of each by one replica (one lease group named after
        its durables' base), e.g. a node's changes and heartbeats in one place."""
        self.name = name
        self.one_lease = one_lease
        self._claimed: Callable[[Any, PartitionedConsumer], None] | None = None
        self.settings_model = settings
        self.access = access
        self.buckets = tuple(buckets)
        self.publishes = tuple(publishes)
        self.reads = tuple(reads)
        self.source = source or f"service/{name}"
        self._setup: Callable[[Runtime[C]], Awaitable[Any]] | None = None
        self._prepare: Callable[[C], Awaitable[Any]] | None = None
        self.consumers: list[Consumes] = []
        self.controls: dict[str, ControlAnswer] = {}
        self.tasks: list[Task] = []
        self.checks: dict[str, Callable[[Any], bool]] = {}

    # -- declaring ------------------------------------------------------------------------

    def setup(
        self, fn: Callable[[Runtime[C]], Awaitable[T]]
    ) -> Callable[[Runtime[C]], Awaitable[T]]:
        """`async def setup(rt) -> service`: the object every handler gets first."""
        self._setup = fn
        return fn

    def prepare(self, fn: Callable[[C], Awaitable[T]]) -> Callable[[C], Awaitable[T]]:
        """`async def prepare(config) -> anything`, run before anything is connected: a
        setting that cannot work fails here in one line (`ConfigError`), with nothing to
        close; `setup` finds its result in `rt.prepared`."""
        self._prepare = fn
        return fn

    def claimed(
        self, fn: Callable[[Any, PartitionedConsumer], None]
    ) -> Callable[[Any, PartitionedConsumer], None]:
        """`def claimed(service, group)`: told the lease group once it runs (`one_lease`),
        to ask it which keys this replica owns."""
        self._claimed = fn
        return fn

    def consumes(
        self,
        stream: str,
        *,
        subjects: Sequence[str] | FromSettings[Any],
        types: Iterable[str | type[Any]],
        suffix: str | None = None,
        lanes: Lanes | None = None,
        leases: Callable[[Any], KeyValue] | None = None,
        when: bool | FromSettings[Any] = True,
        **options: Any,
    ) -> Callable[[EventHandler], EventHandler]:
        """Declare a durable consumer on `stream` handled by the decorated function.

        `types`: event types (or event data models, their `TYPE`); `options`: any other
        `ConsumerSpec` field (`order_key`, `retry_delays`, `max_deliver`, `concurrency`,
        `ack_wait`, `identity`, ...), each a value or `setting(name)`."""
        known = ConsumerSpec.__dataclass_fields__
        unknown = sorted(
            set(options) - set(known) | ({"name", "stream", "subjects"} & set(options))
        )
        if unknown:
            raise TypeError(f"{self.name}: not consumer options: {', '.join(unknown)}")
        names = frozenset(t if isinstance(t, str) else str(t.TYPE) for t in types)
        fixed = subjects if isinstance(subjects, FromSettings) else tuple(subjects)

        def register(fn: EventHandler) -> EventHandler:
            self.consumers.append(
                Consumes(fn, stream, fixed, names, suffix, lanes, leases, dict(options), when)
            )
            return fn

        return register

    def control(self, verb: str) -> Callable[[ControlAnswer], ControlAnswer]:
        """Answer `control.<service>.<verb>` (`nodeward.bus.control`)."""

        def register(fn: ControlAnswer) -> ControlAnswer:
            self.controls[verb] = fn
            return fn

        return register

    def task(self, name: str, *, graceful: bool = False) -> Callable[[TaskBody], TaskBody]:
        """Run the decorated `async def task(service)` for the daemon's life."""

        def register(fn: TaskBody) -> TaskBody:
            self.tasks.append(Task(name, fn, graceful))
            return fn

        return register

    def ready(self, name: str) -> Callable[[Callable[[Any], bool]], Callable[[Any], bool]]:
        """A readiness check, `def check(service) -> bool`."""

        def register(fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
            self.checks[name] = fn
            return fn

        return register

    # -- derived --------------------------------------------------------------------------

    def base(self, config: Any) -> str:
        """The durables' base name: the section's `consumer`, else the service's name."""
        return str(getattr(config, "consumer", None) or self.name)

    def specs(self, config: C, *, every: bool = False) -> list[tuple[Consumes, ConsumerSpec]]:
        """The consumers that run under `config` (`every`: all that may run)."""
        base = self.base(config)
        return [(c, s) for c in self.consumers for s in c.specs(base, config, every=every)]

    def grants(self) -> ServiceGrants:
        """Its NATS grants, from the declarations on the settings' defaults."""
        specs = self.specs(self.settings_model(), every=True)
        return ServiceGrants(
            consumers=tuple(dict.fromkeys((s.stream, s.name) for _, s in specs)),
            buckets=self.buckets,
            publish=self.publishes,
            controls=tuple(self.controls),
            reads=self.reads,
            partitioned=tuple(dict.fromkeys(s.name for c, s in specs if c.leases is not None)),
        )

    # -- building -------------------------------------------------------------------------

    async def assemble(
        self, settings: Settings, *, up: UpContext | None = None, **options: Any
    ) -> Built[Any]:
        """The daemon with every declaration wired, and the service object."""
        if self._setup is None:
            raise TypeError(f"{self.name}: no @setup declared")
        config: C = section(settings, "services", self.name, self.settings_model)
        specs = self.specs(config)
        partitions = settings.bus.partitions
        together = [
            (d, s) for d, s in specs if self.one_lease and partitions > 1 and d.leases is not None
        ]
        alone = [(d, s) for d, s in specs if (d, s) not in together]
        consumers = len(alone) + (1 if together else 0)
        prepared = await self._prepare(config) if self._prepare is not None else None
        cluster: Cluster | None = None
        publishes = service_publish(self.grants())
        if self.access is not None:
            daemon, bus, cluster = await acting_daemon(
                self.name,
                settings,
                source=self.source,
                access=self.access,
                consumers=consumers,
                publishes=publishes,
            )
        else:
            daemon, bus = await bus_daemon(
                self.name, settings, source=self.source, consumers=consumers, publishes=publishes
            )
        runtime = Runtime(
            self.name, settings, config, daemon, bus, cluster, up, options, prepared, self.source
        )
        try:
            service = await self._setup(runtime)
            answered = Counter(
                "nodeward_control_answers",
                "Operator control requests answered, per verb and reply status",
                ["verb", "status"],
                registry=daemon.metrics.registry,
            )
            for verb, answer in self.controls.items():
                await bus.control(self.name, verb, _bound(answer, service, answered.labels))
        except BaseException:
            await daemon.stop()  # closes what it opened: the bus, the cluster port
            raise
        durables = [s.name for _, s in alone]
        for declared, spec in alone:
            # One durable name on two streams (one per stream): the task names the stream.
            shared = durables.count(spec.name) > 1
            name = f"consume-{spec.name}" + (f"-{spec.stream.lower()}" if shared else "")
            daemon.add_task(_consume(bus, declared, spec, service, partitions), name=name)
        if together:
            group = self.base(config)
            parts = [(replace(s, partitions=partitions), _handler(d, service)) for d, s in together]
            leases = together[0][0].leases

            async def consume_together() -> None:
                assert leases is not None
                claimed = await bus.consume_partitioned(group, parts, leases(service))
                if self._claimed is not None:
                    self._claimed(service, claimed)

            daemon.add_task(consume_together, name="consume")
        for task in self.tasks:
            daemon.add_task(_run(task.body, service), name=task.name, graceful=task.graceful)
        for name, check in self.checks.items():
            daemon.add_readiness_check(name, _check(check, service))
        return Built(daemon, service)

    async def build(self, settings: Settings, **options: Any) -> Daemon:
        """What `nodeward service NAME` runs."""
        return (await self.assemble(settings, **options)).daemon

    def daemon(
        self, admin: Mapping[str, Callable[[Settings], Awaitable[str]]] | None = None
    ) -> tuple[Component, Standalone]:
        """Its component (`nodeward up` builds it under its own ServiceAccount, with the up
        context) and its standalone, with its one-shot `admin` commands."""

        async def for_up(context: UpContext) -> list[Daemon]:
            built = await self.assemble(context.settings_for(self.name), up=context)
            return [built.daemon]

        return Component(self.name, for_up), Standalone(self.build, admin=dict(admin or {}))


def _bound(
    answer: ControlAnswer, service: Any, count: Callable[..., Counter]
) -> Callable[[ControlRequest], Awaitable[ControlReply]]:
    async def handler(request: ControlRequest) -> ControlReply:
        reply = await answer(service, request)
        count(request.verb, reply.status.value).inc()
        return reply

    return handler


def _consume(
    bus: Bus, declared: Consumes, spec: ConsumerSpec, service: Any, partitions: int
) -> TaskFactory:
    """The task that starts one consumer: partitioned across replicas when it declares
    its leases and `bus.partitions` > 1."""
    leases = declared.leases(service) if declared.leases is not None else None
    if leases is not None and partitions > 1:
        spec = replace(spec, partitions=partitions)

    handle = _handler(declared, service)

    async def consume() -> None:
        await bus.consume(spec, handle, leases=leases if spec.partitions > 1 else None)

    return consume


def _handler(declared: Consumes, service: Any) -> Handler:
    async def handle(event: Event[Any], delivery: Delivery) -> None:
        await declared.handler(service, event, delivery)

    return handle


def _run(body: TaskBody, service: Any) -> TaskFactory:
    async def run() -> Any:
        return await body(service)

    return run


def _check(check: Callable[[Any], bool], service: Any) -> Callable[[], bool]:
    return lambda: check(service)
