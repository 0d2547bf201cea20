"""Credential renewal: work items (due) and their outcomes (renewed, failed)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData
from schemas.common import K8sName, Namespace
from schemas.examples import alice_kerberos, example
from schemas.tokens import subject


class CredentialKind(StrEnum):
    KERBEROS = "kerberos"
    OAUTH2 = "oauth2"


class _CredentialEvent(EventData):
    STREAM: ClassVar[str] = "CREDENTIALS"
    EXAMPLE_SOURCE: ClassVar[str] = "service/credentials"
    OUTCOME: ClassVar[str]

    namespace: Namespace
    secret: K8sName
    kind: CredentialKind
    principal: str | None = Field(
        default=None, description="Kerberos principal or OAuth2 client id; never a secret"
    )

    def nats_subject(self) -> str:
        return subject(f"credentials.{self.OUTCOME}", self.namespace, self.secret)

    def about(self) -> str:
        return f"secret/{self.namespace}/{self.secret}"


class CredentialDue(_CredentialEvent):
    """A credential that should be renewed now."""

    TYPE: ClassVar[str] = "credentials.due.v1"
    SUBJECT_PATTERN: ClassVar[str] = "credentials.due.<ns>.<secret>"
    OUTCOME: ClassVar[str] = "due"

    expires_at: datetime
    renew_by: datetime
    renewable_until: datetime | None = None
    attempt: int = Field(default=1, ge=1)

    model_config = example(
        {
            **alice_kerberos(),
            "expires_at": "2026-08-21T00:00:00Z",
            "renew_by": "2026-08-20T22:00:00Z",
            "renewable_until": "2026-08-27T00:00:00Z",
            "attempt": 1,
        }
    )


class CredentialRenewed(_CredentialEvent):
    """A credential renewed and written back to its Secret."""

    TYPE: ClassVar[str] = "credentials.renewed.v1"
    SUBJECT_PATTERN: ClassVar[str] = "credentials.renewed.<ns>.<secret>"
    OUTCOME: ClassVar[str] = "renewed"

    expires_at: datetime
    renewable_until: datetime | None = None
    resource_version: str | None = Field(
        default=None, description="the Secret's resourceVersion after the write"
    )
    rotated: bool = Field(default=False, description="a new refresh token replaced the old one")

    model_config = example(
        {
            "namespace": "user-alice",
            "secret": "oauth-alice",
            "kind": "oauth2",
            "principal": "kubeflow-notebooks",
            "expires_at": "2026-08-20T15:02:11Z",
            "resource_version": "48213",
            "rotated": True,
        }
    )


class CredentialFailed(_CredentialEvent):
    """A renewal that failed, and whether it will be retried."""

    TYPE: ClassVar[str] = "credentials.failed.v1"
    SUBJECT_PATTERN: ClassVar[str] = "credentials.failed.<ns>.<secret>"
    OUTCOME: ClassVar[str] = "failed"

    error: str
    retryable: bool
    attempt: int = Field(default=1, ge=1)
    expires_at: datetime | None = None

    def concern(self) -> str:
        return "warning"

    model_config = example(
        {
            **alice_kerberos(),
            "error": "ticket not renewable past its renew_till",
            "retryable": False,
            "attempt": 3,
            "expires_at": "2026-08-21T00:00:00Z",
        }
    )
