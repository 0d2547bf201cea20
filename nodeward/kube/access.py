"""The vocabulary of port operations (what each needs from RBAC) and its enforcement.

Each service and agent declares the operations it uses in its own package (`access.py`,
an `Access`) and passes that declaration when it connects its `Cluster`; the runtime
knows no daemon by name. The RBAC test (`tests/unit/test_rbac_roles.py`) checks the
declarations, collected by the composition root (`launch.access`), against the roles in
`deploy/rbac/`, both ways. At run time a `Cluster` refuses an operation its `Access` does
not declare, so a new call cannot slip past the test.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from nodeward.kube.errors import UndeclaredOperation

SERVICE_NAMESPACE = "nodeward"


@dataclass(frozen=True, order=True)
class Permission:
    """One RBAC grant: `verb` on `resource` (with `/subresource`) in `group`.

    `namespace` is None for a cluster-wide grant (ClusterRole + ClusterRoleBinding), or the
    one namespace it is needed in (Role + RoleBinding).
    """

    group: str
    resource: str
    verb: str
    namespace: str | None = None


def _p(
    resource: str, *verbs: str, group: str = "", namespace: str | None = None
) -> frozenset[Permission]:
    return frozenset(Permission(group, resource, v, namespace) for v in verbs)


OPERATIONS: dict[str, frozenset[Permission]] = {
    "nodes.get": _p("nodes", "get"),
    "nodes.list": _p("nodes", "list"),
    "nodes.watch": _p("nodes", "list", "watch"),
    "nodes.patch": _p("nodes", "get", "patch"),
    "nodes.set_condition": _p("nodes", "get") | _p("nodes/status", "patch"),
    "nodes.checkpoint": _p("nodes/proxy", "create"),
    "namespaces.get": _p("namespaces", "get"),
    "namespaces.list": _p("namespaces", "list"),
    "namespaces.watch": _p("namespaces", "list", "watch"),
    "namespaces.patch": _p("namespaces", "get", "patch"),
    "pods.get": _p("pods", "get"),
    "pods.get_own": _p("pods", "get", namespace=SERVICE_NAMESPACE),
    "pods.list": _p("pods", "list"),
    "pods.watch": _p("pods", "list", "watch"),
    "pods.patch": _p("pods", "get", "patch"),
    "pods.create": _p("pods", "create"),
    "pods.delete": _p("pods", "delete"),
    "pods.evict": _p("pods/eviction", "create"),
    "events.create": _p("events", "create", group="events.k8s.io"),
    "secrets.get": _p("secrets", "get"),
    "secrets.get_own": _p("secrets", "get", namespace=SERVICE_NAMESPACE),
    "secrets.list": _p("secrets", "list"),
    "secrets.watch": _p("secrets", "list", "watch"),
    "secrets.replace": _p("secrets", "get", "update"),
    "secrets.patch": _p("secrets", "get", "patch"),
    "statefulsets.get": _p("statefulsets", "get", group="apps"),
    "statefulsets.create": _p("statefulsets", "create", group="apps"),
    "statefulsets.delete": _p("statefulsets", "get", "delete", group="apps"),
    "notebooks.get": _p("notebooks", "get", group="kubeflow.org"),
    "notebooks.patch": _p("notebooks", "get", "patch", group="kubeflow.org"),
    "networkpolicies.create": _p("networkpolicies", "create", group="networking.k8s.io"),
    "networkpolicies.delete": _p("networkpolicies", "delete", group="networking.k8s.io"),
    "resourceslices.list": _p("resourceslices", "list", group="resource.k8s.io"),
    "resourceslices.watch": _p("resourceslices", "list", "watch", group="resource.k8s.io"),
    "devicetaintrules.create": _p("devicetaintrules", "create", group="resource.k8s.io"),
    "devicetaintrules.get": _p("devicetaintrules", "get", group="resource.k8s.io"),
    "devicetaintrules.delete": _p("devicetaintrules", "delete", group="resource.k8s.io"),
    "tokenreviews.create": _p("tokenreviews", "create", group="authentication.k8s.io"),
    "leases.hold": _p(
        "leases",
        "get",
        "create",
        "update",
        group="coordination.k8s.io",
        namespace=SERVICE_NAMESPACE,
    ),
}


@dataclass(frozen=True)
class Access:
    """What one daemon may do on Kubernetes, declared in its own package (`<pkg>/access.py`).

    `account` names its ServiceAccount (`nodeward-<account>`): a service's own name, or
    `agent` for the node agents, which share one. `operations` are names from `OPERATIONS`.
    """

    account: str
    operations: frozenset[str]

    def __post_init__(self) -> None:
        unknown = sorted(self.operations - OPERATIONS.keys())
        if unknown:
            raise ValueError(f"{self.account}: {', '.join(unknown)} not in OPERATIONS")

    def permissions(self) -> frozenset[Permission]:
        """Every permission the declared operations need."""
        out: frozenset[Permission] = frozenset()
        for op in self.operations:
            out |= OPERATIONS[op]
        return out


def by_account(declared: Iterable[Access]) -> dict[str, Access]:
    """The declarations of daemons sharing a ServiceAccount, merged: what its role must grant."""
    out: dict[str, Access] = {}
    for access in declared:
        prior = out.get(access.account)
        ops = access.operations | (prior.operations if prior else frozenset())
        out[access.account] = Access(access.account, ops)
    return out


def service_account(account: str) -> str:
    """The ServiceAccount a daemon runs as: `nodeward-<account>`."""
    return f"nodeward-{account}"


class Guard:
    """Refuses operations the daemon's `Access` does not declare. `None` (tools, admin) allows all."""

    def __init__(self, access: Access | None) -> None:
        self.access = access

    def check(self, op: str) -> None:
        if op not in OPERATIONS:
            raise UndeclaredOperation(f"{op} is not a port operation")
        if self.access is not None and op not in self.access.operations:
            account = self.access.account
            raise UndeclaredOperation(
                f"{account} does not declare {op}; add it to its access.py (OPERATIONS) "
                f"and widen deploy/rbac/{account}.yaml"
            )


F = TypeVar("F", bound=Callable[..., Any])


def operation(name: str) -> Callable[[F], F]:
    """Mark a method (async, or an async generator) as port operation `name`; the owner's
    guard checks it on each call."""
    if name not in OPERATIONS:
        raise ValueError(f"{name} is not in OPERATIONS")

    def wrap(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                args[0]._guard.check(name)
                async for item in fn(*args, **kwargs):
                    yield item

            wrapped: Any = stream
        else:

            @functools.wraps(fn)
            async def run(*args: Any, **kwargs: Any) -> Any:
                args[0]._guard.check(name)
                return await fn(*args, **kwargs)

            wrapped = run
        wrapped.__nodeward_operation__ = name
        return cast(F, wrapped)

    return wrap
