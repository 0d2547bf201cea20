"""The protobuf form of an OpenAPI v2 document, as `/openapi/v2` serves it to kubectl.

kubectl asks for `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` only and decodes
the body as gnostic's `openapi.v2.Document` (google/gnostic, openapiv2/OpenAPIv2.proto). This
module encodes the parts of that message a Kubernetes API server's document uses: paths with
operations, query, path and body parameters and responses; definitions; security; and vendor
extensions (`x-...`), which gnostic carries as YAML text. Anything else is a `ValueError`, so a
new construct in `openapi.py` fails its test instead of silently vanishing from kubectl's view.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import yaml

from nodeward.protowire import field_bytes, varint

Encoder = Callable[[Any], bytes]


def _string(number: int) -> Encoder:
    return lambda v: field_bytes(number, str(v)) if v != "" else b""


def _strings(number: int) -> Encoder:
    return lambda v: b"".join(field_bytes(number, str(s)) for s in v)


def _bool(number: int) -> Encoder:
    return lambda v: varint(number << 3) + varint(1) if v else b""


def _int64(number: int) -> Encoder:
    return lambda v: varint(number << 3) + varint(int(v) & 0xFFFFFFFFFFFFFFFF) if v else b""


def _double(number: int) -> Encoder:
    return lambda v: varint(number << 3 | 1) + struct.pack("<d", float(v)) if v else b""


def _message(number: int, encode: Encoder) -> Encoder:
    return lambda v: field_bytes(number, encode(v))


def _any(value: Any) -> bytes:
    """gnostic `Any`: the value as YAML text (field 2)."""
    text = yaml.safe_dump(value, default_flow_style=False, sort_keys=False)
    if text.endswith("...\n"):
        text = text[: -len("...\n")]
    return field_bytes(2, text)


def _named(number: int, encode: Encoder) -> Encoder:
    """A map as gnostic's repeated `Named*` pairs (name = 1, value = 2)."""
    return lambda v: b"".join(
        field_bytes(number, field_bytes(1, str(name)) + field_bytes(2, encode(value)))
        for name, value in v.items()
    )


def _fields(spec: dict[str, Encoder], extensions: int | None) -> Encoder:
    """A message from an object whose keys `spec` maps; `x-` keys go to `extensions`."""
    numbered = list(spec.items())

    def encode(obj: dict[str, Any]) -> bytes:
        unknown = [k for k in obj if k not in spec and not (extensions and k.startswith("x-"))]
        if unknown:
            raise ValueError(f"cannot encode {', '.join(sorted(unknown))} as OpenAPI v2 protobuf")
        out = b"".join(enc(obj[key]) for key, enc in numbered if key in obj)
        if extensions:
            out += b"".join(
                field_bytes(extensions, field_bytes(1, key) + field_bytes(2, _any(value)))
                for key, value in obj.items()
                if key.startswith("x-")
            )
        return out

    return encode


def _schema(obj: dict[str, Any]) -> bytes:
    return _SCHEMA(obj)


def _additional_properties(value: Any) -> bytes:
    if isinstance(value, bool):
        return varint(2 << 3) + varint(int(value))
    return field_bytes(1, _schema(value))


def _items(value: Any) -> bytes:
    items = value if isinstance(value, list) else [value]
    return b"".join(field_bytes(1, _schema(s)) for s in items)


_SCHEMA = _fields(
    {
        "$ref": _string(1),
        "format": _string(2),
        "title": _string(3),
        "description": _string(4),
        "default": _message(5, _any),
        "multipleOf": _double(6),
        "maximum": _double(7),
        "exclusiveMaximum": _bool(8),
        "minimum": _double(9),
        "exclusiveMinimum": _bool(10),
        "maxLength": _int64(11),
        "minLength": _int64(12),
        "pattern": _string(13),
        "maxItems": _int64(14),
        "minItems": _int64(15),
        "uniqueItems": _bool(16),
        "maxProperties": _int64(17),
        "minProperties": _int64(18),
        "required": _strings(19),
        "enum": lambda v: b"".join(field_bytes(20, _any(e)) for e in v),
        "additionalProperties": _message(21, _additional_properties),
        "type": _message(22, lambda v: _strings(1)(v if isinstance(v, list) else [v])),
        "items": _message(23, _items),
        "allOf": lambda v: b"".join(field_bytes(24, _schema(s)) for s in v),
        "properties": _message(25, _named(1, _schema)),
        "readOnly": _bool(27),
    },
    extensions=31,
)

# Parameters: a body parameter, or one of the non-body kinds, each its own message.
_BODY = _fields(
    {
        "description": _string(1),
        "name": _string(2),
        "in": _string(3),
        "required": _bool(4),
        "schema": _message(5, _schema),
    },
    extensions=6,
)


def _non_body(allow_empty: int) -> Encoder:
    """`QueryParameterSubSchema` (`allow_empty` 1) or `PathParameterSubSchema` (0): alike,
    but a query's `allowEmptyValue` (5) numbers every later field one more."""
    return _fields(
        {
            "required": _bool(1),
            "in": _string(2),
            "description": _string(3),
            "name": _string(4),
            "type": _string(5 + allow_empty),
            "format": _string(6 + allow_empty),
            "uniqueItems": _bool(19 + allow_empty),
        },
        extensions=22 + allow_empty,
    )


_QUERY = _non_body(1)
_PATH = _non_body(0)


def _parameter(param: dict[str, Any]) -> bytes:
    """`ParametersItem` { parameter = 1: `Parameter` { body = 1 | non_body = 2 } }."""
    where = param.get("in")
    if where == "body":
        inner = field_bytes(1, _BODY(param))
    elif where == "query":
        inner = field_bytes(2, field_bytes(3, _QUERY(param)))
    elif where == "path":
        inner = field_bytes(2, field_bytes(4, _PATH(param)))
    else:
        raise ValueError(f"cannot encode a parameter in {where!r}")
    return field_bytes(1, inner)


def _parameters(number: int) -> Encoder:
    return lambda v: b"".join(field_bytes(number, _parameter(p)) for p in v)


_RESPONSE = _fields(
    {"description": _string(1), "schema": _message(2, lambda s: field_bytes(1, _schema(s)))},
    extensions=5,
)
# Responses { response_code = 1: NamedResponseValue { value: ResponseValue { response = 1 } } }
_RESPONSES = _named(1, lambda r: field_bytes(1, _RESPONSE(r)))
_OPERATION = _fields(
    {
        "tags": _strings(1),
        "summary": _string(2),
        "description": _string(3),
        "operationId": _string(5),
        "produces": _strings(6),
        "consumes": _strings(7),
        "parameters": _parameters(8),
        "responses": _message(9, _RESPONSES),
        "schemes": _strings(10),
        "deprecated": _bool(11),
    },
    extensions=13,
)
_PATH_ITEM = _fields(
    {
        "$ref": _string(1),
        "get": _message(2, _OPERATION),
        "put": _message(3, _OPERATION),
        "post": _message(4, _OPERATION),
        "delete": _message(5, _OPERATION),
        "options": _message(6, _OPERATION),
        "head": _message(7, _OPERATION),
        "patch": _message(8, _OPERATION),
        "parameters": _parameters(9),
    },
    extensions=10,
)
_API_KEY = _fields(
    {"type": _string(1), "name": _string(2), "in": _string(3), "description": _string(4)},
    extensions=5,
)


def _security_definition(value: dict[str, Any]) -> bytes:
    if value.get("type") != "apiKey":
        raise ValueError(f"cannot encode a {value.get('type')!r} security definition")
    return field_bytes(2, _API_KEY(value))  # SecurityDefinitionsItem.api_key_security


def _security_requirement(value: dict[str, list[str]]) -> bytes:
    return _named(1, _strings(1))(value)  # NamedStringArray { value: StringArray }


_DOCUMENT = _fields(
    {
        "swagger": _string(1),
        "info": _message(
            2,
            _fields({"title": _string(1), "version": _string(2), "description": _string(3)}, 7),
        ),
        "host": _string(3),
        "basePath": _string(4),
        "schemes": _strings(5),
        "consumes": _strings(6),
        "produces": _strings(7),
        "paths": _message(8, _named(2, _PATH_ITEM)),
        "definitions": _message(9, _named(1, _schema)),
        "security": lambda v: b"".join(field_bytes(12, _security_requirement(r)) for r in v),
        "securityDefinitions": _message(13, _named(1, _security_definition)),
    },
    extensions=16,
)


def document(doc: dict[str, Any]) -> bytes:
    """The gnostic `openapi.v2.Document` encoding of a Swagger 2.0 document."""
    return _DOCUMENT(doc)
