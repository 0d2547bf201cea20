"""The protobuf bodies the sim cluster decodes, from bytes kubectl 1.37 really sent."""

from __future__ import annotations

import pytest

from sim.cluster.protobuf import UndecodableError, decode

# `kubectl auth can-i patch nodes` (kubectl v1.37.1, context namespace "nodeward")
CAN_I_PATCH_NODES = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f763112"
    "1753656c665375626a65637441636365737352657669657712400a100a001200"
    "1a0022002a0032003800420012220a200a086e6f646577617264120570617463"
    "681a0022002a056e6f64657332003a001a08080012001a0020001a002200"
)


def test_self_subject_access_review_from_kubectl() -> None:
    assert decode(CAN_I_PATCH_NODES) == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {},
        "spec": {
            "resourceAttributes": {"namespace": "nodeward", "verb": "patch", "resource": "nodes"}
        },
    }


def test_other_bodies_are_not_decoded() -> None:
    with pytest.raises(UndecodableError):
        decode(b'{"kind": "Pod"}')
    with pytest.raises(UndecodableError):
        decode(b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Secret\x12\x00")
    with pytest.raises(UndecodableError):
        decode(b"k8s\x00\x0a\xff")
