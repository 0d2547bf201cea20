"""The protobuf bodies the sim cluster decodes, from bytes kubectl 1.37 really sent."""

from __future__ import annotations

import pytest

from sim.cluster.protobuf import UndecodableError, decode
from tests.helpers.kube import request_body

# `kubectl auth can-i patch nodes` (kubectl v1.37.1, context namespace "nodeward")
CAN_I_PATCH_NODES = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f763112"
    "1753656c665375626a65637441636365737352657669657712400a100a001200"
    "1a0022002a0032003800420012220a200a086e6f646577617264120570617463"
    "681a0022002a056e6f64657332003a001a08080012001a0020001a002200"
)


def test_self_subject_access_review_from_kubectl() -> None:
    assert decode(CAN_I_PATCH_NODES) == request_body(
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        spec={
            "resourceAttributes": {"namespace": "nodeward", "verb": "patch", "resource": "nodes"}
        },
    )


def test_other_bodies_are_not_decoded() -> None:
    with pytest.raises(UndecodableError):
        decode(b'{"kind": "Pod"}')
    with pytest.raises(UndecodableError):
        decode(b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Secret\x12\x00")
    with pytest.raises(UndecodableError):
        decode(b"k8s\x00\x0a\xff")


# `kubectl auth can-i --list` (kubectl v1.33.1, context namespace "nodeward")
CAN_I_LIST = bytes.fromhex(
    "6b3873000a310a17617574686f72697a6174696f6e2e6b38732e696f2f7631121653656c665375626a6563"
    "7452756c657352657669657712240a100a0012001a0022002a00320038004200120a0a086e6f646577617264"
    "1a04180022001a002200"
)
# `kubectl auth whoami` (kubectl v1.33.1)
WHOAMI = bytes.fromhex(
    "6b3873000a2d0a1861757468656e7469636174696f6e2e6b38732e696f2f7631121153656c665375626a65"
    "6374526576696577121a0a100a0012001a0022002a0032003800420012060a040a0012001a002200"
)
# `kubectl auth can-i get /api` (kubectl v1.33.1)
CAN_I_GET_API = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f7631121753656c665375626a6563"
    "74416363657373526576696577122b0a100a0012001a0022002a00320038004200120d120b0a042f617069"
    "12036765741a08080012001a0020001a002200"
)


def test_the_other_reviews_kubectl_sends() -> None:
    assert decode(CAN_I_LIST) == request_body(
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        spec={"namespace": "nodeward"},
    )
    assert decode(WHOAMI) == request_body(
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
    )
    assert decode(CAN_I_GET_API)["spec"] == {
        "nonResourceAttributes": {"path": "/api", "verb": "get"}
    }
