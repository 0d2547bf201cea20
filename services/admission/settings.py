"""`services.admission` in the config file: the webhook's listener, TLS files and rules."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from nodeward.config import Section
from nodeward.durations import Duration

CREDENTIAL_LABEL = "nodeward.io/credential"
"""The label of a credential Secret, `kerberos` or `oauth2` (services/credentials/secret.py
reads the same Secrets; services never import each other, so the name is written twice)."""


class AdmissionSettings(Section):
    """`services.admission` in the config file."""

    host: str = "0.0.0.0"  # the API server reaches it through its Service
    port: int = Field(default=8443, ge=0, le=65535, description="0 picks a free port")
    path: str = "/mutate"
    """the review path (POST only); health, readiness and metrics stay on the daemon's port"""
    tls_cert_file: Path | None = None
    """PEM certificate chain the webhook presents (required; `nodeward up` makes one)"""
    tls_key_file: Path | None = None
    """its PEM private key"""
    tls_check_interval: Duration = timedelta(seconds=10)
    """how often the certificate and key files (and a Secret volume's `..data`) are checked
    for a rotation; a changed pair is loaded into the listening context, no connection dropped"""
    max_body_bytes: int = Field(default=3 * 1024 * 1024, ge=1024)
    """a larger AdmissionReview is answered 400 (the API server's own request limit is 3 MiB)"""
    deadline: Duration = timedelta(seconds=2)
    """how long one review may take (reading the body included); past it the answer is 503
    and the API server applies `failure_policy`"""
    timeout_seconds: int = Field(default=5, ge=1, le=30)
    """the webhook configuration's `timeoutSeconds`; `deadline` must be well inside it"""
    failure_policy: Literal["Ignore", "Fail"] = "Ignore"
    """the webhook configuration's `failurePolicy`: Ignore admits pods unmutated while the
    webhook is down; Fail refuses them"""
    credential_refs: Literal["refuse", "rewrite"] = "refuse"
    """a pod reading a credential Secret by `subPath`, `secretKeyRef` or `envFrom` (which
    renewal never reaches): refused with the fix, or rewritten to the whole-volume mount and
    its file variable"""
    mount_root: str = "/var/run/secrets/nodeward.io"
    """each credential Secret is mounted at `<mount_root>/<secret>/`"""
    oauth2_env: str = Field(default="OAUTH2_TOKEN_FILE", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """the variable naming the first OAuth2 Secret's access token file"""
    set_identity: bool = True
    """set runAsUser, runAsGroup, fsGroup and supplementalGroups from the namespace's owner
    where the pod sets none, and refuse another uid"""
    dry_run: bool = False
    """audit mode: every pod is admitted as it is; what would have been patched or refused
    is logged, counted (`dry_run="true"`) and told to the client as a warning"""
    require_owner: bool = False
    """refuse pods in an opted-in namespace the directory has recorded no owner uid on
    (otherwise they are admitted with their credentials mounted and no identity set)"""

    @model_validator(mode="after")
    def _deadline_inside_timeout(self) -> Self:
        if self.deadline.total_seconds() > self.timeout_seconds * 0.8:
            raise ValueError(
                f"deadline {self.deadline.total_seconds():g}s must be well inside "
                f"timeout_seconds {self.timeout_seconds} (at most 80 % of it)"
            )
        if not self.mount_root.startswith("/") or self.mount_root.rstrip("/") == "":
            raise ValueError("mount_root must be an absolute path other than /")
        return self
