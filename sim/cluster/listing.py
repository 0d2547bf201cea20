"""A list request's options and continue tokens, as the API server reads and writes them.

From kube-apiserver's source: `apimachinery/pkg/apis/meta/internalversion/validation`
(`ValidateListOptions`: what `resourceVersionMatch` may be combined with, 422 Invalid on
`ListOptions`), `apiserver/pkg/storage/continue.go` (the token: base64 JSON of `v`, the
revision `rv` of the first page and the key `start` to go on from; a token of revision -1
continues at the newest data) and `storage/etcd3/store.go` (410 `Expired` for a token or an
`Exact` revision that was compacted, with a fresh, inconsistent continue token).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.cluster.errors import ApiError, bad_request

_VERSION = "meta.k8s.io/v1"
_INCONSISTENT = -1
_EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class Page:
    """What one list request asks for: the revision to read at (None: the newest), the key
    to go on after, and how many items at most (0: all)."""

    rv: int | None
    after: str
    limit: int
    continued: bool


def key_of(obj: Obj) -> str:
    """An object's place in a list: etcd's key order, namespace then name."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def token(rv: int, after: str) -> str:
    raw = json.dumps({"v": _VERSION, "rv": rv, "start": after + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _invalid(field_errors: list[tuple[str, str, str]]) -> ApiError:
    text = ", ".join(f"{f}: {m}" for f, _, m in field_errors)
    return ApiError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {text}',
        details={
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": r, "message": m, "field": f} for f, r, m in field_errors],
        },
    )


def _decode(cont: str) -> tuple[int, str]:
    try:
        padded = cont + "=" * (-len(cont) % 4)
        said = json.loads(base64.urlsafe_b64decode(padded.encode()))
        version, rv, start = said.get("v"), int(said["rv"]), str(said["start"])
    except (ValueError, KeyError, TypeError, binascii.Error, AttributeError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from None
    if version != _VERSION:
        raise bad_request(
            f"continue key is not valid: incorrect encoded start resourceVersion (version {version})"
        )
    return rv, start.rstrip("\x00")


def read(query: Mapping[str, str], newest: int) -> Page:
    """The request's options, checked as `ValidateListOptions` and the storage do."""
    rv_text = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    cont = query.get("continue", "")
    limit_text = query.get("limit", "") or "0"
    try:
        limit = max(0, int(limit_text))
    except ValueError:
        raise bad_request(f"limit: {limit_text!r} is not an integer") from None
    if match:
        if match not in ("Exact", "NotOlderThan"):
            raise _invalid(
                [
                    (
                        "resourceVersionMatch",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{match}": supported values: "Exact", '
                        '"NotOlderThan", ""',
                    )
                ]
            )
        if not rv_text:
            why = "resourceVersionMatch is forbidden unless resourceVersion is provided"
            raise _invalid([("resourceVersionMatch", "FieldValueForbidden", f"Forbidden: {why}")])
        if cont:
            why = "resourceVersionMatch is forbidden when continue is provided"
            raise _invalid([("resourceVersionMatch", "FieldValueForbidden", f"Forbidden: {why}")])
        if match == "Exact" and rv_text == "0":
            why = 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
            raise _invalid([("resourceVersionMatch", "FieldValueForbidden", f"Forbidden: {why}")])
    if cont:
        if rv_text and rv_text != "0":
            raise bad_request("specifying resource version is not allowed when using continue")
        rv, after = _decode(cont)
        return Page(None if rv == _INCONSISTENT else rv, after, limit, True)
    if not rv_text or rv_text == "0":
        return Page(None, "", limit, False)  # the newest (a cache may serve "0": it is new)
    try:
        rv = int(rv_text)
    except ValueError:
        raise bad_request(f'invalid resource version "{rv_text}"') from None
    if rv > newest:
        raise ApiError(
            504,
            "Timeout",
            f"Too large resource version: {rv}, current: {newest}",
            details={
                "causes": [
                    {
                        "reason": "ResourceVersionTooLarge",
                        "message": "Too large resource version",
                    }
                ],
                "retryAfterSeconds": 1,
            },
        )
    if match == "Exact":
        return Page(rv, "", limit, False)
    return Page(None, "", limit, False)  # NotOlderThan (or unset): the newest is not older


def expired(page: Page, oldest: int) -> ApiError:
    """410 for a revision the history no longer reaches: a continue token's (with a fresh one
    that goes on, inconsistently, at the newest data) or an `Exact` read's."""
    if page.continued:
        err = ApiError(410, "Expired", _EXPIRED_CONTINUE)
        err.list_meta = {"continue": token(_INCONSISTENT, page.after)}
        return err
    return ApiError(410, "Expired", f"too old resource version: {page.rv} ({oldest + 1})")
