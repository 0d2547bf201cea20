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


def authorize(ident: Identity, req: Request, objects: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether `ident` may do `req`, given ClusterRoles, Roles and their bindings."""
    if ident.superuser:
        return True
    cluster_roles = {r["metadata"]["name"]: r for r in objects.get("clusterroles", [])}
    roles = {
        (r["metadata"].get("namespace"), r["metadata"]["name"]): r for r in objects.get("roles", [])
    }

    def rules_of(ref: dict[str, Any], namespace: str | None) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            return (cluster_roles.get(ref.get("name", "")) or {}).get("rules") or []
        return (roles.get((namespace, ref.get("name", ""))) or {}).get("rules") or []

    for binding in objects.get("clusterrolebindings", []):
        if any(_subject_matches(s, ident) for s in binding.get("subjects") or []) and any(
            _rule_allows(rule, req) for rule in rules_of(binding.get("roleRef") or {}, None)
        ):
            return True
    if not req.namespace:
        return False
    for binding in objects.get("rolebindings", []):
        ns = binding["metadata"].get("namespace")
        if ns != req.namespace:
            continue
        if any(_subject_matches(s, ident) for s in binding.get("subjects") or []) and any(
            _rule_allows(rule, req) for rule in rules_of(binding.get("roleRef") or {}, ns)
        ):
            return True
    return False


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


def default_rbac_dir() -> Path | None:
    """`deploy/rbac` of the source tree this package runs from, if there is one."""
    candidate = Path(__file__).resolve().parents[2] / "deploy" / "rbac"
    return candidate if candidate.is_dir() else None
