"""The three patch types of the API server: JSON merge patch, strategic merge patch, JSON patch.

Strategic merge follows the real API's patch strategies for the fields nodeward and kubectl
touch: lists with a merge key are merged by that key (node and pod conditions by `type`,
containers by `name`, ...), lists without one are atomic and replaced (node taints, pod
tolerations), maps merge, `null` deletes. The directives `$patch` (replace/delete/merge),
`$retainKeys`, `$setElementOrder/<list>` and `$deleteFromPrimitiveList/<list>` are honoured.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.cluster.errors import ApiError

JSON = Any
SET = "$set"  # a list of scalars merged as a set (patchStrategy merge, no merge key)

_COMMON: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): SET,
}
_CONTAINER: dict[tuple[str, ...], str] = {
    ("env",): "name",
    ("ports",): "containerPort",
    ("volumeMounts",): "mountPath",
    ("volumeDevices",): "devicePath",
}
_POD_SPEC: dict[tuple[str, ...], str] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("ephemeralContainers",): "name",
    ("volumes",): "name",
    ("imagePullSecrets",): "name",
    ("hostAliases",): "ip",
    **{("containers", *k): v for k, v in _CONTAINER.items()},
    **{("initContainers", *k): v for k, v in _CONTAINER.items()},
}
MERGE_KEYS: dict[str, dict[tuple[str, ...], str]] = {
    "Node": {
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
        ("spec", "podCIDRs"): SET,
    },
    "Pod": {
        **{("spec", *k): v for k, v in _POD_SPEC.items()},
        ("status", "conditions"): "type",
    },
    "PodTemplated": {**{("spec", "template", "spec", *k): v for k, v in _POD_SPEC.items()}},
    "Namespace": {("spec", "finalizers"): SET},
    "PodDisruptionBudget": {("status", "conditions"): "type"},
}
for _kind in ("Deployment", "DaemonSet", "ReplicaSet", "StatefulSet"):
    MERGE_KEYS[_kind] = {**MERGE_KEYS["PodTemplated"], ("status", "conditions"): "type"}


class PatchError(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(422, "Invalid", message)


# --- JSON merge patch (RFC 7386) -------------------------------------------------------------


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """Apply an RFC 7386 merge patch; returns a new document."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- strategic merge patch -------------------------------------------------------------------


def merge_keys(kind: str) -> dict[tuple[str, ...], str]:
    """The lists of `kind` merged by key (path -> merge key, or `SET` for a list of scalars)."""
    return {**_COMMON, **MERGE_KEYS.get(kind, {})}


def strategic_merge_patch(target: JSON, patch: JSON, kind: str) -> JSON:
    """Apply a strategic merge patch with the merge keys of `kind`; returns a new document."""
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object")
    keys = merge_keys(kind)
    return _smp_map(copy.deepcopy(target) if isinstance(target, dict) else {}, patch, (), keys)


def _smp_map(
    orig: dict[str, Any],
    patch: dict[str, Any],
    path: tuple[str, ...],
    keys: dict[tuple[str, ...], str],
) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch directive: {directive!r}")
    if "$retainKeys" in patch:
        retain = patch["$retainKeys"]
        if not isinstance(retain, list):
            raise PatchError("$retainKeys must be a list")
        orig = {k: v for k, v in orig.items() if k in retain}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(orig.get(field), list) and isinstance(value, list):
                orig[field] = [v for v in orig[field] if v not in value]
            continue
        if key.startswith("$"):
            raise PatchError(f"unknown patch directive: {key!r}")
        sub = (*path, key)
        if value is None:
            orig.pop(key, None)
        elif isinstance(value, dict):
            current = orig.get(key)
            merged = _smp_map(current if isinstance(current, dict) else {}, value, sub, keys)
            if merged is None:
                orig.pop(key, None)
            else:
                orig[key] = merged
        elif isinstance(value, list):
            orig[key] = _smp_list(orig.get(key), value, sub, keys)
        else:
            orig[key] = copy.deepcopy(value)
    for field, order in orders.items():
        if isinstance(orig.get(field), list) and isinstance(order, list):
            orig[field] = _ordered(orig[field], order, keys.get((*path, field)))
    return orig


def _smp_list(
    orig: Any, patch: list[Any], path: tuple[str, ...], keys: dict[tuple[str, ...], str]
) -> list[Any]:
    strategy = keys.get(path)
    if strategy is None or not isinstance(orig, list):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    result = copy.deepcopy(orig)
    if strategy == SET:
        for item in patch:
            if item not in result:
                result.append(copy.deepcopy(item))
        return result
    for item in patch:
        if not isinstance(item, dict) or strategy not in item:
            raise PatchError(
                f"map in list {'.'.join(path)} does not contain its merge key {strategy!r}"
            )
        idx = next(
            (
                n
                for n, o in enumerate(result)
                if isinstance(o, dict) and o.get(strategy) == item[strategy]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                result.pop(idx)
            continue
        if idx is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result[idx] = _smp_map(result[idx], item, path, keys)
    return result


def _ordered(items: list[Any], order: list[Any], strategy: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        return (
            item.get(strategy) if strategy and strategy != SET and isinstance(item, dict) else item
        )

    wanted = [ident(o) if isinstance(o, dict) else o for o in order]
    positions = {repr(w): n for n, w in enumerate(wanted)}
    return sorted(items, key=lambda i: positions.get(repr(ident(i)), len(positions)))


# --- JSON patch (RFC 6902) -------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(
                f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}"
            )
    return node, parts[-1]


def _get(doc: Any, parts: list[str], op: str) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts, "add")
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"add operation does not apply: index out of range: {last}")
    else:
        raise PatchError("add operation does not apply: parent is not a container")
    return doc


def _remove(doc: Any, parts: list[str], op: str = "remove") -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}")


def json_patch(target: JSON, ops: JSON) -> JSON:
    """Apply an RFC 6902 JSON patch; returns a new document. A failed `test` is an error."""
    if not isinstance(ops, list):
        raise PatchError("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid json patch operation: {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            if not parts:
                doc = copy.deepcopy(op.get("value"))
                continue
            _get(doc, parts, "replace")
            parent, last = _parent(doc, parts, "replace")
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op.get("value"))
            else:
                parent[last] = copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = (
                _remove(doc, source, kind)
                if kind == "move"
                else copy.deepcopy(_get(doc, source, kind))
            )
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts, "test") != op.get("value"):
                raise PatchError(f"testing value /{'/'.join(parts)} failed")
        else:
            raise PatchError(f"unexpected json patch operation: {kind!r}")
    return doc


def apply_patch(
    target: JSON, patch: JSON, content_type: str, kind: str, *, strategic: bool = True
) -> JSON:
    """Apply `patch` by its content type. Custom resources do not support strategic merge (415)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/merge-patch+json":
        if not isinstance(patch, dict):
            raise PatchError("merge patch must be a JSON object")
        return merge_patch(target, patch)
    if media == "application/json-patch+json":
        return json_patch(target, patch)
    if media == "application/strategic-merge-patch+json":
        if not strategic:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        return strategic_merge_patch(target, patch, kind)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json-patch+json, application/merge-patch+json, "
        f"application/apply-patch+yaml{', application/strategic-merge-patch+json' if strategic else ''}",
    )
