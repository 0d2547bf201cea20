"""Create or update streams, consumers and KV buckets, idempotently."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from schemas.state.breaker import SHARED
from schemas.state.energy import TOTALS
from schemas.streams import STREAMS, Retention, Storage, StreamSpec

STREAM_NAME_IN_USE = 10058  # JSStreamNameExistErr: exists with a different configuration

_RETENTION = {
    Retention.LIMITS: api.RetentionPolicy.LIMITS,
    Retention.INTEREST: api.RetentionPolicy.INTEREST,
    Retention.WORKQUEUE: api.RetentionPolicy.WORK_QUEUE,
}
_STORAGE = {Storage.FILE: api.StorageType.FILE, Storage.MEMORY: api.StorageType.MEMORY}


# KV buckets node agents write (key `node.<node>`) but, with publish-only NATS users, may
# not create: provisioned with the streams. bucket -> (history, description).
# Direct get, so that a node's NATS user can be allowed to read its own key and no other.
AGENT_BUCKETS: Mapping[str, tuple[int, str]] = MappingProxyType(
    {TOTALS.name: (1, TOTALS.description)}
)


# KV buckets shared by several services, provisioned with the streams.
# `breaker`: the one circuit breaker on removing nodes from service (key `breaker`), shared
# by GPU quarantine (cordon), the Falco cordon and service-requested maintenance.
SHARED_BUCKETS: Mapping[str, tuple[int, str]] = MappingProxyType(
    {SHARED.name: (5, SHARED.description)}
)


def stream_config(spec: StreamSpec, *, partitions: int = 1) -> api.StreamConfig:
    """`spec` as JetStream's config; with `partitions` > 1 a partitioned stream stores its
    subjects with the partition number appended (`StreamSpec.partitioning`)."""
    transform = None
    if partitions > 1 and spec.partitioning is not None:
        transform = api.SubjectTransform(
            src=spec.partitioning.source, dest=spec.partitioning.destination(partitions)
        )
    return api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention],
        storage=_STORAGE[spec.storage],
        num_replicas=spec.replicas,
        max_age=spec.max_age.total_seconds(),
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window.total_seconds(),
        discard=api.DiscardPolicy.OLD,
        subject_transform=transform,
        allow_direct=spec.allow_direct or None,
    )


def _differs(current: api.StreamConfig, wanted: api.StreamConfig) -> list[str]:
    """The fields of `wanted` that `current` (as the server has it) does not match."""

    def seconds(value: float | None) -> float:
        return round(value or 0.0, 3)

    def transform(t: api.SubjectTransform | None) -> tuple[str, str] | None:
        return (t.src or "", t.dest or "") if t is not None else None

    pairs: dict[str, tuple[object, object]] = {
        "description": (current.description, wanted.description),
        "subjects": (sorted(current.subjects or []), sorted(wanted.subjects or [])),
        "retention": (current.retention, wanted.retention),
        "storage": (current.storage, wanted.storage),
        "num_replicas": (current.num_replicas or 1, wanted.num_replicas or 1),
        "max_age": (seconds(current.max_age), seconds(wanted.max_age)),
        "max_bytes": (current.max_bytes, wanted.max_bytes),
        "duplicate_window": (
            seconds(current.duplicate_window),
            seconds(wanted.duplicate_window),
        ),
        "discard": (current.discard, wanted.discard),
        "subject_transform": (
            transform(current.subject_transform),
            transform(wanted.subject_transform),
        ),
        "allow_direct": (bool(current.allow_direct), bool(wanted.allow_direct)),
    }
    return [name for name, (have, want) in pairs.items() if have != want]


async def ensure_stream(js: JetStreamContext, spec: StreamSpec, *, partitions: int = 1) -> str:
    """Create the stream, or update it if it exists with another config (a stream as wanted
    is left alone: no write, so every daemon's start costs the cluster no proposal). Returns
    what it did: created, updated or unchanged."""
    config = stream_config(spec, partitions=partitions)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        try:
            await js.add_stream(config=config)
            return "created"
        except BadRequestError as exc:
            if exc.err_code != STREAM_NAME_IN_USE:  # lost a race with another daemon
                raise
    else:
        if not _differs(info.config, config):
            return "unchanged"
    await js.update_stream(config=config)
    return "updated"


async def ensure_streams(
    js: JetStreamContext,
    specs: Iterable[StreamSpec] = STREAMS,
    *,
    replicas: int | None = None,
    partitions: int = 1,
) -> dict[str, str]:
    log = structlog.get_logger().bind(component="bus")
    done = {}
    for given in specs:
        spec = given if replicas is None else replace(given, replicas=replicas)
        done[spec.name] = await ensure_stream(js, spec, partitions=partitions)
    log.info("bus.streams_provisioned", streams=done)
    return done


async def ensure_kv(
    js: JetStreamContext,
    bucket: str,
    *,
    history: int = 5,
    ttl_s: float | None = None,
    replicas: int = 1,
    description: str | None = None,
    direct: bool = False,
) -> KeyValue:
    """A KV bucket, created if missing (an existing bucket is used as it is)."""
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        pass
    config = api.KeyValueConfig(
        bucket=bucket,
        description=description,
        history=history,
        ttl=ttl_s,
        replicas=replicas,
        storage=api.StorageType.FILE,
        direct=direct,
    )
    try:
        return await js.create_key_value(config=config)
    except BadRequestError:
        return await js.key_value(bucket)  # created concurrently by another daemon
