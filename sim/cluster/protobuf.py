"""The few Kubernetes protobuf bodies the sim cluster decodes.

Recent kubectl sends some typed requests as `application/vnd.kubernetes.protobuf` (the
reviews of `kubectl auth can-i`, `auth can-i --list` and `auth whoami`). The envelope is the magic
`k8s\\0` and a `runtime.Unknown` (typeMeta, raw); this module reads the wire format and
turns the kinds below into the JSON form. Anything else is a 415, which clients see as
"this server wants JSON".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeward.protowire import WireError, fields

MAGIC = b"k8s\x00"


class UndecodableError(WireError):
    """Not a protobuf body this module understands."""


def _strings(buf: bytes, names: dict[int, str]) -> dict[str, str]:
    out = {}
    for number, value in fields(buf):
        if number in names and isinstance(value, bytes) and value:
            out[names[number]] = value.decode()
    return out


_RESOURCE_ATTRIBUTES = {
    1: "namespace",
    2: "verb",
    3: "group",
    4: "version",
    5: "resource",
    6: "subresource",
    7: "name",
}
_NON_RESOURCE_ATTRIBUTES = {1: "path", 2: "verb"}


def _self_subject_access_review(raw: bytes) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for number, value in fields(raw):
        if number == 2:  # spec
            for sub, inner in fields(value):
                if sub == 1:
                    spec["resourceAttributes"] = _strings(inner, _RESOURCE_ATTRIBUTES)
                elif sub == 2:
                    spec["nonResourceAttributes"] = _strings(inner, _NON_RESOURCE_ATTRIBUTES)
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {},
        "spec": spec,
    }


def _self_subject_rules_review(raw: bytes) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for number, value in fields(raw):
        if number == 2:  # spec
            spec.update(_strings(value, {1: "namespace"}))
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "metadata": {},
        "spec": spec,
    }


def _self_subject_review(version: str) -> Callable[[bytes], dict[str, Any]]:
    def decode(raw: bytes) -> dict[str, Any]:
        for _ in fields(raw):  # metadata and status only: nothing to read, but it must parse
            pass
        return {
            "apiVersion": f"authentication.k8s.io/{version}",
            "kind": "SelfSubjectReview",
            "metadata": {},
        }

    return decode


_DECODERS = {
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): _self_subject_access_review,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): _self_subject_rules_review,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): _self_subject_review("v1"),
    ("authentication.k8s.io/v1beta1", "SelfSubjectReview"): _self_subject_review("v1beta1"),
}


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object of a kind listed above."""
    try:
        return _decode(body)
    except UndecodableError:
        raise
    except WireError as exc:
        raise UndecodableError(str(exc)) from None


def _decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise UndecodableError("no k8s protobuf envelope")
    type_meta: dict[str, str] = {}
    raw = b""
    for number, value in fields(body[len(MAGIC) :]):
        if number == 1 and isinstance(value, bytes):
            type_meta = _strings(value, {1: "apiVersion", 2: "kind"})
        elif number == 2 and isinstance(value, bytes):
            raw = value
    decoder = _DECODERS.get((type_meta.get("apiVersion", ""), type_meta.get("kind", "")))
    if decoder is None:
        raise UndecodableError(
            f"cannot decode {type_meta.get('apiVersion')}/{type_meta.get('kind')}"
        )
    return decoder(raw)
