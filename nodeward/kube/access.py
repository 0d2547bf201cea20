"""What each port operation needs from RBAC, and which operations each service uses.

The RBAC test (`tests/unit/test_rbac_roles.py`) checks `SERVICES` against the roles in
`deploy/rbac/`, both ways: every permission a service's operations need is granted, and
every rule granted is needed. At run time a `Cluster` made for a service refuses an
operation the service does not declare here, so a new call cannot slip past the test.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
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
    "pods.get": _p("pods", "get"),
    "pods.list": _p("pods", "list"),
    "pods.watch": _p("pods", "list", "watch"),
    "pods.patch": _p("pods", "get", "patch"),
    "pods.delete": _p("pods", "delete"),
    "pods.evict": _p("pods/eviction", "create"),
    "events.create": _p("events", "create", group="events.k8s.io"),
    "secrets.get": _p("secrets", "get"),
    "secrets.list": _p("secrets", "list"),
    "secrets.replace": _p("secrets", "get", "update"),
    "secrets.patch": _p("secrets", "get", "patch"),
    "notebooks.get": _p("notebooks", "get", group="kubeflow.org"),
    "notebooks.patch": _p("notebooks", "get", "patch", group="kubeflow.org"),
    "networkpolicies.create": _p("networkpolicies", "create", group="networking.k8s.io"),
    "networkpolicies.delete": _p("networkpolicies", "delete", group="networking.k8s.io"),
    "leases.hold": _p(
        "leases",
        "get",
        "create",
        "update",
        group="coordination.k8s.io",
        namespace=SERVICE_NAMESPACE,
    ),
}

# The port operations each service (and the node agent) calls.
SERVICES: dict[str, frozenset[str]] = {
    "cordon": frozenset(
        {
            "nodes.get",
            "nodes.list",
            "nodes.watch",
            "nodes.patch",
            "nodes.set_condition",
            "namespaces.get",
            "pods.list",
            "pods.get",
            "pods.evict",
            "events.create",
        }
    ),
    "culler": frozenset(
        {
            "namespaces.get",
            "pods.get",
            "pods.delete",
            "notebooks.get",
            "notebooks.patch",
        }
    ),
    "credentials": frozenset(
        {
            "secrets.get",
            "secrets.list",
            "secrets.replace",
            "secrets.patch",
            "events.create",
            "leases.hold",
        }
    ),
    "falco": frozenset(
        {
            "pods.get",
            "pods.patch",
            "pods.delete",
            "namespaces.get",
            "nodes.get",
            "nodes.list",  # the circuit breaker's population (the cordon action)
            "nodes.patch",
            "nodes.checkpoint",
            "networkpolicies.create",
            "events.create",
        }
    ),
    "checkpoint": frozenset(
        {
            "nodes.get",
            "nodes.list",
            "nodes.patch",
            "nodes.checkpoint",
            "namespaces.get",
            "pods.get",
            "pods.list",
            "pods.patch",
            "pods.evict",
            "events.create",
            "leases.hold",
        }
    ),
    "notifier": frozenset({"namespaces.get", "pods.get"}),
    "agent": frozenset({"nodes.get", "pods.list"}),
}


def service_account(service: str) -> str:
    """The ServiceAccount a service runs as: `nodeward-<service>`."""
    return f"nodeward-{service}"


def permissions(service: str) -> frozenset[Permission]:
    """Every permission `service`'s declared operations need."""
    out: frozenset[Permission] = frozenset()
    for op in SERVICES[service]:
        out |= OPERATIONS[op]
    return out


class Guard:
    """Refuses operations a service does not declare. `service=None` (tools, admin) allows all."""

    def __init__(self, service: str | None) -> None:
        if service is not None and service not in SERVICES:
            raise ValueError(
                f"unknown service {service!r}; declare it in nodeward.kube.access.SERVICES"
            )
        self.service = service

    def check(self, op: str) -> None:
        if op not in OPERATIONS:
            raise UndeclaredOperation(f"{op} is not a port operation")
        if self.service is not None and op not in SERVICES[self.service]:
            raise UndeclaredOperation(
                f"service {self.service} does not declare {op}; add it to nodeward.kube.access.SERVICES "
                f"and widen deploy/rbac/{self.service}.yaml"
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
