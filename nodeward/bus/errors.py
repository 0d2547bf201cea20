"""Errors the bus runtime raises, the ones handlers raise to steer redelivery, and which
errors are permanent (retrying the same message cannot help)."""

from __future__ import annotations

from nats.errors import MaxPayloadError
from nats.js.errors import InvalidBucketNameError, InvalidKeyError
from pydantic import ValidationError


class BusError(Exception):
    """A NATS or JetStream operation failed. `str()` is one line."""


class PublishError(BusError):
    """JetStream did not acknowledge a publish after every retry, or refused it.

    `permanent` when sending the same message again cannot succeed (too big for the
    server's max_payload, refused by JetStream with a 4xx)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class RetryableError(Exception):
    """Raise from a handler: try again later (after `delay` seconds if given)."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Raise from a handler: retrying cannot help; the message goes to the DLQ now."""


class IdentityRefused(PermanentError):
    """Raise from a handler: its publisher may not say this (a rule beyond the subject
    binding, e.g. a node's notice to a user). The runtime treats it as an identity
    mismatch: audited as a security event, on-call told once per publisher and window,
    dead-lettered as `identity_mismatch`, never handled.

    `claimed`: what the message claimed (field -> value); `target`: what it was about, as
    `(kind, name, namespace)`; `publisher`: who may have sent it, for the notice.
    """

    def __init__(
        self,
        message: str,
        *,
        claimed: dict[str, str],
        target: tuple[str, str, str | None],
        publisher: str,
    ) -> None:
        super().__init__(message)
        self.claimed = claimed
        self.target = target
        self.publisher = publisher


# Raised by a handler (or by what it calls), these fail the same way on every delivery.
_PERMANENT = (
    PermanentError,
    ValidationError,  # data that does not fit a model
    InvalidKeyError,  # a KV key built from the message that NATS refuses
    InvalidBucketNameError,
    MaxPayloadError,  # an output bigger than the server accepts
)


def is_permanent(exc: BaseException) -> bool:
    """True when retrying cannot help: `exc`, or what it was raised from (`raise ... from`),
    is a permanent error. A `RetryableError` on top always means retry."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, RetryableError):
            return False
        if isinstance(current, _PERMANENT):
            return True
        if isinstance(current, PublishError):
            return current.permanent
        seen.add(id(current))
        current = current.__cause__
    return False
