"""The sim cluster's OpenAPI documents: what kubectl and clients look up in them.

The protobuf form is read back here with the field numbers of gnostic's OpenAPIv2.proto
(google/gnostic, openapiv2/OpenAPIv2.proto), independently of the encoder.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from nodeward.protowire import fields
from sim.cluster import openapi, versions
from sim.cluster.resources import RESOURCES


@pytest.fixture(scope="module")
def docs() -> openapi.Documents:
    return openapi.build(versions.Apis())


@pytest.fixture(scope="module")
def v2(docs: openapi.Documents) -> dict[str, Any]:
    return json.loads(docs.v2_json)  # type: ignore[no-any-return]


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        out = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            out |= _refs(value)
        return out
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def _gvks(schema: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (g["group"], g["version"], g["kind"])
        for g in schema.get("x-kubernetes-group-version-kind", [])
    ]


def test_v2_has_a_definition_for_every_served_kind(v2: dict[str, Any]) -> None:
    defs = v2["definitions"]
    tagged = {gvk: name for name, d in defs.items() for gvk in _gvks(d)}
    for rt in RESOURCES:
        for version in rt.versions:
            assert (rt.group, version, rt.kind) in tagged, (rt.group, version, rt.kind)
            if "list" in rt.verbs:
                assert (rt.group, version, f"{rt.kind}List") in tagged
    assert tagged[("", "v1", "Pod")] == "io.k8s.api.core.v1.Pod"
    assert tagged[("", "v1", "Event")] == "io.k8s.api.core.v1.Event"
    assert tagged[("events.k8s.io", "v1", "Event")] == "io.k8s.api.events.v1.Event"
    assert tagged[("apps", "v1", "DaemonSet")] == "io.k8s.api.apps.v1.DaemonSet"
    assert tagged[("policy", "v1beta1", "PodDisruptionBudget")] == (
        "io.k8s.api.policy.v1beta1.PodDisruptionBudget"
    )
    assert tagged[("kubeflow.org", "v1", "Notebook")] == "org.kubeflow.v1.Notebook"
    # types shared across groups keep the names of the group they belong to
    template = defs["io.k8s.api.apps.v1.DaemonSetSpec"]["properties"]["template"]
    assert template["$ref"] == "#/definitions/io.k8s.api.core.v1.PodTemplateSpec"
    meta = defs["io.k8s.api.core.v1.Pod"]["properties"]["metadata"]
    assert meta["$ref"] == "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    assert {f"#/definitions/{n}" for n in defs} >= _refs(v2)


def test_v2_schemas_carry_fields_types_and_descriptions(v2: dict[str, Any]) -> None:
    defs = v2["definitions"]
    container = defs["io.k8s.api.core.v1.Container"]
    assert container["required"] == ["name"]
    assert container["properties"]["env"]["items"] == {
        "$ref": "#/definitions/io.k8s.api.core.v1.EnvVar"
    }
    assert container["properties"]["image"]["type"] == "string"
    assert "Container image name" in container["properties"]["image"]["description"]
    pdb_spec = defs["io.k8s.api.policy.v1.PodDisruptionBudgetSpec"]["properties"]
    int_or_string = "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"
    assert pdb_spec["minAvailable"]["$ref"] == int_or_string
    assert defs["io.k8s.api.core.v1.Secret"]["properties"]["data"] == {
        "type": "object",
        "additionalProperties": {"type": "string", "format": "byte"},
        "description": defs["io.k8s.api.core.v1.Secret"]["properties"]["data"]["description"],
    }
    created = defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]
    assert created["creationTimestamp"]["format"] == "date-time"
    assert "Standard object's metadata" in defs["io.k8s.api.core.v1.Node"]["properties"][
        "metadata"
    ].get("description", "")


def test_v2_patch_strategies_match_the_sims_strategic_merge(v2: dict[str, Any]) -> None:
    defs = v2["definitions"]

    def strategy(name: str, prop: str) -> tuple[str | None, str | None]:
        p = defs[name]["properties"][prop]
        return p.get("x-kubernetes-patch-strategy"), p.get("x-kubernetes-patch-merge-key")

    assert strategy("io.k8s.api.core.v1.PodSpec", "containers") == ("merge", "name")
    assert strategy("io.k8s.api.core.v1.Container", "env") == ("merge", "name")
    assert strategy("io.k8s.api.core.v1.NodeStatus", "conditions") == ("merge", "type")
    assert strategy("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers") == (
        "merge",
        None,
    )
    assert strategy("io.k8s.api.core.v1.NodeSpec", "taints") == (None, None)  # atomic


def test_v2_paths_declare_dry_run_for_each_kinds_patch(v2: dict[str, Any]) -> None:
    """What kubectl before 1.27 checks before `--dry-run=server`."""
    patches = [op["patch"] for op in v2["paths"].values() if "patch" in op]
    kinds = {(p["x-kubernetes-group-version-kind"]["kind"]) for p in patches}
    assert {"Node", "Pod", "PodDisruptionBudget", "Notebook"} <= kinds
    for op in patches:
        names = {p["name"] for p in op["parameters"] if p["in"] == "query"}
        assert {"dryRun", "fieldManager", "fieldValidation"} <= names
    ids = [
        op["operationId"]
        for item in v2["paths"].values()
        for method, op in item.items()
        if method != "parameters"
    ]
    assert len(ids) == len(set(ids))  # Swagger 2.0 wants them unique
    assert "patchCoreV1NamespacedPod" in ids and "listPolicyV1NamespacedPodDisruptionBudget" in ids
    # only what the claimed release serves: policy/v1beta1 went in 1.25
    assert "listPolicyV1beta1NamespacedPodDisruptionBudget" not in ids


def test_v3_index_and_documents(docs: openapi.Documents) -> None:
    index = docs.v3_index()["paths"]
    served = {
        f"apis/{rt.group}/{v}" if rt.group else f"api/{v}" for rt, v in versions.Apis().served
    }
    assert set(index) == served
    for gv, entry in index.items():
        body = docs.v3[gv]
        assert entry["serverRelativeURL"] == f"/openapi/v3/{gv}?hash={openapi.etag(body)}"
        assert docs.v3_hashes[gv] == openapi.etag(body)
        doc = json.loads(body)
        schemas = doc["components"]["schemas"]
        assert {f"#/components/schemas/{n}" for n in schemas} >= _refs(doc), gv
        group, version = (
            (gv.split("/")[1], gv.split("/")[2])
            if gv.startswith("apis/")
            else ("", gv.split("/")[1])
        )
        kinds = {
            k for s in schemas.values() for (g, v, k) in _gvks(s) if (g, v) == (group, version)
        }
        for rt in RESOURCES:
            if rt.group == group and version in rt.versions:
                assert rt.kind in kinds, (gv, rt.kind)
        for item in doc["paths"].values():
            if "patch" in item:
                params = {p["name"] for p in item["patch"]["parameters"] if p["in"] == "query"}
                assert "fieldValidation" in params  # kubectl 1.27+ validates on the server then
    core = json.loads(docs.v3["api/v1"])["components"]["schemas"]
    pod_spec = core["io.k8s.api.core.v1.Pod"]["properties"]["spec"]
    assert pod_spec["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]
    assert core["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["oneOf"] == [
        {"type": "integer"},
        {"type": "string"},
    ]


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (openapi.V2_PROTOBUF_ASKED, openapi.V2_PROTOBUF),  # what kubectl sends
        (openapi.V2_PROTOBUF, openapi.V2_PROTOBUF),
        ("application/json", "application/json"),
        ("", "application/json"),
        ("*/*", "application/json"),
        ("application/json, */*", "application/json"),
        (f"application/json;q=0.5, {openapi.V2_PROTOBUF}", openapi.V2_PROTOBUF),
        ("application/*;q=0.9, application/json;q=0.1", "application/json"),
        ("text/html", None),
        ("application/json;q=0", None),
    ],
)
def test_v2_content_negotiation(accept: str, expected: str | None) -> None:
    offers = [
        ("application/json", "application/json", b"j", "J"),
        (openapi.V2_PROTOBUF_ASKED, openapi.V2_PROTOBUF, b"p", "P"),
        (openapi.V2_PROTOBUF, openapi.V2_PROTOBUF, b"p", "P"),
    ]
    chosen = openapi.negotiate(accept, offers)
    assert (chosen[0] if chosen else None) == expected


# --- the protobuf form, read back -----------------------------------------------------------


def _text(b: bytes) -> str:
    return b.decode()


def _named(buf: bytes, decode: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, pair in fields(buf):
        entry = dict(fields(pair))
        out[_text(entry.get(1, b""))] = decode(entry.get(2, b""))
    return out


def _any(buf: bytes) -> Any:
    return yaml.safe_load(_text(dict(fields(buf))[2]))


def _schema(buf: bytes) -> dict[str, Any]:
    """openapi.v2.Schema: _ref 1, format 2, description 4, required 19, additionalProperties 21,
    type 22, items 23, properties 25, vendor_extension 31."""
    out: dict[str, Any] = {}
    for number, value in fields(buf):
        if number == 1:
            out["$ref"] = _text(value)
        elif number == 2:
            out["format"] = _text(value)
        elif number == 4:
            out["description"] = _text(value)
        elif number == 19:
            out.setdefault("required", []).append(_text(value))
        elif number == 21:
            inner = dict(fields(value))
            out["additionalProperties"] = _schema(inner[1]) if 1 in inner else bool(inner[2])
        elif number == 22:
            out["type"] = _text(dict(fields(value))[1])
        elif number == 23:
            out["items"] = _schema(dict(fields(value))[1])
        elif number == 25:
            out["properties"] = _named(value, _schema)
        elif number == 31:
            entry = dict(fields(value))
            out[_text(entry[1])] = _any(entry[2])
        else:
            raise AssertionError(f"unexpected Schema field {number}")
    return out


def test_protobuf_definitions_read_back_as_the_json_ones(
    docs: openapi.Documents, v2: dict[str, Any]
) -> None:
    top = {}
    for number, value in fields(docs.v2_proto):
        top.setdefault(number, []).append(value)
    assert _text(top[1][0]) == "2.0"
    definitions = _named(top[9][0], _schema)
    assert definitions == v2["definitions"]


def test_protobuf_paths_carry_kinds_and_query_parameters(docs: openapi.Documents) -> None:
    """Paths 8 -> path 2: NamedPathItem -> PathItem.patch 8 -> Operation: parameters 8
    (ParametersItem 1 -> Parameter.non_body 2 -> query 3 -> name 4), vendor_extension 13:
    what kubectl before 1.27 reads to decide whether `--dry-run=server` is supported."""
    top = dict(fields(docs.v2_proto))
    paths = {}
    for number, pair in fields(top[8]):
        assert number == 2
        entry = dict(fields(pair))
        paths[_text(entry[1])] = dict(fields(entry[2]))
    operation = list(fields(paths["/api/v1/nodes/{name}"][8]))
    names = set()
    for number, item in operation:
        if number != 8:
            continue
        parameter = dict(fields(dict(fields(item))[1]))
        if 2 in parameter:
            names.add(_text(dict(fields(dict(fields(parameter[2]))[3]))[4]))
    assert {"dryRun", "fieldValidation"} <= names
    extensions = {
        _text(dict(fields(v))[1]): _any(dict(fields(v))[2]) for n, v in operation if n == 13
    }
    assert extensions["x-kubernetes-group-version-kind"] == {
        "group": "",
        "kind": "Node",
        "version": "v1",
    }
    assert extensions["x-kubernetes-action"] == "patch"


class V1Widget:
    """NOTE: This class is auto generated by OpenAPI Generator.
    Ref: https://openapi-generator.tech

    Do not edit the class manually.
    """

    openapi_types = {"parts": "list[V1Part]", "labels": "dict(str, str)", "port": "object"}
    attribute_map = {"parts": "parts", "labels": "labels", "port": "port"}

    @property
    def parts(self) -> None:
        """Gets the parts of this V1Widget.  # noqa: E501

        The parts the widget is made of.  # noqa: E501

        :return: The parts of this V1Widget.  # noqa: E501
        :rtype: list[V1Part]
        """


class V1Part:
    """NOTE: This class is auto generated by OpenAPI Generator."""

    openapi_types = {"name": "str"}
    attribute_map = {"name": "name"}


def test_models_of_the_older_client_generator() -> None:
    """kubernetes before 35 types fields as `list[X]`/`dict(str, X)` and documents them in
    property docstrings, with no class descriptions."""
    builder = openapi._Builder()
    builder.models = type("Models", (), {"V1Widget": V1Widget, "V1Part": V1Part})
    name = builder.model("V1Widget", "io.k8s.api.example.v1")
    assert name == "io.k8s.api.example.v1.Widget"
    widget = builder.defs[name]
    assert "description" not in widget
    assert widget["properties"]["parts"] == {
        "type": "array",
        "items": {"$ref": "#/definitions/io.k8s.api.example.v1.Part"},
        "description": "The parts the widget is made of.",
    }
    assert widget["properties"]["labels"] == {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
    port = widget["properties"]["port"]
    assert port["$ref"] == f"#/definitions/{openapi.INT_OR_STRING}"
    assert port["description"].startswith("IntOrString is a type")  # the type's, for want of one
