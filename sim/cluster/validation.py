"""The validation the real API server applies to the fields nodeward writes (422 Invalid)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from sim.cluster import webhooks
from sim.cluster.errors import invalid
from sim.cluster.resources import ResourceType

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Pod spec fields an update may change (the rest are immutable, as on a real cluster).
_POD_MUTABLE = (
    "activeDeadlineSeconds",
    "tolerations",
    "terminationGracePeriodSeconds",
    "schedulingGates",
)

Cause = tuple[str, str, str]


def _qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _key_causes(field: str, key: str) -> list[Cause]:
    """Why `key` of the labels or annotations (`field`) is not a qualified name, if it is not."""
    if _qualified_name(key):
        return []
    why = "name part must consist of alphanumeric characters, '-', '_' or '.'"
    return [(field, "FieldValueInvalid", f'Invalid value: "{key}": {why}')]


def _path_segment_name(name: str) -> str:
    """Why `name` is not a valid path segment (the rule for RBAC names: `system:basic-user`
    is one), or ""."""
    if name in (".", ".."):
        return f"may not be '{name}'"
    for bad in ("/", "%"):
        if bad in name:
            return f"may not contain '{bad}'"
    return ""


def _metadata(rt: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        causes.append(
            (
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )
        )
    elif rt.group == "rbac.authorization.k8s.io":
        if why := _path_segment_name(name):
            causes.append(("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {why}'))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        causes.append(
            (
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 '
                "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
                "start and end with an alphanumeric character",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        causes += _key_causes("metadata.labels", key)
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                (
                    "metadata.labels",
                    "FieldValueInvalid",
                    f'Invalid value: "{value}": a valid label '
                    "must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character",
                )
            )
    for key, value in (meta.get("annotations") or {}).items():
        causes += _key_causes("metadata.annotations", key)
        if not isinstance(value, str):
            causes.append(
                (
                    "metadata.annotations",
                    "FieldValueInvalid",
                    f"Invalid value: {key}: must be a string",
                )
            )
    return causes


def _node(obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for n, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        key, effect = taint.get("key") or "", taint.get("effect") or ""
        if not key:
            causes.append((f"spec.taints[{n}].key", "FieldValueRequired", "Required value"))
        elif not _qualified_name(key):
            causes.append((f"spec.taints[{n}].key", "FieldValueInvalid", f'Invalid value: "{key}"'))
        if effect not in _TAINT_EFFECTS:
            causes.append(
                (
                    f"spec.taints[{n}].effect",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{effect}": supported values: "NoSchedule", '
                    '"PreferNoSchedule", "NoExecute"',
                )
            )
        if (key, effect) in seen:
            causes.append(
                (
                    "spec.taints",
                    "FieldValueDuplicate",
                    f'Duplicate value: core.Taint{{Key:"{key}", Effect:"{effect}"}}: '
                    "taints must be unique by key and effect pair",
                )
            )
        seen.add((key, effect))
    for n, cond in enumerate((obj.get("status") or {}).get("conditions") or []):
        if not cond.get("type"):
            causes.append((f"status.conditions[{n}].type", "FieldValueRequired", "Required value"))
        if cond.get("status") not in ("True", "False", "Unknown"):
            causes.append(
                (
                    f"status.conditions[{n}].status",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{cond.get("status")}"',
                )
            )
    return causes


def _pod_create(obj: dict[str, Any]) -> list[Cause]:
    """`ValidatePodSpec`'s required fields: at least one container, each named, with an image
    (`pkg/apis/core/validation`: a pod's containers, unlike a template's, need an image)."""
    spec = obj.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return [("spec.containers", "FieldValueRequired", "Required value")]
    causes: list[Cause] = []
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            for f in ("name", "image"):
                if not (c or {}).get(f):
                    causes.append((f"spec.{key}[{i}].{f}", "FieldValueRequired", "Required value"))
    return causes


def _pod(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    if old is None:
        return _pod_create(obj)
    new_spec, old_spec = dict(obj.get("spec") or {}), dict(old.get("spec") or {})
    for f in _POD_MUTABLE:
        new_spec.pop(f, None)
        old_spec.pop(f, None)
    for spec in (new_spec, old_spec):
        for key in ("containers", "initContainers"):
            spec[key] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(key) or []]
    if new_spec != old_spec:
        return [
            (
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                "`spec.tolerations` (only additions to existing tolerations), "
                "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            )
        ]
    return []


def _event(obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    for f in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
        if not obj.get(f):
            causes.append((f, "FieldValueRequired", "Required value"))
    if obj.get("type") not in ("Normal", "Warning"):
        causes.append(
            (
                "type",
                "FieldValueNotSupported",
                f'Unsupported value: "{obj.get("type")}": supported values: "Normal", "Warning"',
            )
        )
    if len(obj.get("note") or "") > 1024:
        causes.append(("note", "FieldValueTooLong", "Too long: may not be more than 1024 bytes"))
    return causes


def _secret(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    causes: list[Cause] = []
    frozen = old is not None and bool(old.get("immutable"))
    if frozen and (obj.get("data") != (old or {}).get("data") or obj.get("immutable") is not True):
        causes.append(
            ("data", "FieldValueForbidden", "Forbidden: field is immutable when `immutable` is set")
        )
    for key, value in (obj.get("data") or {}).items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError):
            causes.append(
                (f"data[{key}]", "FieldValueInvalid", "Invalid value: illegal base64 data")
            )
    return causes


def _pdb(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    if "minAvailable" in spec and "maxUnavailable" in spec:
        return [
            (
                "spec",
                "FieldValueInvalid",
                "Invalid value: minAvailable and maxUnavailable cannot be both set",
            )
        ]
    return []


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DEVICE_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")


def _required(value: Any, path: str) -> list[Cause]:
    return [] if value else [(path, "FieldValueRequired", "Required value")]


def _resource_slice(obj: dict[str, Any]) -> list[Cause]:
    """resource.k8s.io ResourceSlice: driver, pool and exactly one node scope (v1 rules)."""
    spec = obj.get("spec") or {}
    causes = _required(spec.get("driver"), "spec.driver")
    pool = spec.get("pool") or {}
    causes += _required(pool.get("name"), "spec.pool.name")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        causes.append(
            ("spec.pool.resourceSliceCount", "FieldValueInvalid", "Invalid value: must be > 0")
        )
    scopes = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(scopes) != 1:
        causes.append(
            (
                "spec",
                "FieldValueInvalid",
                "Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            )
        )
    names: set[str] = set()
    for n, device in enumerate(spec.get("devices") or []):
        name = device.get("name") or ""
        if not name:
            causes.append((f"spec.devices[{n}].name", "FieldValueRequired", "Required value"))
        elif not _DNS_LABEL.match(name) or len(name) > 63:
            causes.append(
                (f"spec.devices[{n}].name", "FieldValueInvalid", f'Invalid value: "{name}"')
            )
        elif name in names:
            causes.append(
                (f"spec.devices[{n}].name", "FieldValueDuplicate", f'Duplicate value: "{name}"')
            )
        names.add(name)
    return causes


def _device_taint_rule(obj: dict[str, Any]) -> list[Cause]:
    """resource.k8s.io DeviceTaintRule: one taint with a key and a supported effect."""
    spec = obj.get("spec") or {}
    taint = spec.get("taint") or {}
    key, effect = taint.get("key") or "", taint.get("effect") or ""
    causes = _required(key, "spec.taint.key")
    if key and not _qualified_name(key):
        causes.append(("spec.taint.key", "FieldValueInvalid", f'Invalid value: "{key}"'))
    value = taint.get("value") or ""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        causes.append(("spec.taint.value", "FieldValueInvalid", f'Invalid value: "{value}"'))
    if not effect:
        causes.append(("spec.taint.effect", "FieldValueRequired", "Required value"))
    elif effect not in _DEVICE_TAINT_EFFECTS:
        causes.append(
            (
                "spec.taint.effect",
                "FieldValueNotSupported",
                f'Unsupported value: "{effect}": supported values: "NoExecute", "NoSchedule", '
                '"None"',
            )
        )
    selector = spec.get("deviceSelector") or {}
    for field in ("driver", "pool", "device"):
        value = selector.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            causes.append(
                (f"spec.deviceSelector.{field}", "FieldValueInvalid", f'Invalid value: "{value}"')
            )
    return causes


def _workload(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """apps/v1 and Job validation (`pkg/apis/apps/validation`, `pkg/apis/batch/validation`):
    a selector that is not empty and selects the template's labels, a template with
    containers, non-negative replicas; an apps/v1 selector and a Job's template are
    immutable."""
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    causes: list[Cause] = []
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        causes.append(("spec.selector", "FieldValueRequired", "Required value"))
    elif any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        causes.append(
            (
                "spec.template.metadata.labels",
                "FieldValueInvalid",
                f"Invalid value: {json.dumps(labels, separators=(',', ':'))}: `selector` does "
                "not match template `labels`",
            )
        )
    if not (template.get("spec") or {}).get("containers"):
        causes.append(("spec.template.spec.containers", "FieldValueRequired", "Required value"))
    for key in ("replicas", "parallelism", "completions", "backoffLimit"):
        value = spec.get(key)
        if isinstance(value, int) and value < 0:
            causes.append(
                (
                    f"spec.{key}",
                    "FieldValueInvalid",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                )
            )
    if old is not None:
        old_spec = old.get("spec") or {}
        if kind != "Job" and old_spec.get("selector") != spec.get("selector"):
            causes.append(
                ("spec.selector", "FieldValueInvalid", "Invalid value: field is immutable")
            )
        if kind == "Job" and old_spec.get("template") != spec.get("template"):
            causes.append(
                ("spec.template", "FieldValueInvalid", "Invalid value: field is immutable")
            )
    return causes


def validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Raise 422 Invalid with the causes the real API would list."""
    causes = _metadata(rt, obj)
    if rt.kind == "Node":
        causes += _node(obj)
    elif rt.kind == "Pod":
        causes += _pod(obj, old)
    elif rt.kind == "Event" and rt.group == "events.k8s.io":
        causes += _event(obj)
    elif rt.kind == "Secret":
        causes += _secret(obj, old)
    elif rt.kind == "PodDisruptionBudget":
        causes += _pdb(obj)
    elif rt.kind == "ResourceSlice":
        causes += _resource_slice(obj)
    elif rt.kind == "DeviceTaintRule":
        causes += _device_taint_rule(obj)
    elif rt.kind in ("Deployment", "ReplicaSet", "StatefulSet", "Job"):
        causes += _workload(rt.kind, obj, old)
    elif rt.group == webhooks.GROUP:
        causes += webhooks.validate_configuration(rt.kind, obj)
    if causes:
        raise invalid(rt.kind, (obj.get("metadata") or {}).get("name", ""), rt.group, causes)
