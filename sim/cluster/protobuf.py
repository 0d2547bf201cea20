"""The few Kubernetes protobuf bodies the sim cluster decodes.

Recent kubectl sends some typed requests as `application/vnd.kubernetes.protobuf` (the
reviews of `kubectl auth can-i`, `auth can-i --list` and `auth whoami`, the TokenRequest of
`kubectl create token`; client-go's clients may send a TokenReview so). The envelope is the magic
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
_OBJECT_META = {1: "name", 2: "generateName", 3: "namespace", 5: "uid"}
_BOUND_OBJECT_REFERENCE = {1: "kind", 2: "apiVersion", 3: "name", 4: "uid"}


def _int64(value: int) -> int:
    """A varint read as Go's int64 (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


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


def _token_request(raw: bytes) -> dict[str, Any]:
    """`authentication/v1` TokenRequest: metadata 1, spec 2 (audiences 1, boundObjectRef 3,
    expirationSeconds 4); its status is the server's to write."""
    meta: dict[str, str] = {}
    spec: dict[str, Any] = {}
    for number, value in fields(raw):
        if number == 1:
            meta = _strings(value, _OBJECT_META)
        elif number == 2:
            for sub, inner in fields(value):
                if sub == 1 and isinstance(inner, bytes):
                    spec.setdefault("audiences", []).append(inner.decode())
                elif sub == 3 and isinstance(inner, bytes):
                    spec["boundObjectRef"] = _strings(inner, _BOUND_OBJECT_REFERENCE)
                elif sub == 4 and isinstance(inner, int):
                    spec["expirationSeconds"] = _int64(inner)
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": meta,
        "spec": spec,
    }


def _token_review(version: str) -> Callable[[bytes], dict[str, Any]]:
    """TokenReview: metadata 1, spec 2 (token 1, audiences 2)."""

    def decode(raw: bytes) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        for number, value in fields(raw):
            if number != 2:
                continue
            for sub, inner in fields(value):
                if sub == 1 and isinstance(inner, bytes) and inner:
                    spec["token"] = inner.decode()
                elif sub == 2 and isinstance(inner, bytes):
                    spec.setdefault("audiences", []).append(inner.decode())
        return {
            "apiVersion": f"authentication.k8s.io/{version}",
            "kind": "TokenReview",
            "metadata": {},
            "spec": spec,
        }

    return decode


_DECODERS = {
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): _self_subject_access_review,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): _self_subject_rules_review,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): _self_subject_review("v1"),
    ("authentication.k8s.io/v1beta1", "SelfSubjectReview"): _self_subject_review("v1beta1"),
    ("authentication.k8s.io/v1", "TokenRequest"): _token_request,
    ("authentication.k8s.io/v1", "TokenReview"): _token_review("v1"),
    ("authentication.k8s.io/v1beta1", "TokenReview"): _token_review("v1beta1"),
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
