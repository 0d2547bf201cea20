"""Prometheus metrics of one daemon, in its own registry (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The bus and handler metrics every daemon exposes on /metrics."""

    def __init__(self, daemon: str, registry: CollectorRegistry | None = None) -> None:
        self.daemon = daemon
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.published = Counter(
            "nodeward_events_published",
            "Events published and acknowledged by JetStream",
            ["type"],
            registry=r,
        )
        self.publish_failures = Counter(
            "nodeward_publish_failures",
            "Publishes that failed after all retries",
            ["type"],
            registry=r,
        )
        self.handled = Counter(
            "nodeward_events_handled",
            "Messages handled by a consumer, by outcome",
            ["consumer", "type", "outcome"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "nodeward_events_dead_lettered",
            "Messages sent to the DLQ",
            ["consumer", "reason"],
            registry=r,
        )
        self.handler_seconds = Histogram(
            "nodeward_handler_seconds",
            "Handler latency",
            ["consumer"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.consumer_pending = Gauge(
            "nodeward_consumer_pending",
            "Messages in the stream not yet delivered to the consumer (lag)",
            ["stream", "consumer"],
            registry=r,
        )
        self.consumer_ack_pending = Gauge(
            "nodeward_consumer_ack_pending",
            "Messages delivered but not yet acknowledged",
            ["stream", "consumer"],
            registry=r,
        )
        self.in_flight = Gauge(
            "nodeward_handlers_in_flight", "Handlers running now", ["consumer"], registry=r
        )
        self.bus_connected = Gauge(
            "nodeward_bus_connected", "1 while connected to NATS", registry=r
        )
        self.bus_responsive = Gauge(
            "nodeward_bus_responsive",
            "1 while the bus answers pings, acknowledges publishes and feeds the consumers",
            registry=r,
        )
        self.clock_offset = Gauge(
            "nodeward_clock_offset_seconds",
            "This host's clock minus the bus's, from its own newest message on `subject` read"
            " back (nodeward.bus.clock)",
            ["subject"],
            registry=r,
        )
        self.bus_reconnects = Counter(
            "nodeward_bus_reconnects", "Reconnections to NATS", registry=r
        )
