"""`<state-dir>/endpoints.json`: where every endpoint of a running `nodeward up` is."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

DEFAULT_STATE_DIR = Path(".nodeward")


class Endpoints(BaseModel):
    nats_url: str
    state_dir: Path
    kubeconfig: Path | None = None
    kube_api: str | None = Field(
        default=None, description="the sim cluster's URL when `up` runs it"
    )
    outbox: Path | None = None
    metrics: dict[str, str] = Field(default_factory=dict, description="daemon name -> base URL")
    falco_ingest_url: str | None = None
    falco_token_file: Path | None = None
    oauth2_token_url: str | None = Field(
        default=None, description="the local OAuth2 provider's token endpoint, with the sim cluster"
    )
    console_url: str | None = Field(default=None, description="the read-only web console")
    admission_url: str | None = Field(
        default=None, description="the admission webhook's review URL (HTTPS)"
    )
    admission_ca_file: Path | None = Field(
        default=None, description="the CA that signed the admission webhook's certificate"
    )
    registry: str | None = Field(
        default=None, description="host:port of the local registry checkpoint images go to"
    )
    bmcs: dict[str, str] = Field(
        default_factory=dict,
        description="node -> host:port of the simulated BMC that runs its machine, with the "
        "sim cluster",
    )
    pid: int = Field(default_factory=os.getpid)
    started_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def write(self) -> Path:
        """Write atomically (readers never see half a file)."""
        path = self.state_dir / "endpoints.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, state_dir: Path = DEFAULT_STATE_DIR) -> Endpoints | None:
        """The endpoints of a platform still running from `state_dir`, else None."""
        path = state_dir / "endpoints.json"
        try:
            found = cls.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(found.pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by someone else
        return found

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "endpoints.json").unlink()
