"""The JetStream runtime shared by every daemon."""

from nodeward.bus.bus import Bus
from nodeward.bus.consumer import Consumer, ConsumerSpec, Delivery, Handler
from nodeward.bus.errors import (
    BusError,
    IdentityRefused,
    PermanentError,
    PublishError,
    RetryableError,
    is_permanent,
)
from nodeward.bus.identity import Binding, bind

__all__ = [
    "Binding",
    "Bus",
    "BusError",
    "Consumer",
    "ConsumerSpec",
    "Delivery",
    "Handler",
    "IdentityRefused",
    "PermanentError",
    "PublishError",
    "RetryableError",
    "bind",
    "is_permanent",
]
