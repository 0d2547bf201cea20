"""The JetStream runtime shared by every daemon."""

from nodeward.bus.bus import Bus
from nodeward.bus.consumer import Consumer, ConsumerSpec, Delivery, Handler
from nodeward.bus.errors import BusError, PermanentError, PublishError, RetryableError

__all__ = [
    "Bus",
    "BusError",
    "Consumer",
    "ConsumerSpec",
    "Delivery",
    "Handler",
    "PermanentError",
    "PublishError",
    "RetryableError",
]
