"""Deterministic subject partitioning: the stream transform and the partitions' filters."""

from __future__ import annotations

from datetime import timedelta

import pytest

from nodeward.bus import ConsumerSpec
from nodeward.bus.provision import stream_config
from schemas.streams import STREAMS, Partitioning, stream_spec


def test_destination_appends_the_partition_of_the_key_wildcards() -> None:
    p = Partitioning("session.*.*.*.*", (3, 4))
    assert p.destination(8) == (
        "session.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}"
        ".{{partition(8,3,4)}}"
    )


@pytest.mark.parametrize(
    ("pattern", "narrowed"),
    [
        ("gpu.health.>", "gpu.health.*.*.3"),
        ("gpu.xid.>", "gpu.xid.*.*.3"),
        ("gpu.>", "gpu.*.*.*.3"),
        ("gpu.health.n1.*", "gpu.health.n1.*.3"),
        ("gpu.*.n1.0", "gpu.*.n1.0.3"),
    ],
)
def test_a_consumer_filter_narrows_to_its_partition(pattern: str, narrowed: str) -> None:
    assert stream_spec("GPU").partitioning.narrow(pattern, 3) == narrowed  # type: ignore[union-attr]


@pytest.mark.parametrize("pattern", ["gpu.health.n1", "gpu.health.n1.0.7", "energy.>"])
def test_a_filter_outside_the_partitioned_subjects_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="no subject partitioned"):
        stream_spec("GPU").partitioning.narrow(pattern, 0)  # type: ignore[union-attr]


def test_keys_must_name_wildcards_of_the_source() -> None:
    with pytest.raises(ValueError):
        Partitioning("gpu.heartbeat.*", (2,))
    with pytest.raises(ValueError):
        Partitioning("gpu.heartbeat.>", (1,))


def test_the_transform_is_set_only_above_one_partition() -> None:
    gpu = stream_spec("GPU")
    assert stream_config(gpu).subject_transform is None
    transform = stream_config(gpu, partitions=4).subject_transform
    assert transform is not None and transform.src == "gpu.*.*.*"
    assert transform.dest.endswith(".{{partition(4,2)}}")
    assert stream_config(stream_spec("ENERGY"), partitions=4).subject_transform is None


def test_every_partitioned_source_is_of_its_stream() -> None:
    from schemas.streams import patterns_overlap

    for spec in STREAMS:
        if spec.partitioning is not None:
            assert all(
                any(patterns_overlap(spec.partitioning.source, s) for s in spec.subjects)
                for s in spec.subjects
            ), spec.name


def test_a_partition_is_its_own_durable_on_narrowed_subjects() -> None:
    spec = ConsumerSpec("cordon", "GPU", ("gpu.health.>",), partitions=4)
    part = spec.partition(2)
    assert (part.name, part.subjects, part.partitions) == ("cordon-p2", ("gpu.health.*.*.2",), 1)
    with pytest.raises(ValueError):
        spec.partition(4)
    with pytest.raises(ValueError, match="not partitioned"):
        ConsumerSpec("x", "ENERGY", ("energy.>",), partitions=2)


def test_the_partition_of_a_key_is_the_servers_fnv1a() -> None:
    # Partition numbers nats-server 2.15 stored for these keys (partition(8, ...)).
    assert [Partitioning.index((k,), 8) for k in ("n1", "n2")] == [0, 1]
    assert Partitioning.index(("ns", "pod"), 16) == Partitioning.index(("nspod",), 16)


def test_only_partitioned_durables_are_granted_per_partition() -> None:
    from launch.access import GRANTS
    from nodeward.nats_auth import MAX_PARTITIONS, service_user

    cordon = service_user("cordon", GRANTS["cordon"], "x").publish
    last = MAX_PARTITIONS - 1
    assert "$JS.API.CONSUMER.MSG.NEXT.GPU.cordon" in cordon
    assert f"$JS.API.CONSUMER.MSG.NEXT.GPU.cordon-p{last}" in cordon
    assert f"$JS.ACK.HEARTBEATS.cordon-heartbeats-p{last}.>" in cordon
    assert f"$JS.API.CONSUMER.MSG.NEXT.GPU.cordon-p{MAX_PARTITIONS}" not in cordon
    capacity = service_user("capacity", GRANTS["capacity"], "x").publish
    assert not any("capacity-p" in s for s in capacity)


def test_a_partitioned_lease_is_long_enough_for_a_handover() -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        ConsumerSpec("x", "GPU", ("gpu.health.>",), partitions=4, lease_ttl=timedelta(seconds=2))
    ConsumerSpec("x", "GPU", ("gpu.health.>",), partitions=1, lease_ttl=timedelta(seconds=1))
