"""Request bodies decoded as the API server decodes them into its typed objects.

The API server unmarshals a body into the kind's Go struct (`sigs.k8s.io/json`, case
sensitive), so a field the struct does not have is never stored, and a value of the wrong
JSON type is refused. What it does with unknown and duplicate fields is the request's
`fieldValidation` (apiserver `pkg/endpoints/handlers/create.go`, `update.go`, `patch.go`):

- `Strict`: refused. A create or update answers 400 BadRequest, `Pod in version "v1" cannot
  be handled as a Pod: strict decoding error: unknown field "spec.bogus"`; a merge or JSON
  patch answers 422 Invalid on the field `patch`.
- `Warn`, the default since 1.27: stored without them, with one `Warning: 299 - "unknown
  field \\"spec.bogus\\""` response header per field (`addStrictDecodingWarnings`).
- `Ignore`: dropped silently.

A wrong type answers 400 (`json: cannot unmarshal number into Go struct field
ConfigMap.data of type string`) on create and update, 422 on `patch` for a patch, whatever
the directive. `null` is always accepted: it leaves a field unset, as in Go.

The structs are the schemas the sim serves at `/openapi/v2` (`openapi.definitions`, made from
the `kubernetes` client's models). Building them imports every model (seconds), so they are
cached on disk by client version and builder source; the sim loads them in a thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from sim.cluster.errors import ApiError, bad_request

Schema = dict[str, Any]

DIRECTIVES = ("Ignore", "Strict", "Warn")
DEFAULT_DIRECTIVE = "Warn"
# Maps whose values are resource.Quantity on the server (the client's models type them as
# strings): a JSON number is a quantity too, stored as its string form.
_QUANTITY_MAPS = frozenset(
    {"allocatable", "capacity", "limits", "requests", "hard", "used", "overhead"}
)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_KEPT = ("type", "format", "properties", "additionalProperties", "items", "$ref", "required")
_FORMAT = 1  # bump when what is cached changes shape


class Duplicated(dict[str, Any]):
    """A JSON object that named some keys more than once (the last value stands, as in Go)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        counts: dict[str, int] = {}
        for key, _ in pairs:
            counts[key] = counts.get(key, 0) + 1
        self.duplicates = [k for k, n in counts.items() if n > 1]


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads(object_pairs_hook=...)`: a plain dict, or a `Duplicated` one."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) == len(keys):
        return dict(pairs)
    return Duplicated(pairs)


@dataclass
class Decoded:
    """A body as the server's struct keeps it, and what the strict decoder said of it."""

    obj: Any
    strict: list[str] = field(default_factory=list)
    """`unknown field "..."` and `duplicate field "..."`, in document order."""
    type_error: str | None = None
    """The first wrong type, as Go's decoder words it; the object is then not stored."""


class Fields:
    """The served kinds' structs, walked to decode a body."""

    def __init__(self, defs: dict[str, Schema], kinds: dict[str, str]) -> None:
        self.defs = defs
        self.kinds = kinds

    @classmethod
    def build(cls) -> Fields:
        from sim.cluster import openapi  # imports every model of the client: seconds

        defs, kinds = openapi.definitions()
        return cls({name: _compact(schema) for name, schema in defs.items()}, kinds)

    @classmethod
    def load(cls, cache_dir: Path | None = None) -> Fields:
        """From the disk cache when it matches this client and this builder, else built and
        cached (atomically: two sims may build at once)."""
        directory = cache_dir or _cache_dir()
        path = directory / f"sim-cluster-fields-{_cache_key()}.json"
        try:
            cached = json.loads(path.read_bytes())
            return cls(cached["defs"], cached["kinds"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        fields = cls.build()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("wb", dir=directory, delete=False) as out:
                out.write(json.dumps({"defs": fields.defs, "kinds": fields.kinds}).encode())
            os.replace(out.name, path)
        except OSError:
            pass  # an unwritable cache costs the next sim the build, nothing else
        return fields

    def decode(self, group: str, version: str, kind: str, body: Any) -> Decoded:
        """`body` as the struct of `group/version/kind` keeps it; a kind the sim has no
        schema for is kept whole."""
        name = self.kinds.get(f"{group}/{version}/{kind}")
        if name is None:
            return Decoded(body)
        walk = _Walk(self.defs, kind)
        obj = walk.value(body, {"$ref": f"#/definitions/{name}"}, _At("", (), kind))
        return Decoded(obj, walk.strict, walk.type_error)


def directive(query: Any, options_kind: str) -> str:
    """The request's `fieldValidation`: 422 for a value the server does not know."""
    said = query.get("fieldValidation", "")
    if said == "":
        return DEFAULT_DIRECTIVE
    if said not in DIRECTIVES:
        supported = ", ".join(f'"{d}"' for d in DIRECTIVES)
        message = f'fieldValidation: Unsupported value: "{said}": supported values: {supported}'
        raise ApiError(
            422,
            "Invalid",
            f'{options_kind}.meta.k8s.io "" is invalid: {message}',
            details={
                "group": "meta.k8s.io",
                "kind": options_kind,
                "causes": [
                    {
                        "reason": "FieldValueNotSupported",
                        "message": message.split(": ", 1)[1],
                        "field": "fieldValidation",
                    }
                ],
            },
        )
    return str(said)


def strict_error(strict: list[str]) -> str:
    """`runtime.NewStrictDecodingError(...).Error()`."""
    return "strict decoding error: " + ", ".join(strict)


def warning_header(text: str) -> str:
    """One `Warning` header value (RFC 7234 form, code 299, agent `-`), as the API server
    writes it."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def refuse_body(kind: str, version: str, decoded: Decoded, mode: str) -> None:
    """A create's or update's answer when the body cannot be stored as it is: 400 for a
    wrong type, and under `Strict` for any unknown or duplicate field."""
    prefix = f'{kind} in version "{version}" cannot be handled as a {kind}: '
    if decoded.type_error is not None:
        raise bad_request(prefix + decoded.type_error)
    if decoded.strict and mode == "Strict":
        raise bad_request(prefix + strict_error(decoded.strict))


def refuse_patch(patched: Any, decoded: Decoded, mode: str) -> None:
    """A patch's answer when its result cannot be stored as it is: 422 Invalid on `patch`."""
    if decoded.type_error is not None:
        message = decoded.type_error
    elif decoded.strict and mode == "Strict":
        message = strict_error(decoded.strict)
    else:
        return
    shown = json.dumps(patched, separators=(",", ":"))
    text = f"Invalid value: {json.dumps(shown)}: {message}"
    raise ApiError(
        422,
        "Invalid",
        f' "" is invalid: patch: {text}',
        details={"causes": [{"reason": "FieldValueInvalid", "message": text, "field": "patch"}]},
    )


@dataclass(frozen=True)
class _At:
    """Where a value is: `path` as strict errors name it (`spec.containers[0].image`),
    `stack` and `struct` as Go's type errors do (no indices; the innermost struct's name)."""

    path: str
    stack: tuple[str, ...]
    struct: str

    def field(self, key: str, struct: str) -> _At:
        return _At(_join(self.path, key), (*self.stack, key), struct)

    def entry(self, key: str) -> _At:
        return _At(_join(self.path, key), self.stack, self.struct)

    def item(self, index: int) -> _At:
        return _At(f"{self.path}[{index}]", self.stack, self.struct)


class _Walk:
    """One decode: the unknown and duplicate fields and the first type error found."""

    def __init__(self, defs: dict[str, Schema], kind: str) -> None:
        self.defs = defs
        self.kind = kind
        self.strict: list[str] = []
        self.type_error: str | None = None

    def _wrong(self, value: Any, go_type: str, at: _At) -> None:
        if self.type_error is None:
            self.type_error = (
                f"json: cannot unmarshal {_json_kind(value, go_type)} into Go struct field "
                f"{at.struct}.{'.'.join(at.stack)} of type {go_type}"
            )

    def resolve(self, schema: Schema) -> tuple[Schema, str | None]:
        name = None
        while "$ref" in schema:
            name = schema["$ref"].removeprefix("#/definitions/")
            schema = self.defs.get(name, {})
        return schema, name

    def value(self, value: Any, schema: Schema, at: _At) -> Any:
        """`value` as a field of `schema` keeps it."""
        if value is None:
            return None
        schema, name = self.resolve(schema)
        typ, fmt = schema.get("type"), schema.get("format")
        if fmt == "int-or-string":
            if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
                return value
            self._wrong(value, "intstr.IntOrString", at)
            return value
        if typ == "object" or "properties" in schema:
            return self._object(value, schema, name, at)
        if typ == "array":
            items = schema.get("items") or {}
            if not isinstance(value, list):
                self._wrong(value, "[]" + _go_type(items, self), at)
                return value
            return [self.value(v, items, at.item(i)) for i, v in enumerate(value)]
        self._scalar(value, typ, fmt, at)
        return value

    def _object(self, value: Any, schema: Schema, name: str | None, at: _At) -> Any:
        props: Schema | None = schema.get("properties")
        extra: Schema | None = schema.get("additionalProperties")
        if not isinstance(value, dict):
            self._wrong(value, _go_type(schema, self, name), at)
            return value
        if props is None and extra is None:
            return dict(value)  # free-form (RawExtension, JSON): kept as sent
        if isinstance(value, Duplicated):
            self.strict += [f'duplicate field "{_join(at.path, k)}"' for k in value.duplicates]
        if props is None:
            assert extra is not None
            quantities = bool(at.stack) and at.stack[-1] in _QUANTITY_MAPS
            out = {}
            for key, v in value.items():
                if quantities and isinstance(v, int | float) and not isinstance(v, bool):
                    out[key] = str(v)
                else:
                    out[key] = self.value(v, extra, at.entry(key))
            return out
        inner = name.rsplit(".", 1)[-1] if name else at.struct
        kept = {}
        for key, v in value.items():
            prop = props.get(key)
            if prop is None:
                self.strict.append(f'unknown field "{_join(at.path, key)}"')
                continue
            kept[key] = self.value(v, prop, at.field(key, inner))
        return kept

    def _scalar(self, value: Any, typ: Any, fmt: Any, at: _At) -> None:
        if typ == "string":
            if not isinstance(value, str):
                self._wrong(value, "string", at)
            elif fmt == "date-time" and not _RFC3339.match(value) and self.type_error is None:
                self.type_error = (
                    f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse '
                    f'"{value}" as "2006"'
                )
        elif typ == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                self._wrong(value, str(fmt or "int64"), at)  # 1.0 too, as in Go
        elif typ == "number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                self._wrong(value, "float64", at)
        elif typ == "boolean" and not isinstance(value, bool):
            self._wrong(value, "bool", at)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_kind(value: Any, go_type: str) -> str:
    """How Go's decoder names the JSON value it could not store (`number 1.5` into an int)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}" if go_type.startswith("int") else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_type(schema: Schema, walk: _Walk, name: str | None = None) -> str:
    """A Go type's name for a schema: `v1.PodSpec`, `[]v1.Container`, `map[string]string`."""
    schema, resolved = walk.resolve(schema)
    name = name or resolved
    if name:
        parts = name.split(".")
        return f"{parts[-2]}.{parts[-1]}"
    typ = schema.get("type")
    if typ == "array":
        return "[]" + _go_type(schema.get("items") or {}, walk)
    if typ == "object":
        extra = schema.get("additionalProperties")
        return f"map[string]{_go_type(extra, walk)}" if extra else "map[string]interface {}"
    return {"string": "string", "integer": "int64", "number": "float64", "boolean": "bool"}.get(
        str(typ), "interface {}"
    )


def _compact(schema: Any) -> Any:
    """A schema without what decoding does not read (descriptions, extensions)."""
    if isinstance(schema, list):
        return [_compact(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key in _KEPT:
        if key not in schema:
            continue
        if key == "properties":
            out[key] = {k: _compact(v) for k, v in schema[key].items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _compact(schema[key])
        else:
            out[key] = schema[key]
    return out


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodeward"


def _cache_key() -> str:
    """The client's version and a digest of the code that builds the schemas."""
    here = Path(__file__).parent
    digest = hashlib.sha256(str(_FORMAT).encode())
    for module in ("openapi.py", "decoding.py", "patch.py", "resources.py"):
        digest.update((here / module).read_bytes())
    return f"{dist_version('kubernetes')}-{digest.hexdigest()[:16]}"
