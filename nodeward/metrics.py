"""Prometheus metrics of one daemon, in its own registry (no process-global state)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class Declare:
    """Makes a daemon's metrics on its `registry`, each with its labels, one line each."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def counter(
        self,
        name: str,
        documentation: str,
        *labels: str,
        known: Mapping[str, Iterable[str]] | None = None,
    ) -> Counter:
        """A counter; with `known` (values per label, every label named), a series at 0
        for each combination of them from the start (`at_zero`)."""
        counter = Counter(name, documentation, labels, registry=self.registry)
        if known is not None:
            at_zero(counter, **known)
        return counter


def at_zero(counter: Counter, **values: Iterable[str]) -> Counter:
    """Give `counter` a series at 0 for every combination of `values` (the values each
    label is known to take, every label named), before anything is counted.

    A labelled counter has no series until its first increment, so Prometheus has no
    sample before it: `increase()` and `rate()` miss that first event, an alert on a
    failure does not fire on the first one, and a dashboard says "No data" for 0.
    Each combination is one series more: keep the product within the family's budget
    (launch/observability/budget.yaml); call it again for combinations that are not a
    product. Returns `counter`."""
    names = list(values)
    for combination in itertools.product(*(tuple(values[n]) for n in names)):
        counter.labels(**dict(zip(names, combination, strict=True)))
    return counter


class Exposed:
    """What a daemon's `/metrics` serves of `registry`: every sample but prometheus_client's
    `_created` ones (a counter's or histogram's creation time). Prometheus stores each as a
    series of its own, one more per counter series and per histogram, for a time no query
    of nodeward's reads (docs/cardinality.md)."""

    def __init__(self, registry: Collector) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            created = f"{metric.name}_created"
            if not any(s.name == created for s in metric.samples):
                yield metric
                continue
            kept = copy.copy(metric)  # the registry's own is left as it is
            kept.samples = [s for s in metric.samples if s.name != created]
            yield kept


class Metrics:
    """The bus and handler metrics every daemon exposes on /metrics."""

    def __init__(self, daemon: str, registry: CollectorRegistry | None = None) -> None:
        self.daemon = daemon
        self.registry = registry or CollectorRegistry()
        m = Declare(self.registry)
        self.published = m.counter(
            "nodeward_events_published", "Events published and acknowledged by JetStream", "type"
        )
        self.publish_failures = m.counter(
            "nodeward_publish_failures", "Publishes that failed after all retries", "type"
        )
        self.handled = m.counter(
            "nodeward_events_handled",
            "Messages handled by a consumer, by outcome",
            "consumer",
            "type",
            "outcome",
        )
        self.dead_lettered = m.counter(
            "nodeward_events_dead_lettered", "Messages sent to the DLQ", "consumer", "reason"
        )
        self.handler_seconds = Histogram(
            "nodeward_handler_seconds",
            "Handler latency",
            ["consumer"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.consumer_pending = m.gauge(
            "nodeward_consumer_pending",
            "Messages in the stream not yet delivered to the consumer (lag)",
            "stream",
            "consumer",
        )
        self.consumer_ack_pending = m.gauge(
            "nodeward_consumer_ack_pending",
            "Messages delivered but not yet acknowledged",
            "stream",
            "consumer",
        )
        self.in_flight = m.gauge("nodeward_handlers_in_flight", "Handlers running now", "consumer")
        self.bus_connected = m.gauge("nodeward_bus_connected", "1 while connected to NATS")
        self.bus_responsive = m.gauge(
            "nodeward_bus_responsive",
            "1 while the bus answers pings, acknowledges publishes and feeds the consumers",
        )
        self.clock_offset = m.gauge(
            "nodeward_clock_offset_seconds",
            "This host's clock minus the bus's, from its own newest message on `subject` read"
            " back (nodeward.bus.clock)",
            "subject",
        )
        self.bus_reconnects = m.counter("nodeward_bus_reconnects", "Reconnections to NATS")
