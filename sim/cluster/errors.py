"""API errors as the real API server reports them: a `Status` object with reason and code."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error the sim answers with a `Status` body and the matching HTTP code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}
        self.list_meta: dict[str, Any] = {}
        """The Status's list metadata (a 410's fresh `continue` token)."""

    def status(self) -> dict[str, Any]:
        # metav1.Status's field order, as the API server encodes it
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(kind: str, name: str, group: str) -> dict[str, Any]:
    """`metav1.StatusDetails`: an empty name or group is left out (`omitempty`)."""
    details = {"name": name, "group": group, "kind": kind}
    return {k: v for k, v in details.items() if v or k == "kind"}


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        404, "NotFound", f'{qualified} "{name}" not found', details=_details(resource, name, group)
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified} "{name}" already exists',
        details=_details(resource, name, group),
    )


def conflict(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details=_details(resource, name, group),
    )


def invalid(kind: str, name: str, group: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; `causes` are (field, reason type, message) as the API reports them."""
    text = ", ".join(f"{field}: {msg}" for field, _, msg in causes)
    qualified = f"{kind}.{group}" if group else kind
    details = _details(kind, name, group)
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
