"""Label and field selectors, parsed and matched as the API server does."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from sim.cluster.errors import bad_request

Requirement = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _set_req(key: str, values: set[str], inside: bool) -> Requirement:
    return lambda labels: (labels.get(key) in values) == inside


def _eq_req(key: str, value: str, equal: bool) -> Requirement:
    return lambda labels: (labels.get(key) == value) == equal


def _exists_req(key: str, present: bool) -> Requirement:
    return lambda labels: (key in labels) == present


def _field_req(field: str, value: str, equal: bool) -> Requirement:
    return lambda obj: (_field_value(obj, field) == value) == equal


def _split_terms(text: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return terms


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (f,g),!h,i`; an unparsable selector is a 400."""
    reqs: list[Requirement] = []
    for term in _split_terms(text or ""):
        if m := _SET_RE.match(term):
            key, op = m.group(1), m.group(2)
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            reqs.append(_set_req(key, values, op == "in"))
        elif m := _EQ_RE.match(term):
            key, op, value = m.groups()
            reqs.append(_eq_req(key, value, op != "!="))
        elif m := _EXISTS_RE.match(term):
            neg, key = m.groups()
            reqs.append(_exists_req(key, not neg))
        else:
            raise bad_request(f"unable to parse requirement: {term.strip()!r}")
    return reqs


def match_labels(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(r(labels or {}) for r in reqs)


def match_label_selector_object(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None
) -> bool:
    """Match a `metav1.LabelSelector` (matchLabels, matchExpressions). An empty selector matches all."""
    labels = labels or {}
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(
    text: str | None, supported: frozenset[str], resource: str
) -> list[Requirement]:
    """Parse `spec.nodeName=x,status.phase!=Failed`; fields outside `supported` are a 400."""
    reqs: list[Requirement] = []
    for term in _split_terms(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid field selector: {term.strip()!r}")
        field, op, value = m.groups()
        if field not in supported and field not in ("metadata.name", "metadata.namespace"):
            raise bad_request(f"field label not supported: {field}")
        reqs.append(_field_req(field, value, op != "!="))
    return reqs


def match_fields(reqs: list[Requirement], obj: Mapping[str, Any]) -> bool:
    return all(r(obj) for r in reqs)
