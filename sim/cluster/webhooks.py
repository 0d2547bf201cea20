"""Dynamic admission webhooks, called as kube-apiserver calls them.

The webhook configurations (`admissionregistration.k8s.io/v1` MutatingWebhookConfiguration
and ValidatingWebhookConfiguration) get the API server's defaults (`pkg/apis/
admissionregistration/v1/defaults.go`) and validation (`pkg/apis/admissionregistration/
validation`). `Dispatcher` then calls them on the creates, updates, patches, applies,
deletes and evictions the sim serves over HTTP, and on its controllers' pod creates
(`sim.cluster.controllers.ControllerAdmission`), ported from
`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook`:

- which webhook is called (`generic/webhook.go` `ShouldCallHook`): the configurations in
  name order, each one's webhooks in order; `namespaceSelector` against the namespace's labels
  (a Namespace's own on its create and update; a cluster-scoped object always matches; a
  missing namespace is 404), `objectSelector` against the new or the old object's labels,
  `rules` (`predicates/rules`: operations, groups, versions, `resource/subresource` with
  `*`, scope), then under `matchPolicy: Equivalent` the same resource in another served
  version (and core and `events.k8s.io` Events, one storage), the object sent converted;
  configurations themselves are exempt;
- the request (`request/admissionreview.go`): an `admission.k8s.io` AdmissionReview of the
  first of `v1` and `v1beta1` the webhook lists, with a new uid, kind and resource, the request's
  own, subresource, name, namespace, operation, the requester's userInfo, object, oldObject,
  dryRun and the operation's options, POSTed with `?timeout=<n>s` over HTTPS, the server
  certificate checked against `caBundle` (the system's roots without one) for the URL's host,
  or `<service>.<namespace>.svc` for a Service, within `timeoutSeconds`;
- the answer (`mutating/dispatcher.go`, `validating/dispatcher.go`, `errors/statuserror.go`):
  a denial is the webhook's status with `admission webhook "NAME" denied the request: ...`
  (its code, at least 400); a JSONPatch is applied and the result decoded as the server's
  struct decodes it (unknown fields dropped, a wrong type 500) and defaulted again;
  `warnings` become `Warning` headers; an answer whose uid is not the request's, or any
  failure to call, follows `failurePolicy` (`Ignore`: logged, the request goes on; `Fail`:
  500 `Internal error occurred: failed calling webhook "NAME": ...`); under `dryRun` a webhook
  whose `sideEffects` is neither `None` nor `NoneOnDryRun` fails the request (400);
- `reinvocationPolicy: IfNeeded` (`mutating/reinvocationcontext.go`): when a later webhook
  changed the object, the built-in admission runs again and so does each such webhook called
  before that change, once;
- validating webhooks are called together, after the sim's validation, before storage; the
  first refusal in configuration order answers.

A Service reference has no service network to reach here: the Service must exist with that
port (as kube-apiserver's ClusterIP resolver requires, else the call fails), and
`SimCluster(webhook_endpoints={(namespace, service): "127.0.0.1:8443"})` (or
`sim.webhook_endpoints[...] = ...` later) says where its backend listens; without an entry the
call is refused as a ClusterIP without endpoints refuses it.

Not ported: `matchConditions` are CEL, which the sim cannot evaluate: a configuration with
them is refused (400) rather than called where a real server might skip it. Go's error texts for a
failed call (`dial tcp ...`, `x509: ...`) are the usual ones, not byte for byte those of every
failure.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
import re
import ssl
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import jsonpatch

from nodeward.logs import get_logger
from sim.cluster import convert, resources
from sim.cluster.errors import ApiError, bad_request, not_found
from sim.cluster.resources import ResourceType
from sim.cluster.selectors import match_label_selector_object

if TYPE_CHECKING:
    from sim.cluster.decoding import Fields
    from sim.cluster.versions import Apis

Obj = dict[str, Any]
Cause = tuple[str, str, str]

GROUP = "admissionregistration.k8s.io"
MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
_EXEMPT = frozenset(
    {
        MUTATING,
        VALIDATING,
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    }
)
_REVIEW_VERSIONS = ("v1", "v1beta1")
_SIDE_EFFECTS = ("None", "NoneOnDryRun")
_OPERATIONS = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")
_SCOPES = ("*", "Cluster", "Namespaced")
# OpenSSL's verify codes Go reports as an unknown authority (a CA of the same name that did
# not sign it: 7, signature failure; none found: 19, 20, 21), and as a name mismatch (62)
_UNKNOWN_AUTHORITY = frozenset({7, 19, 20, 21})
_HOSTNAME_MISMATCH = 62
_DNS_LABEL_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# --- the configurations: defaults and validation -------------------------------------------


def default_configuration(obj: Obj) -> None:
    """`SetDefaults_MutatingWebhook`, `SetDefaults_ValidatingWebhook`, `SetDefaults_Rule`,
    `SetDefaults_ServiceReference`, in place."""
    mutating = obj.get("kind") == MUTATING
    for hook in obj.get("webhooks") or []:
        if not isinstance(hook, dict):
            continue
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        if hook.get("namespaceSelector") is None:
            hook["namespaceSelector"] = {}
        if hook.get("objectSelector") is None:
            hook["objectSelector"] = {}
        hook.setdefault("timeoutSeconds", 10)
        if mutating:
            hook.setdefault("reinvocationPolicy", "Never")
        for rule in hook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        service = (hook.get("clientConfig") or {}).get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _go(value: Any) -> str:
    """A value as `field.Invalid` prints it."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[]string{" + ", ".join(json.dumps(v) for v in value) + "}"
    return json.dumps(value)


def _rule_causes(rule: Obj, at: str) -> list[Cause]:
    """`validateRuleWithOperations`."""
    out: list[Cause] = []
    ops = rule.get("operations") or []
    if not ops:
        out.append((f"{at}.operations", "FieldValueRequired", "Required value"))
    if len(ops) > 1 and "*" in ops:
        out.append(
            (
                f"{at}.operations",
                "FieldValueInvalid",
                f"Invalid value: {_go(ops)}: if '*' is present, must not specify other operations",
            )
        )
    for i, op in enumerate(ops):
        if op not in _OPERATIONS:
            out.append(
                (
                    f"{at}.operations[{i}]",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{op}": supported values: {_quoted(_OPERATIONS)}',
                )
            )
    for key, what in (("apiGroups", "API groups"), ("apiVersions", "API versions")):
        items = rule.get(key) or []
        if not items:
            out.append((f"{at}.{key}", "FieldValueRequired", "Required value"))
        if len(items) > 1 and "*" in items:
            out.append(
                (
                    f"{at}.{key}",
                    "FieldValueInvalid",
                    f"Invalid value: {_go(items)}: if '*' is present, must not specify other {what}",
                )
            )
    for i, v in enumerate(rule.get("apiVersions") or []):
        if v == "":
            out.append((f"{at}.apiVersions[{i}]", "FieldValueRequired", "Required value"))
    res = rule.get("resources") or []
    if not res:
        out.append((f"{at}.resources", "FieldValueRequired", "Required value"))
    for i, r in enumerate(res):
        if r == "":
            out.append((f"{at}.resources[{i}]", "FieldValueRequired", "Required value"))
    if len(res) > 1 and "*/*" in res:
        out.append(
            (
                f"{at}.resources",
                "FieldValueInvalid",
                f"Invalid value: {_go(res)}: if '*/*' is present, must not specify other resources",
            )
        )
    if "*" in res and any(r and "/" not in r and r != "*" for r in res):
        out.append(
            (
                f"{at}.resources",
                "FieldValueInvalid",
                f"Invalid value: {_go(res)}: if '*' is present, must not specify other resources "
                "without subresources",
            )
        )
    scope = rule.get("scope")
    if scope is not None and scope not in _SCOPES:
        out.append(
            (
                f"{at}.scope",
                "FieldValueNotSupported",
                f'Unsupported value: "{scope}": supported values: {_quoted(_SCOPES)}',
            )
        )
    return out


def _fully_qualified(name: str, at: str) -> list[Cause]:
    """`utilvalidation.IsFullyQualifiedName`."""
    if not name:
        return [(at, "FieldValueRequired", "Required value")]
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return [
            (
                at,
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower '
                "case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        ]
    if len(name.split(".")) < 3:
        return [
            (
                at,
                "FieldValueInvalid",
                f'Invalid value: "{name}": should be a domain with at least three segments '
                "separated by dots",
            )
        ]
    return []


def _client_config_causes(cc: Obj, at: str) -> list[Cause]:
    """The clientConfig's part of `validateMutatingWebhook` (`ValidateWebhookURL`,
    `ValidateWebhookService`)."""
    url, service = cc.get("url"), cc.get("service")
    if (url is None) == (service is None):
        return [
            (at, "FieldValueRequired", "Required value: exactly one of url or service is required")
        ]
    out: list[Cause] = []
    form = "; desired format: https://host[/path]"
    if url is not None:
        parts = urlsplit(str(url))
        if parts.scheme != "https":
            out.append(
                (
                    f"{at}.url",
                    "FieldValueInvalid",
                    f"Invalid value: \"{parts.scheme}\": 'https' is the only allowed URL scheme{form}",
                )
            )
        if not parts.netloc:
            out.append(
                (
                    f"{at}.url",
                    "FieldValueInvalid",
                    f'Invalid value: "": host must be provided{form}',
                )
            )
        if parts.username is not None:
            out.append(
                (
                    f"{at}.url",
                    "FieldValueInvalid",
                    f'Invalid value: "{parts.username}": user information is not permitted in the URL',
                )
            )
        if parts.fragment:
            out.append(
                (
                    f"{at}.url",
                    "FieldValueInvalid",
                    f'Invalid value: "{parts.fragment}": fragments are not permitted in the URL',
                )
            )
        if parts.query:
            out.append(
                (
                    f"{at}.url",
                    "FieldValueInvalid",
                    f'Invalid value: "{parts.query}": query parameters are not permitted in the URL',
                )
            )
        return out
    svc = service if isinstance(service, dict) else {}
    if not svc.get("name"):
        out.append(
            (f"{at}.service.name", "FieldValueRequired", "Required value: service name is required")
        )
    if not svc.get("namespace"):
        out.append(
            (
                f"{at}.service.namespace",
                "FieldValueRequired",
                "Required value: service namespace is required",
            )
        )
    port = svc.get("port", 443)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        out.append(
            (
                f"{at}.service.port",
                "FieldValueInvalid",
                f"Invalid value: {port}: port is not valid: must be between 1 and 65535, inclusive",
            )
        )
    path = svc.get("path")
    if path not in (None, "", "/"):
        path = str(path)
        if path == "//":
            out.append(
                (
                    f"{at}.service.path",
                    "FieldValueInvalid",
                    f'Invalid value: "{path}": segment[0] may not be empty',
                )
            )
        else:
            if not path.startswith("/"):
                out.append(
                    (
                        f"{at}.service.path",
                        "FieldValueInvalid",
                        f"Invalid value: \"{path}\": must start with a '/'",
                    )
                )
            for i, step in enumerate(path[1:].removesuffix("/").split("/")):
                if not step:
                    why = f"segment[{i}] may not be empty"
                elif not _DNS_SUBDOMAIN.match(step):
                    why = (
                        f"segment[{i}]: a lowercase RFC 1123 subdomain must consist of lower case "
                        "alphanumeric characters, '-' or '.', and must start and end with an "
                        "alphanumeric character (e.g. 'example.com', regex used for validation is "
                        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                    )
                else:
                    continue
                out.append(
                    (f"{at}.service.path", "FieldValueInvalid", f'Invalid value: "{path}": {why}')
                )
    return out


def validate_configuration(kind: str, obj: Obj) -> list[Cause]:
    """`ValidateMutatingWebhookConfiguration` / `ValidateValidatingWebhookConfiguration`'s
    causes (the metadata's are the caller's). A webhook with `matchConditions` is refused
    (400): the sim has no CEL to evaluate them."""
    out: list[Cause] = []
    names: set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        at = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            continue
        if hook.get("matchConditions"):
            raise bad_request(
                f"the sim cluster cannot evaluate {at}.matchConditions (CEL): a "
                f"{kind} with matchConditions is refused here, where a real API server would "
                "store it and evaluate them"
            )
        name = str(hook.get("name") or "")
        out += _fully_qualified(name, f"{at}.name")
        for j, rule in enumerate(hook.get("rules") or []):
            out += _rule_causes(rule if isinstance(rule, dict) else {}, f"{at}.rules[{j}]")
        for key, supported in (
            ("failurePolicy", ("Fail", "Ignore")),
            ("matchPolicy", ("Equivalent", "Exact")),
            *((("reinvocationPolicy", ("IfNeeded", "Never")),) if kind == MUTATING else ()),
        ):
            value = hook.get(key)
            if value is not None and value not in supported:
                out.append(
                    (
                        f"{at}.{key}",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{value}": supported values: {_quoted(supported)}',
                    )
                )
        side = hook.get("sideEffects")
        if side is None:
            out.append(
                (
                    f"{at}.sideEffects",
                    "FieldValueRequired",
                    f"Required value: must specify one of {', '.join(_SIDE_EFFECTS)}",
                )
            )
        elif side not in _SIDE_EFFECTS:
            out.append(
                (
                    f"{at}.sideEffects",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{side}": supported values: {_quoted(_SIDE_EFFECTS)}',
                )
            )
        timeout = hook.get("timeoutSeconds")
        if isinstance(timeout, int) and not 1 <= timeout <= 30:
            out.append(
                (
                    f"{at}.timeoutSeconds",
                    "FieldValueInvalid",
                    f"Invalid value: {timeout}: the timeout value must be between 1 and 30 seconds",
                )
            )
        out += _client_config_causes(hook.get("clientConfig") or {}, f"{at}.clientConfig")
        versions = hook.get("admissionReviewVersions") or []
        vat = f"{at}.admissionReviewVersions"
        if not versions:
            out.append(
                (vat, "FieldValueRequired", "Required value: must specify one of v1, v1beta1")
            )
        else:
            seen: set[str] = set()
            for k, v in enumerate(versions):
                if v in seen:
                    out.append(
                        (
                            f"{vat}[{k}]",
                            "FieldValueInvalid",
                            f'Invalid value: "{v}": duplicate version',
                        )
                    )
                    continue
                seen.add(v)
                if not _DNS_LABEL_1035.match(str(v)):
                    out.append(
                        (
                            f"{vat}[{k}]",
                            "FieldValueInvalid",
                            f'Invalid value: "{v}": a DNS-1035 label must consist of lower case '
                            "alphanumeric characters or '-', start with an alphabetic character, "
                            "and end with an alphanumeric character (e.g. 'my-name',  or "
                            "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
                        )
                    )
            if not any(v in _REVIEW_VERSIONS for v in versions):
                out.append(
                    (
                        vat,
                        "FieldValueInvalid",
                        f"Invalid value: {_go(versions)}: must include at least one of v1, v1beta1",
                    )
                )
        if name:
            if name in names:
                out.append((f"{at}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
            names.add(name)
    return out


# --- calling them ----------------------------------------------------------------------------


class Store(Protocol):
    """What the dispatcher reads of the sim's store (`sim.cluster.store.Store`, which
    imports this module): configurations, namespaces, Services."""

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]: ...

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None: ...


@dataclass
class Attributes:
    """One request's admission attributes (`admission.Attributes`), in the requested
    version's shape: `obj` and `old` as that group-version shows them."""

    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    rt: ResourceType
    version: str
    subresource: str
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    dry_run: bool
    options: Obj | None
    user: Obj
    kind: Obj | None = None
    """The request's kind when it is not the resource's (`pods/eviction`: policy/v1
    Eviction), as {group, version, kind}."""


@dataclass(frozen=True)
class _Hook:
    """One webhook of one configuration: `uid` as `GetUID` makes it (`config/name/index`)."""

    config: str
    index: int
    spec: Obj

    @property
    def name(self) -> str:
        return str(self.spec.get("name") or "")

    @property
    def uid(self) -> str:
        return f"{self.config}/{self.name}/{self.index}"


@dataclass(frozen=True)
class _Invocation:
    """What a webhook is called with: the matched resource in its version, and its kind."""

    rt: ResourceType
    version: str


class _CallFailed(Exception):
    """`webhookutil.ErrCallingWebhook`: the reason a call failed; `failurePolicy` decides."""


class _Status(ApiError):
    """A Status as a webhook wrote it: an empty reason, like any empty field, left out."""

    def status(self) -> dict[str, Any]:
        body = super().status()
        if not body.get("reason"):
            body.pop("reason", None)
        return body


def internal_error(message: str) -> ApiError:
    """`apierrors.NewInternalError`."""
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        details={"causes": [{"message": message}]},
    )


def rejection(webhook: str, result: Obj | None) -> ApiError:
    """`webhookerrors.ToStatusErr`: a webhook's refusal, as the API server answers it."""
    result = dict(result or {})
    given = result.get("code")
    code = max(given if isinstance(given, int) else 0, 400)  # never under 400 for a refusal
    denied = f"admission webhook {json.dumps(webhook)} denied the request"
    message, reason = str(result.get("message") or ""), str(result.get("reason") or "")
    if message:
        text = f"{denied}: {message}"
    elif reason:
        text = f"{denied}: {reason}"
    else:
        text = f"{denied} without explanation"
    details = result.get("details") if isinstance(result.get("details"), dict) else None
    return _Status(code, reason, text, details=details)


class Dispatcher:
    """The mutating and validating webhook admission plugins of one sim cluster."""

    def __init__(
        self,
        store: Store,
        apis: Apis,
        fields: Callable[[], Fields],
        endpoints: dict[tuple[str, str], str],
    ) -> None:
        """`fields`: the decoding schemas (a patched object is decoded as a body is);
        `endpoints`: where a Service's webhook backend listens, by (namespace, name)."""
        self.store = store
        self.apis = apis
        self._fields = fields
        self.endpoints = endpoints
        self.calls: deque[tuple[str, str]] = deque(maxlen=10000)
        """(webhook name, operation) of the latest calls made, in order, for tests."""
        self._log = get_logger(component="sim-cluster-webhooks")

    # --- which ---------------------------------------------------------------------------

    def would_call(self, attrs: Attributes) -> bool:
        """Whether any mutating or validating webhook is called on `attrs` (a namespace
        that cannot be read counts: the call would say so)."""
        for kind in (MUTATING, VALIDATING):
            for hook in self._hooks(kind):
                try:
                    if self._invocation(hook, attrs) is not None:
                        return True
                except ApiError:
                    return True
        return False

    def _hooks(self, kind: str) -> list[_Hook]:
        rt = resources.require(
            GROUP,
            "v1",
            "mutatingwebhookconfigurations"
            if kind == MUTATING
            else "validatingwebhookconfigurations",
        )
        out: list[_Hook] = []
        for config in sorted(self.store.list(rt), key=lambda c: c["metadata"]["name"]):
            for i, spec in enumerate(config.get("webhooks") or []):
                out.append(_Hook(config["metadata"]["name"], i, spec))
        return out

    def _namespace_labels(self, attrs: Attributes) -> dict[str, str]:
        """`GetNamespaceLabels`; 404 for a missing namespace."""
        if (
            attrs.rt.group == ""
            and attrs.rt.resource == "namespaces"
            and not attrs.subresource
            and attrs.operation in ("CREATE", "UPDATE")
        ):
            return dict(((attrs.obj or {}).get("metadata") or {}).get("labels") or {})
        name = attrs.namespace
        found = self.store.find(resources.require("", "v1", "namespaces"), "", name)
        if found is None:
            raise not_found("namespaces", name)
        return dict(found["metadata"].get("labels") or {})

    def _namespace_matches(self, hook: _Hook, attrs: Attributes) -> bool:
        """`MatchNamespaceSelector`; may raise (the error counts only if the rules match)."""
        is_namespace = attrs.rt.group == "" and attrs.rt.resource == "namespaces"
        if not attrs.namespace and not is_namespace:
            return True
        selector = hook.spec.get("namespaceSelector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            return True
        return match_label_selector_object(selector, self._namespace_labels(attrs))

    @staticmethod
    def _object_matches(hook: _Hook, attrs: Attributes) -> bool:
        """`MatchObjectSelector`: the new or the old object's labels."""
        selector = hook.spec.get("objectSelector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            return True
        return any(
            o is not None
            and match_label_selector_object(selector, (o.get("metadata") or {}).get("labels"))
            for o in (attrs.obj, attrs.old)
        )

    @staticmethod
    def _rule_matches(rule: Obj, attrs: Attributes, rt: ResourceType, version: str) -> bool:
        """`rules.Matcher.Matches`, for the resource `rt` at `version`."""
        is_namespace = rt.group == "" and rt.resource == "namespaces" and version == "v1"
        scope = rule.get("scope") or "*"
        if scope == "Namespaced" and (is_namespace or not attrs.namespace):
            return False
        if scope == "Cluster" and not (is_namespace or not attrs.namespace):
            return False
        if scope not in ("*", "Namespaced", "Cluster"):
            return False
        ops = rule.get("operations") or []
        if "*" not in ops and attrs.operation not in ops:
            return False
        groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
        if "*" not in groups and rt.group not in groups:
            return False
        if "*" not in versions and version not in versions:
            return False
        for item in rule.get("resources") or []:
            res, _, sub = str(item).partition("/")
            if res in ("*", rt.resource) and sub in ("*", attrs.subresource):
                return True
        return False

    def _equivalents(self, attrs: Attributes) -> list[tuple[ResourceType, str]]:
        """The served resources sharing the request's storage (`EquivalentResourcesFor`)."""
        return [
            (rt, v)
            for rt, v in self.apis.served
            if rt.key == attrs.rt.key
            and (not attrs.subresource or attrs.subresource in rt.subresources)
            and (rt, v) != (attrs.rt, attrs.version)
        ]

    def _invocation(self, hook: _Hook, attrs: Attributes) -> _Invocation | None:
        """`ShouldCallHook`."""
        ns_error: ApiError | None = None
        try:
            if not self._namespace_matches(hook, attrs):
                return None
        except ApiError as exc:
            ns_error = exc
        if not self._object_matches(hook, attrs):
            return None
        rules = [r for r in hook.spec.get("rules") or [] if isinstance(r, dict)]
        found: _Invocation | None = None
        if any(self._rule_matches(r, attrs, attrs.rt, attrs.version) for r in rules):
            found = _Invocation(attrs.rt, attrs.version)
        elif hook.spec.get("matchPolicy", "Equivalent") == "Equivalent":
            equivalents = self._equivalents(attrs)
            for rule in rules:
                hit = next((e for e in equivalents if self._rule_matches(rule, attrs, *e)), None)
                if hit is not None:
                    found = _Invocation(*hit)
                    break
        if found is None:
            return None
        if ns_error is not None:
            raise ns_error
        return found

    # --- the request and its answer ----------------------------------------------------

    @staticmethod
    def _convert(
        obj: Obj | None, src: tuple[ResourceType, str], dst: tuple[ResourceType, str]
    ) -> Obj | None:
        """`obj` from one served version of a resource to another (the same shape in the
        sim, but core and `events.k8s.io` Events)."""
        if obj is None or src == dst:
            return copy.deepcopy(obj)
        (srt, _), (drt, dver) = src, dst
        if srt.group == "" and srt.resource == "events" and drt.group != "":
            return convert.from_core_event(obj)
        if drt.group == "" and drt.resource == "events" and srt.group != "":
            return convert.to_core_event(obj)
        out = copy.deepcopy(obj)
        out["apiVersion"] = drt.api_version(dver)
        return out

    @staticmethod
    def _review(
        uid: str,
        version: str,
        attrs: Attributes,
        inv: _Invocation,
        *,
        obj: Obj | None,
        old: Obj | None,
    ) -> Obj:
        """`CreateV1AdmissionReview` (or v1beta1, the same fields)."""

        def gvk(rt: ResourceType, v: str) -> Obj:
            return {"group": rt.group, "version": v, "kind": rt.kind}

        def gvr(rt: ResourceType, v: str) -> Obj:
            return {"group": rt.group, "version": v, "resource": rt.resource}

        def shown(o: Obj | None) -> Obj | None:
            if o is None:
                return None
            o = copy.deepcopy(o)
            o.setdefault("metadata", {}).setdefault("creationTimestamp", None)
            return o

        same = (inv.rt, inv.version) == (attrs.rt, attrs.version)
        request: Obj = {
            "uid": uid,
            "kind": attrs.kind if attrs.kind and same else gvk(inv.rt, inv.version),
            "resource": gvr(inv.rt, inv.version),
        }
        if attrs.subresource:
            request["subResource"] = attrs.subresource
        request["requestKind"] = attrs.kind or gvk(attrs.rt, attrs.version)
        request["requestResource"] = gvr(attrs.rt, attrs.version)
        if attrs.subresource:
            request["requestSubResource"] = attrs.subresource
        if attrs.name:
            request["name"] = attrs.name
        if attrs.namespace:
            request["namespace"] = attrs.namespace
        request["operation"] = attrs.operation
        request["userInfo"] = attrs.user
        request["object"] = shown(obj)
        request["oldObject"] = shown(old)
        request["dryRun"] = attrs.dry_run
        request["options"] = attrs.options
        return {
            "kind": "AdmissionReview",
            "apiVersion": f"admission.k8s.io/{version}",
            "request": request,
        }

    def _target(self, hook: _Hook) -> tuple[str, str, str]:
        """(URL to connect to, TLS server name, URL as the API server names it)."""
        cc = hook.spec.get("clientConfig") or {}
        timeout = int(hook.spec.get("timeoutSeconds") or 10)
        if cc.get("url"):
            url = str(cc["url"])
            parts = urlsplit(url)
            shown = f"{url}{'&' if parts.query else '?'}timeout={timeout}s"
            return shown, parts.hostname or "", shown
        svc = cc.get("service") or {}
        ns, name, port = (
            str(svc.get("namespace")),
            str(svc.get("name")),
            int(svc.get("port") or 443),
        )
        path = str(svc.get("path") or "")
        server = f"{name}.{ns}.svc"
        shown = f"https://{server}:{port}{path}?timeout={timeout}s"
        found = self.store.find(resources.require("", "v1", "services"), ns, name)
        if found is None:
            raise _CallFailed(f'failed to call webhook: Post "{shown}": service "{name}" not found')
        spec = found.get("spec") or {}
        kind = spec.get("type") or "ClusterIP"
        if kind == "ClusterIP" and spec.get("clusterIP") == "None":
            raise _CallFailed(
                f'failed to call webhook: Post "{shown}": cannot route to service with ClusterIP "None"'
            )
        if kind != "ExternalName" and not any(
            p.get("port") == port for p in spec.get("ports") or []
        ):
            raise _CallFailed(
                f'failed to call webhook: Post "{shown}": no service port {port} found for '
                f'service "{name}"'
            )
        backend = self.endpoints.get((ns, name))
        if backend is None:
            ip = spec.get("clusterIP") or spec.get("externalName") or server
            raise _CallFailed(
                f'failed to call webhook: Post "{shown}": dial tcp {ip}:{port}: connect: '
                "connection refused"
            )
        return f"https://{backend}{path}?timeout={timeout}s", server, shown

    @staticmethod
    def _tls(hook: _Hook) -> ssl.SSLContext:
        bundle = (hook.spec.get("clientConfig") or {}).get("caBundle")
        if not bundle:
            return ssl.create_default_context()
        try:
            pem = base64.b64decode(str(bundle), validate=True).decode()
            return ssl.create_default_context(cadata=pem)
        except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
            raise _CallFailed(
                f"could not get REST client: unable to load root certificates: {exc}"
            ) from None

    async def _post(self, hook: _Hook, review: Obj) -> Obj:
        """POST `review` to the webhook; its decoded answer, or `_CallFailed`."""
        url, server_name, shown = self._target(hook)
        context = self._tls(hook)
        timeout = int(hook.spec.get("timeoutSeconds") or 10)
        parts = urlsplit(url)
        host_header = urlsplit(shown).netloc
        body = json.dumps(review, separators=(",", ":")).encode()
        failed = f'failed to call webhook: Post "{shown}"'
        try:
            async with asyncio.timeout(timeout):
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        url,
                        data=body,
                        headers={
                            "Content-Type": "application/json",
                            "Accept": "application/json, */*",
                            "Host": host_header,
                        },
                        ssl=context,
                        server_hostname=server_name,
                    ) as resp,
                ):
                    raw = await resp.read()
                    status, media = resp.status, resp.headers.get("Content-Type", "")
        except TimeoutError:
            raise _CallFailed(f"{failed}: context deadline exceeded") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            why = exc.certificate_error
            code = getattr(why, "verify_code", None)
            if code in _UNKNOWN_AUTHORITY:
                text = "x509: certificate signed by unknown authority"
            elif code == _HOSTNAME_MISMATCH:
                text = f"x509: certificate is not valid for {server_name}"
            else:
                text = f"x509: {getattr(why, 'verify_message', why)}"
            raise _CallFailed(f"{failed}: tls: failed to verify certificate: {text}") from None
        except aiohttp.ClientConnectorError as exc:
            raise _CallFailed(
                f"{failed}: dial tcp {parts.netloc}: connect: connection refused"
                if isinstance(exc.os_error, ConnectionRefusedError)
                else f"{failed}: {exc}"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _CallFailed(f"{failed}: {type(exc).__name__}: {exc}") from None
        if not 200 <= status <= 206:
            text = raw.decode(errors="replace").strip() if media.startswith("text/") else ""
            if status >= 500 or text:
                said = f"an error on the server ({json.dumps(text)}) has prevented the request from succeeding"
            else:
                said = f"the server responded with the status code {status} but did not return more information"
            raise _CallFailed(f"failed to call webhook: {said}")
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise _CallFailed(
                f"failed to call webhook: couldn't get version/kind; json parse error: {exc}"
            ) from None
        if not isinstance(answer, dict):
            raise _CallFailed(
                "failed to call webhook: couldn't get version/kind; json parse error: not an object"
            )
        return answer

    @staticmethod
    def _verify(answer: Obj, uid: str, version: str, mutating: bool) -> Obj:
        """`VerifyAdmissionResponse`: the response, or `_CallFailed`."""
        bad = "received invalid webhook response: "
        response = answer.get("response")
        if not isinstance(response, dict):
            raise _CallFailed(bad + "webhook response was absent")
        if version == "v1":
            if response.get("uid", "") != uid:
                raise _CallFailed(
                    bad + f'expected response.uid="{uid}", got "{response.get("uid", "")}"'
                )
            gv, kind = answer.get("apiVersion", ""), answer.get("kind", "")
            if (gv, kind) != ("admission.k8s.io/v1", "AdmissionReview"):
                raise _CallFailed(
                    bad
                    + f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {gv}, Kind={kind}"
                )
        patch, patch_type = response.get("patch"), response.get("patchType")
        if version == "v1beta1":
            patch_type = "JSONPatch" if patch and mutating else None
        if mutating:
            if patch and patch_type is None:
                raise _CallFailed(
                    bad + "webhook returned response.patch but not response.patchType"
                )
            if not patch and patch_type is not None:
                raise _CallFailed(
                    bad + "webhook returned response.patchType but not response.patch"
                )
            if patch_type == "":
                raise _CallFailed(bad + 'webhook returned invalid response.patchType of ""')
        else:
            if patch:
                raise _CallFailed(bad + "validating webhook may not return response.patch")
            if response.get("patchType") is not None:
                raise _CallFailed(bad + "validating webhook may not return response.patchType")
        return {**response, "patch": patch if mutating else None, "patchType": patch_type}

    def _review_version(self, hook: _Hook) -> str:
        return str(
            next(v for v in hook.spec.get("admissionReviewVersions") or [] if v in _REVIEW_VERSIONS)
        )

    def _dry_run_check(self, hook: _Hook, attrs: Attributes) -> None:
        if attrs.dry_run and hook.spec.get("sideEffects") not in _SIDE_EFFECTS:
            raise bad_request(f"admission webhook {json.dumps(hook.name)} does not support dry run")

    async def _call(
        self,
        hook: _Hook,
        attrs: Attributes,
        inv: _Invocation,
        obj: Obj | None,
        warned: list[str],
        *,
        mutating: bool,
    ) -> Obj:
        """One call: the verified response; `_CallFailed`, or ApiError for a refusal."""
        self._dry_run_check(hook, attrs)
        uid, version = str(uuid.uuid4()), self._review_version(hook)
        src = (attrs.rt, attrs.version)
        dst = (inv.rt, inv.version)
        review = self._review(
            uid,
            version,
            attrs,
            inv,
            obj=self._convert(obj, src, dst),
            old=self._convert(attrs.old, src, dst),
        )
        self.calls.append((hook.name, attrs.operation))
        answer = await self._post(hook, review)
        response = self._verify(answer, uid, version, mutating)
        warned.extend(str(w) for w in response.get("warnings") or [])
        if not response.get("allowed"):
            raise rejection(hook.name, response.get("status"))
        return response

    def _patched(
        self, hook: _Hook, response: Obj, attrs: Attributes, inv: _Invocation, obj: Obj | None
    ) -> Obj | None:
        """The object after the response's patch (decoded and defaulted as the server does),
        or None when it has none."""
        raw = response.get("patch")
        if not raw:
            return None
        try:
            ops = json.loads(base64.b64decode(str(raw), validate=True))
        except (binascii.Error, ValueError) as exc:
            raise _CallFailed(f"received undecodable patch in webhook response: {exc}") from None
        if not isinstance(ops, list):
            raise _CallFailed(
                "received undecodable patch in webhook response: json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        if not ops:
            return None
        if obj is None:
            raise internal_error(
                f"admission webhook {json.dumps(hook.name)} attempted to modify the object, which is "
                "not supported for this operation"
            )
        if response.get("patchType") != "JSONPatch":
            raise _CallFailed(f"unsupported patch type {json.dumps(response.get('patchType'))}")
        src, dst = (attrs.rt, attrs.version), (inv.rt, inv.version)
        shown = self._convert(obj, src, dst)
        try:
            patched = jsonpatch.JsonPatch(ops).apply(shown)
        except (
            jsonpatch.JsonPatchException,
            jsonpatch.JsonPointerException,
            TypeError,
            KeyError,
            IndexError,
        ) as exc:
            raise internal_error(str(exc)) from None
        if not isinstance(patched, dict):
            raise internal_error("json: cannot unmarshal into Go value of type " + inv.rt.kind)
        kind = (inv.rt.group, inv.version, inv.rt.kind)
        if attrs.kind and (inv.rt, inv.version) == src:
            kind = (attrs.kind["group"], attrs.kind["version"], attrs.kind["kind"])
        decoded = self._fields().decode(*kind, patched)
        if decoded.type_error is not None:
            raise internal_error(decoded.type_error)
        back = self._convert(decoded.obj, dst, src)
        assert back is not None
        return back

    # --- the plugins -----------------------------------------------------------------------

    async def mutate(
        self,
        attrs: Attributes,
        defaults: Callable[[Obj], Obj],
        readmit: Callable[[Obj], Obj] | None,
    ) -> tuple[Obj | None, list[str]]:
        """The mutating webhooks on `attrs`: the object they leave and their warnings.
        `defaults`: the scheme's defaults (after each patch); `readmit`: the built-in
        admission, run again before reinvoked webhooks."""
        warned: list[str] = []
        if attrs.rt.group == GROUP and attrs.rt.kind in _EXEMPT:
            return attrs.obj, warned
        hooks = self._hooks(MUTATING)
        if not hooks:
            return attrs.obj, warned
        previously: set[str] = set()
        reinvoke: set[str] = set()
        should_reinvoke = False
        for round_ in (0, 1):
            if round_ == 1:
                if not should_reinvoke or attrs.obj is None:
                    break
                before = copy.deepcopy(attrs.obj)
                if readmit is not None:
                    attrs.obj = readmit(attrs.obj)
                if attrs.obj != before:
                    reinvoke |= previously
                    previously = set()
            for hook in hooks:
                inv = self._invocation(hook, attrs)
                if inv is None or (round_ == 1 and hook.uid not in reinvoke):
                    continue
                changed = False
                try:
                    response = await self._call(hook, attrs, inv, attrs.obj, warned, mutating=True)
                    patched = self._patched(hook, response, attrs, inv, attrs.obj)
                    if patched is not None:
                        patched = defaults(patched)
                        changed = patched != attrs.obj
                        attrs.obj = patched
                except _CallFailed as exc:
                    if hook.spec.get("failurePolicy", "Fail") != "Ignore":
                        raise internal_error(
                            f"failed calling webhook {json.dumps(hook.name)}: {exc}"
                        ) from None
                    self._log.warning(
                        "failed calling webhook, failing open", webhook=hook.name, error=str(exc)
                    )
                if changed:
                    reinvoke |= previously
                    previously = set()
                    should_reinvoke = True
                if hook.spec.get("reinvocationPolicy") == "IfNeeded":
                    previously.add(hook.uid)
        return attrs.obj, warned

    async def validate(self, attrs: Attributes) -> list[str]:
        """The validating webhooks on `attrs`, called together: their warnings, or the first
        refusal (in configuration order) raised."""
        warned: list[str] = []
        if attrs.rt.group == GROUP and attrs.rt.kind in _EXEMPT:
            return warned
        called = [(h, inv) for h in self._hooks(VALIDATING) if (inv := self._invocation(h, attrs))]
        if not called:
            return warned

        async def one(hook: _Hook, inv: _Invocation) -> ApiError | None:
            try:
                await self._call(hook, attrs, inv, attrs.obj, warned, mutating=False)
            except _CallFailed as exc:
                if hook.spec.get("failurePolicy", "Fail") == "Ignore":
                    self._log.warning(
                        "failed calling webhook, failing open", webhook=hook.name, error=str(exc)
                    )
                    return None
                return internal_error(f"failed calling webhook {json.dumps(hook.name)}: {exc}")
            except ApiError as exc:
                return exc
            return None

        errors = await asyncio.gather(*(one(h, inv) for h, inv in called))
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return warned


def options(kind: str, query: Mapping[str, Any], dry_run: bool) -> Obj:
    """The operation's options as the API server decodes them from the query
    (`CreateOptions`, `UpdateOptions`, `DeleteOptions`), with their type."""
    out: Obj = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        out["dryRun"] = ["All"]
    if kind != "DeleteOptions":
        for key in ("fieldManager", "fieldValidation"):
            if query.get(key):
                out[key] = query[key]
    return out


__all__ = [
    "GROUP",
    "MUTATING",
    "VALIDATING",
    "Attributes",
    "Dispatcher",
    "default_configuration",
    "options",
    "rejection",
    "validate_configuration",
]
