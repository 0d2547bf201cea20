"""Declaring an agent's Prometheus metrics on its registry, one line each."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class Declare:
    """Makes the metrics of one agent on its `registry`, each with its labels."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)
