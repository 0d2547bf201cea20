"""nodeward's event contract: typed events, subjects, streams and the CloudEvents mapping.

This package does no I/O (its one read is its own shipped data: the XID catalog,
`schemas.xid`) and imports nothing but pydantic.
"""

from schemas.base import Event, EventData, make_event
from schemas.cloudevents import (
    DecodeError,
    WireMessage,
    decode,
    encode,
    from_structured,
    to_structured,
)
from schemas.registry import REGISTRY, EventType, example_event, lookup
from schemas.streams import STREAMS, StreamSpec

__all__ = [
    "REGISTRY",
    "STREAMS",
    "DecodeError",
    "Event",
    "EventData",
    "EventType",
    "StreamSpec",
    "WireMessage",
    "decode",
    "encode",
    "example_event",
    "from_structured",
    "lookup",
    "make_event",
    "to_structured",
]
