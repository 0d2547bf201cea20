"""Identity bindings: which data fields must equal which subject tokens."""

from __future__ import annotations

import pytest

from nodeward.bus import ConsumerSpec
from nodeward.bus.identity import Binding, bind, default_binding, mismatches
from schemas import REGISTRY, example_event
from schemas.energy import EnergyPod
from schemas.gpu import GpuHealth
from schemas.session import SessionIdle


def test_bind_reads_the_token_positions_from_the_subject_pattern() -> None:
    assert bind(GpuHealth, "node") == Binding("gpu.health.v1", (("node", 2),))
    assert ConsumerSpec.bind(SessionIdle, "node", "namespace", "pod").fields == (
        ("node", 2),
        ("namespace", 3),
        ("pod", 4),
    )
    assert bind(EnergyPod, "node", "namespace", "pod").fields == (
        ("node", 2),
        ("namespace", 3),
        ("pod", 4),
    )


def test_bind_refuses_fields_the_subject_does_not_carry() -> None:
    with pytest.raises(ValueError, match="no field 'nod'"):
        bind(GpuHealth, "nod")
    with pytest.raises(ValueError, match="has no <gpu_uuid>"):
        bind(GpuHealth, "gpu_uuid")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_type_binds_the_node_namespace_and_pod_its_subject_names(name: str) -> None:
    et = REGISTRY[name]
    pattern = et.subject_pattern.split(".")
    places = (("node", "<node>"), ("namespace", "<ns>"), ("pod", "<pod>"))
    expected = {f for f, p in places if p in pattern}
    assert {f for f, _ in default_binding(name).fields} == expected
    event = example_event(name)
    assert mismatches(default_binding(name), event.nats_subject, event) == []


def test_a_node_speaking_of_another_is_a_mismatch_naming_both() -> None:
    event = example_event("gpu.health.v1")
    wrong = mismatches(bind(GpuHealth, "node"), "gpu.health.gpu-h100-01.0", event)
    assert [str(m) for m in wrong] == [
        "data.node 'gpu-node-07' does not match subject token 2 'gpu-h100-01'"
    ]


def test_dotted_node_names_match_their_token() -> None:
    event = example_event("gpu.health.v1")
    event = event.model_copy(update={"data": event.data.model_copy(update={"node": "n1.dc"})})
    assert mismatches(bind(GpuHealth, "node"), "gpu.health.n1_dc.3", event) == []
