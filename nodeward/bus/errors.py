"""Errors the bus runtime raises and the ones handlers raise to steer redelivery."""

from __future__ import annotations


class BusError(Exception):
    """A NATS or JetStream operation failed. `str()` is one line."""


class PublishError(BusError):
    """JetStream did not acknowledge a publish after every retry, or refused it."""


class RetryableError(Exception):
    """Raise from a handler: try again later (after `delay` seconds if given)."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Raise from a handler: retrying cannot help; the message goes to the DLQ now."""
