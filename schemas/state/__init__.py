"""KV record types: what each service keeps in its bucket, and where (`Bucket`).

The service that writes a record and every reader (`nodeward status`, the CLI) use the
same type and the same `Bucket` declaration, never a copy of the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from schemas.state.encoding import load_record

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Bucket(Generic[M]):
    """One kind of record in a KV bucket: the bucket, its key layout and the record type.

    `name` is the bucket's default name (a service's settings may rename it: readers take
    the same setting). A bucket may hold several kinds of record (cordon's: one per node,
    and the circuit breaker's), each declared once. Every key of a kind starts with
    `prefix` (a single key is its own prefix); `key` builds one from its parts.
    """

    name: str
    record: type[M]
    prefix: str
    key: Callable[..., str]
    description: str = ""

    @classmethod
    def one(cls, name: str, record: type[M], key: str, description: str = "") -> Bucket[M]:
        """A kind of record kept under one key, `key`, alone."""
        return cls(name, record, prefix=key, key=lambda: key, description=description)

    def holds(self, key: str) -> bool:
        """Whether `key` is a key of this kind."""
        return key.startswith(self.prefix)

    def suffix(self, key: str) -> str:
        """What follows the prefix (`node.gpu-a` -> `gpu-a`)."""
        return key.removeprefix(self.prefix)

    def load(self, data: bytes | str) -> M:
        """A stored value as the record type, decompressed if it was stored compressed
        (`schemas.state.encoding`; raises pydantic's `ValidationError`)."""
        return load_record(self.record, data)


__all__ = ["Bucket"]
