"""Typed errors of the cluster port. No client-library exception reaches a service."""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """A request the API server refused or could not answer. `str()` is one line."""

    status: int = 0

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.reason = reason
        self.details = details or {}


class BadRequest(KubeError):
    status = 400


class Unauthorized(KubeError):
    status = 401


class Forbidden(KubeError):
    """RBAC denied the request (403): the service's role does not hold the verb."""

    status = 403


class NotFound(KubeError):
    status = 404


class Conflict(KubeError):
    """409: a stale resourceVersion, or (AlreadyExists) a name already taken."""

    status = 409


class AlreadyExists(Conflict):
    pass


class Gone(KubeError):
    """410: the resourceVersion is older than the server keeps; relist."""

    status = 410


class UnsupportedMediaType(KubeError):
    status = 415


class Invalid(KubeError):
    """422: the object does not validate; `causes` lists the fields."""

    status = 422

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list(self.details.get("causes") or [])


class TooManyRequests(KubeError):
    """429: throttled, or an eviction a PodDisruptionBudget blocks."""

    status = 429

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class EvictionBlocked(TooManyRequests):
    """A PodDisruptionBudget kept blocking an eviction until its deadline."""


class ServerError(KubeError):
    """5xx after every retry."""

    status = 500


class MultipleBudgets(ServerError):
    """The pod has more than one PodDisruptionBudget; the eviction API refuses it (500)."""


class CheckpointFailed(ServerError):
    """The kubelet could not checkpoint the container (for example, no CRIU in the runtime)."""


class Unavailable(KubeError):
    """The API server could not be reached (connection refused, reset, timed out) after every retry."""

    status = 0


class UndeclaredOperation(KubeError):
    """A daemon called a port operation its `Access` (its package's `access.py`) does not declare."""


_BY_STATUS: dict[int, type[KubeError]] = {
    error.status: error
    for error in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        Gone,
        UnsupportedMediaType,
        Invalid,
        TooManyRequests,
    )
}


def from_status(status: int, body: Any, retry_after: float | None = None) -> KubeError:
    """The typed error for an HTTP status and its body (a `Status` object, or text)."""
    if isinstance(body, dict) and body.get("kind") == "Status":
        message = str(body.get("message") or body.get("reason") or f"HTTP {status}")
        reason = str(body.get("reason") or "")
        details = body.get("details") or {}
    else:
        message = (body if isinstance(body, str) else "").strip() or f"HTTP {status}"
        reason, details = "", {}
    message = " ".join(message.split())
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(message, status=status, reason=reason, details=details)
    if status == 429:
        return TooManyRequests(
            message, status=status, reason=reason, details=details, retry_after=retry_after
        )
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else KubeError)
    return cls(message, status=status, reason=reason, details=details)
