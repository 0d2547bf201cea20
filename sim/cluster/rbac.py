"""RBAC as the API server evaluates it, from the Roles and bindings in the store.

Identities: each has a bearer token; a service identity authenticates as its ServiceAccount
(`system:serviceaccount:<ns>:<name>`), the admin as a member of `system:masters`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.cluster.errors import invalid

if TYPE_CHECKING:
    from nodeward.kube.access import Access

ADMIN = "admin"
ADMIN_USER = "nodeward-admin"


@dataclass(frozen=True)
class Identity:
    """Who a bearer token authenticates as."""

    name: str  # the context name suffix: admin, cordon, culler, ...
    user: str
    groups: tuple[str, ...]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24), compare=False)
    uid: str = ""  # a ServiceAccount token's: the account's uid
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a ServiceAccount token's `extra`

    @property
    def superuser(self) -> bool:
        return "system:masters" in self.groups


def service_account_identity(namespace: str, name: str, short: str) -> Identity:
    return Identity(
        short,
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def admin_identity() -> Identity:
    return Identity(ADMIN, ADMIN_USER, ("system:masters", "system:authenticated"))


@dataclass(frozen=True)
class Request:
    """The attributes RBAC decides on."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


def _rule_allows(rule: dict[str, Any], req: Request) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and req.verb not in verbs:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and req.group not in groups:
        return False
    resources = rule.get("resources") or []
    wanted = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    if "*" not in resources and wanted not in resources and f"*/{req.subresource}" not in resources:
        return False
    names = rule.get("resourceNames") or []
    return not names or req.name in names


def _rule_allows_path(rule: dict[str, Any], verb: str, path: str) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and verb not in verbs:
        return False
    return any(
        url == path or (url.endswith("*") and path.startswith(url[:-1]))
        for url in rule.get("nonResourceURLs") or []
    )


def _subject_matches(subject: dict[str, Any], ident: Identity) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return (
            ident.user == f"system:serviceaccount:{subject.get('namespace')}:{subject.get('name')}"
        )
    if kind == "User":
        return ident.user == subject.get("name")
    if kind == "Group":
        return subject.get("name") in ident.groups
    return False


def _describe_subject(subject: dict[str, Any], binding_namespace: str) -> str:
    name = subject.get("name", "")
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{name}/{subject.get("namespace") or binding_namespace}"'
    return f'{subject.get("kind")} "{name}"'


@dataclass
class Rules:
    """The rules that apply to one identity in one namespace, each with the binding that grants
    it (as the RBAC authorizer names it in a reason), and the role references that did not
    resolve (a binding to a missing role)."""

    rules: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def rules_for(ident: Identity, namespace: str, objects: dict[str, list[dict[str, Any]]]) -> Rules:
    """Every rule of the roles bound to `ident`: cluster-wide bindings, then the RoleBindings of
    `namespace` (none when it is empty)."""
    cluster_roles = {r["metadata"]["name"]: r for r in objects.get("clusterroles", [])}
    roles = {
        (r["metadata"].get("namespace"), r["metadata"]["name"]): r for r in objects.get("roles", [])
    }
    out = Rules()

    def add(binding: dict[str, Any], ns: str | None) -> None:
        subject = next(
            (s for s in binding.get("subjects") or [] if _subject_matches(s, ident)), None
        )
        if subject is None:
            return
        ref = binding.get("roleRef") or {}
        name = ref.get("name", "")
        if ref.get("kind") == "ClusterRole":
            role = cluster_roles.get(name)
            missing = f'clusterrole.rbac.authorization.k8s.io "{name}" not found'
        else:
            role = roles.get((ns, name))
            missing = f'role.rbac.authorization.k8s.io "{name}" not found'
        if role is None:
            out.errors.append(missing)
            return
        bname = binding["metadata"]["name"]
        source = (
            f'RoleBinding "{bname}/{ns}"' if ns is not None else f'ClusterRoleBinding "{bname}"'
        )
        source += f' of {ref.get("kind")} "{name}" to {_describe_subject(subject, ns or "")}'
        out.rules.extend((rule, source) for rule in role.get("rules") or [])

    for binding in objects.get("clusterrolebindings", []):
        add(binding, None)
    if namespace:
        for binding in objects.get("rolebindings", []):
            if binding["metadata"].get("namespace") == namespace:
                add(binding, namespace)
    return out


def authorize(ident: Identity, req: Request, objects: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether `ident` may do `req`, given ClusterRoles, Roles and their bindings."""
    return _decide(ident, req, objects)[0]


def authorize_path(
    ident: Identity, verb: str, path: str, objects: dict[str, list[dict[str, Any]]]
) -> bool:
    """Whether `ident` may `verb` (get, post, ...) the non-resource URL `path` (/api, /openapi/v2)."""
    return _decide_path(ident, verb, path, objects)[0]


def _decide(
    ident: Identity, req: Request, objects: dict[str, list[dict[str, Any]]]
) -> tuple[bool, str]:
    if ident.superuser:  # the API server allows system:masters before RBAC is asked
        return True, ""
    for rule, source in rules_for(ident, req.namespace, objects).rules:
        if _rule_allows(rule, req):
            return True, f"RBAC: allowed by {source}"
    return False, ""


def _decide_path(
    ident: Identity, verb: str, path: str, objects: dict[str, list[dict[str, Any]]]
) -> tuple[bool, str]:
    if ident.superuser:
        return True, ""
    for rule, source in rules_for(ident, "", objects).rules:
        if _rule_allows_path(rule, verb, path):
            return True, f"RBAC: allowed by {source}"
    return False, ""


def access_review_status(
    ident: Identity, spec: dict[str, Any], objects: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The `status` of a SelfSubjectAccessReview (`kubectl auth can-i`): the decision RBAC
    makes for the caller on the resource or the non-resource URL in `spec`."""
    attrs, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if attrs and non:
        raise invalid(
            "SelfSubjectAccessReview",
            "",
            "authorization.k8s.io",
            [
                (
                    "spec.nonResourceAttributes",
                    "FieldValueInvalid",
                    "cannot be specified in combination with resourceAttributes",
                )
            ],
        )
    if isinstance(attrs, dict) and attrs:
        allowed, reason = _decide(
            ident,
            Request(
                str(attrs.get("verb") or ""),
                str(attrs.get("group") or ""),
                str(attrs.get("resource") or ""),
                str(attrs.get("subresource") or ""),
                str(attrs.get("namespace") or ""),
                str(attrs.get("name") or ""),
            ),
            objects,
        )
    elif isinstance(non, dict) and non:
        allowed, reason = _decide_path(
            ident, str(non.get("verb") or ""), str(non.get("path") or ""), objects
        )
    else:
        raise invalid(
            "SelfSubjectAccessReview",
            "",
            "authorization.k8s.io",
            [
                (
                    "spec.resourceAttributes",
                    "FieldValueInvalid",
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )
            ],
        )
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return status


def review_status(
    ident: Identity, namespace: str, objects: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The `status` of a SelfSubjectRulesReview: the caller's resource and non-resource rules in
    `namespace`, as the RBAC authorizer lists them (`kubectl auth can-i --list`)."""
    found = rules_for(ident, namespace, objects)
    resource_rules: list[dict[str, Any]] = []
    non_resource_rules: list[dict[str, Any]] = []
    for rule, _ in found.rules:
        if rule.get("nonResourceURLs"):
            non_resource_rules.append(
                {"verbs": list(rule.get("verbs") or []), "nonResourceURLs": rule["nonResourceURLs"]}
            )
            continue
        entry: dict[str, Any] = {
            "verbs": list(rule.get("verbs") or []),
            "apiGroups": list(rule.get("apiGroups") or []),
            "resources": list(rule.get("resources") or []),
        }
        if rule.get("resourceNames"):
            entry["resourceNames"] = list(rule["resourceNames"])
        resource_rules.append(entry)
    status: dict[str, Any] = {
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": bool(found.errors),
    }
    if found.errors:
        status["evaluationError"] = "[" + ", ".join(found.errors) + "]"
    return status


def forbidden_message(ident: Identity, req: Request) -> str:
    """The message a real API server gives with a 403."""
    resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    qualified = f"{req.resource}.{req.group}" if req.group else req.resource
    subject = f'{qualified} "{req.name}"' if req.name else qualified
    where = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
    return (
        f'{subject} is forbidden: User "{ident.user}" cannot {req.verb} resource "{resource}" '
        f'in API group "{req.group}" {where}'
    )


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every document in the YAML files (or directories of them) given."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        files = (
            sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
        )
        for f in files:
            docs.extend(d for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict))
    return docs


def manifests_from_access(declared: Iterable[Access]) -> list[dict[str, Any]]:
    """ServiceAccounts, roles and bindings built from the daemons' declared access (which
    the composition root collects: `launch.access.DECLARED`), for when the `deploy/rbac`
    files are not at hand (an installed wheel). The RBAC test keeps the two equal."""
    from nodeward.kube.access import SERVICE_NAMESPACE, by_account, service_account

    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVICE_NAMESPACE}}
    ]
    for name, access in by_account(declared).items():
        account = service_account(name)
        permissions = access.permissions()
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": SERVICE_NAMESPACE},
            }
        )
        subjects = [{"kind": "ServiceAccount", "name": account, "namespace": SERVICE_NAMESPACE}]
        for namespace in sorted({p.namespace or "" for p in permissions}):
            rules = [
                {"apiGroups": [p.group], "resources": [p.resource], "verbs": [p.verb]}
                for p in sorted(permissions)
                if (p.namespace or "") == namespace
            ]
            meta: dict[str, Any] = {"name": account}
            kind = "ClusterRole"
            if namespace:
                meta["namespace"], kind = namespace, "Role"
            docs.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": kind,
                    "metadata": meta,
                    "rules": rules,
                }
            )
            docs.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": f"{kind}Binding",
                    "metadata": meta,
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": kind,
                        "name": account,
                    },
                    "subjects": subjects,
                }
            )
    return docs


def bootstrap_manifests() -> list[dict[str, Any]]:
    """The default roles every API server creates at start (the `rbac-defaults` of a 1.30
    server) that the sim's identities rely on: `cluster-admin` for `system:masters`, and for every
    authenticated user `system:basic-user` (the self reviews: `kubectl auth can-i`, `auth
    whoami`), `system:discovery` and `system:public-info-viewer` (discovery, OpenAPI, health);
    and `system:auth-delegator` (TokenReviews and SubjectAccessReviews), bound to no one, for
    a delegating authenticator's own binding."""
    health = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
    roles: dict[str, list[dict[str, Any]]] = {
        "cluster-admin": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
        "system:basic-user": [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            },
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["selfsubjectreviews"],
                "verbs": ["create"],
            },
        ],
        "system:discovery": [
            {
                "nonResourceURLs": sorted(
                    ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *health]
                ),
                "verbs": ["get"],
            }
        ],
        "system:public-info-viewer": [{"nonResourceURLs": health, "verbs": ["get"]}],
        "system:auth-delegator": [
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["tokenreviews"],
                "verbs": ["create"],
            },
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["subjectaccessreviews"],
                "verbs": ["create"],
            },
        ],
    }
    bound = {
        "cluster-admin": ["system:masters"],
        "system:basic-user": ["system:authenticated"],
        "system:discovery": ["system:authenticated"],
        "system:public-info-viewer": ["system:authenticated", "system:unauthenticated"],
    }
    docs: list[dict[str, Any]] = []

    def meta(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        }

    for name, rules in roles.items():
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": meta(name),
                "rules": rules,
            }
        )
        if name not in bound:
            continue
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": meta(name),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                    for group in bound[name]
                ],
            }
        )
    return docs


def default_rbac_dir() -> Path | None:
    """`deploy/rbac` of the source tree this package runs from, if there is one."""
    candidate = Path(__file__).resolve().parents[2] / "deploy" / "rbac"
    return candidate if candidate.is_dir() else None
