"""Server-side apply and field ownership (`metadata.managedFields`), as the API server keeps them.

From kube-apiserver's source (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`,
`applyPatcher`; `apimachinery/pkg/util/managedfields` and sigs.k8s.io/structured-merge-diff):

- Every write records which fields its manager set: an apply (`application/apply-patch+yaml`,
  `fieldManager` required) as operation `Apply`, any other create, update or patch as `Update`
  (its `fieldManager`, else the first word of its User-Agent), per manager, operation,
  apiVersion and subresource, as a `FieldsV1` trie (`f:` a field, `k:` a list item by its
  merge key, `v:` a set's value, `.` the item itself).
- An apply sets the fields of its configuration. A field another manager owns with another
  value is a conflict: 409 `Apply failed with N conflict(s)`, unless `force=true`, which takes
  it over. A field the applier set before and no longer does is removed, unless another
  manager owns it too. A manager whose update changes a field takes it from the others.

Lists are merged as the patch strategies of `sim.cluster.patch` say (by merge key, as a set,
else atomic); maps field by field. The status of a resource with a status subresource is
owned through `/status` only.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sim.cluster.errors import ApiError, bad_request
from sim.cluster.patch import SET, merge_keys, merge_patch, strategic_merge_patch

Obj = dict[str, Any]
Path = tuple[str, ...]
_META_OWNED = ("labels", "annotations", "finalizers", "ownerReferences")
_MISSING = object()


def manager_of(field_manager: str | None, user_agent: str) -> str:
    """`managerOrUserAgent`: the request's `fieldManager`, else its User-Agent's first word."""
    if field_manager:
        return field_manager
    return user_agent.split("/", 1)[0][:128] or "unknown"


def leaves(obj: Obj, kind: str, subresource: str, with_status: bool) -> dict[Path, Any]:
    """Every field `obj` sets, as owned paths -> value (a list item's own path -> None)."""
    strategies = merge_keys(kind)
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            if subresource == "status":
                continue  # through /status only status is written
            for mkey in _META_OWNED:
                if mkey in (value or {}):
                    _walk(value[mkey], (f"f:{key}", f"f:{mkey}"), (key, mkey), strategies, out)
            continue
        if with_status and (key == "status") != (subresource == "status"):
            continue
        _walk(value, (f"f:{key}",), (key,), strategies, out)
    return out


def _walk(
    value: Any,
    path: Path,
    names: tuple[str, ...],
    strategies: dict[tuple[str, ...], str],
    out: dict[Path, Any],
) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _walk(v, (*path, f"f:{k}"), (*names, k), strategies, out)
        return
    if isinstance(value, list) and value and names in strategies:
        strategy = strategies[names]
        for item in value:
            if strategy == SET:
                out[(*path, "v:" + _compact(item))] = item
            elif isinstance(item, dict) and strategy in item:
                elem = "k:" + _compact({strategy: item[strategy]})
                out[(*path, elem, ".")] = None
                for k, v in item.items():
                    _walk(v, (*path, elem, f"f:{k}"), (*names, k), strategies, out)
        return
    out[path] = value  # a scalar, an empty map, or an atomic list


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def trie(paths: set[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for elem in path:
            node = node.setdefault(elem, {})
    return root


def paths_of(fields: Obj, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for elem, child in fields.items():
        here = (*prefix, elem)
        if child:
            out |= paths_of(child, here)
        else:
            out.add(here)
    return out


def _entries(obj: Obj | None) -> list[Obj]:
    return copy.deepcopy(((obj or {}).get("metadata") or {}).get("managedFields") or [])


def _entry(
    entries: list[Obj], manager: str, operation: str, api_version: str, subresource: str
) -> Obj:
    for e in entries:
        if (e.get("manager"), e.get("operation"), e.get("subresource", "")) == (
            manager,
            operation,
            subresource,
        ):
            e["apiVersion"] = api_version
            return e
    e = {"manager": manager, "operation": operation, "apiVersion": api_version}
    e |= {"time": "", "fieldsType": "FieldsV1", "fieldsV1": {}}
    if subresource:
        e["subresource"] = subresource
    entries.append(e)
    return e


def _store(entries: list[Obj], owned: dict[int, set[Path]], now: str) -> list[Obj]:
    out = []
    for i, e in enumerate(entries):
        paths = owned.get(i, paths_of(e.get("fieldsV1") or {}))
        if not paths:
            continue
        if i in owned:
            e["fieldsV1"] = trie(paths)
            e["time"] = now
        out.append(e)
    return out


def track_update(
    old: Obj | None,
    new: Obj,
    *,
    kind: str,
    manager: str,
    api_version: str,
    subresource: str,
    with_status: bool,
    now: str,
) -> list[Obj]:
    """The managedFields after an `Update` by `manager`: it owns what it changed; the others
    lose what it changed or removed."""
    before = leaves(old, kind, subresource, with_status) if old else {}
    after = leaves(new, kind, subresource, with_status)
    changed = {p for p, v in after.items() if before.get(p, _MISSING) != v}
    gone = set(before) - set(after)
    entries = _entries(old)
    mine = _entry(entries, manager, "Update", api_version, subresource)
    owned: dict[int, set[Path]] = {}
    for i, e in enumerate(entries):
        paths = paths_of(e.get("fieldsV1") or {})
        if e is mine:
            owned[i] = (paths - gone) | changed
        elif paths & (changed | gone):
            owned[i] = paths - changed - gone
    return _store(entries, owned, now)


def server_side_apply(
    current: Obj | None,
    config: Obj,
    *,
    kind: str,
    custom: bool,
    manager: str,
    force: bool,
    api_version: str,
    subresource: str,
    with_status: bool,
    now: str,
) -> Obj:
    """The object after `manager` applies `config` to `current` (None: it is created), with its
    managedFields; 409 for conflicts unless `force`."""
    if not isinstance(config, dict):
        raise bad_request("error decoding patch: the apply configuration is not an object")
    applied = leaves(config, kind, subresource, with_status)
    now_leaves = leaves(current, kind, subresource, with_status) if current else {}
    entries = _entries(current)
    mine = _entry(entries, manager, "Apply", api_version, subresource)
    owned = {i: paths_of(e.get("fieldsV1") or {}) for i, e in enumerate(entries)}
    conflicts: list[tuple[Obj, Path]] = []
    for i, e in enumerate(entries):
        if e is mine:
            continue
        for p in sorted(owned[i] & set(applied)):
            if now_leaves.get(p, _MISSING) != applied[p] and applied[p] is not None:
                conflicts.append((e, p))
    if conflicts and not force:
        raise _conflict(conflicts)
    for e, p in conflicts:
        owned[entries.index(e)].discard(p)
    base = copy.deepcopy(current) if current else {}
    merged: Obj = merge_patch(base, config) if custom else strategic_merge_patch(base, config, kind)
    mine_index = entries.index(mine)
    others = set().union(*(ps for i, ps in owned.items() if i != mine_index)) if owned else set()
    for p in sorted(owned[mine_index] - set(applied) - others, key=len, reverse=True):
        _remove(merged, p)
    owned[mine_index] = set(applied)
    merged.setdefault("metadata", {})["managedFields"] = _store(entries, owned, now)
    return merged


def _conflict(conflicts: list[tuple[Obj, Path]]) -> ApiError:
    def field(p: Path) -> str:
        out = ""
        for elem in p:
            if elem.startswith("f:"):
                out += "." + elem[2:]
            elif elem.startswith(("k:", "v:")):
                out += "[" + elem[2:].replace('{"', "").replace('":', "=").rstrip("}") + "]"
        return out

    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{e["manager"]}"'
            + (f" using {e['apiVersion']}" if e.get("apiVersion") else ""),
            "field": field(p),
        }
        for e, p in conflicts
    ]
    n = len(conflicts)
    lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
    message = (
        f"Apply failed with {n} conflict{'s' if n > 1 else ''}: {causes[0]['message']}: "
        f"{causes[0]['field']}"
        if n == 1
        else f"Apply failed with {n} conflicts: {lines}"
    )
    return ApiError(409, "Conflict", message, details={"causes": causes})


def _remove(obj: Any, path: Path) -> None:
    """Take the field at `path` out of `obj` (a list item by its key or value)."""
    if path and path[-1] == ".":
        path = path[:-1]
    node = obj
    for elem in path[:-1]:
        node = _step(node, elem)
        if node is None:
            return
    last = path[-1]
    if isinstance(node, dict) and last.startswith("f:"):
        node.pop(last[2:], None)
    elif isinstance(node, list):
        target = _step(node, last)
        if target is not None:
            node.remove(target)


def _step(node: Any, elem: str) -> Any:
    if elem.startswith("f:") and isinstance(node, dict):
        return node.get(elem[2:])
    if elem.startswith("k:") and isinstance(node, list):
        key = json.loads(elem[2:])
        return next(
            (i for i in node if isinstance(i, dict) and all(i.get(k) == v for k, v in key.items())),
            None,
        )
    if elem.startswith("v:") and isinstance(node, list):
        value = json.loads(elem[2:])
        return next((i for i in node if i == value), None)
    return None
