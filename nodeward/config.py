"""Configuration: one YAML file with a section per daemon, overridden by the environment.

Precedence (highest first): `NODEWARD_<SECTION>__<KEY>` environment variables, the YAML
file given with `--config`, the defaults below. Every default works with `nodeward up`.
Later sections (`agents.gpu`, `services.cordon`, ...) are added by the modules that own them.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nodeward import yamlfile
from nodeward.durations import Duration


class Section(BaseModel):
    """A section of the config file: an unknown key is refused. A field's description is the
    string under it (pydantic's `use_attribute_docstrings`), or its `Field(description=...)`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class BusSettings(Section):
    """How a daemon reaches NATS."""

    url: str = "nats://127.0.0.1:4222"
    name: str | None = None
    """client connection name; defaults to the daemon's"""
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    token_file: Path | None = None
    """a token read again at every (re)connect: a projected ServiceAccount token, which the kubelet
    rotates, for NATS auth callout (docs/deploying.md)"""
    token_refresh_before: Duration = timedelta(minutes=5)
    """with token_file: from this long before the token in use ends, reconnect as soon as the file
    holds a newer one"""
    creds_file: Path | None = None
    """NATS .creds (JWT + nkey seed)"""
    nkey_seed_file: Path | None = None
    inbox_prefix: str | None = None
    """e.g. _INBOX_<node> for per-node ACLs"""
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    """a client certificate (PEM) for a server that verifies them"""
    tls_key_file: Path | None = None
    """the client certificate's key"""
    connect_timeout: Duration = timedelta(seconds=2)
    reconnect_wait_max: Duration = timedelta(seconds=10)
    publish_timeout: Duration = timedelta(seconds=5)
    publish_retries: int = Field(default=5, ge=0)
    max_clock_skew: Duration = timedelta(seconds=5)
    """an event whose time (or observation time) is further ahead of when the bus stored it is
    refused: dead-lettered as `future`, audited, on-call told"""
    ready_deadline: Duration = timedelta(seconds=5)
    """a daemon is not ready once the server has not answered a ping, acknowledged a publish or fed
    its consumers for this long"""
    ping_interval: Duration = timedelta(seconds=1)
    """how often a daemon pings the server"""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    partitions: int = Field(
        default=1,
        ge=1,
        le=16,  # nodeward.nats_auth.MAX_PARTITIONS
        description="partitions of the streams consumed in order per key (one durable consumer"
        " per partition, claimed by a service's replicas with KV leases); every daemon of a"
        " deployment must say the same",
    )
    provision: bool = True
    """create/update streams on start (needs $JS.API rights)"""


class ClusterSettings(Section):
    """How services reach Kubernetes."""

    kubeconfig: Path | None = None
    """None: in-cluster config"""
    context: str | None = None
    request_timeout: Duration = timedelta(seconds=10)
    retries: int = Field(default=5, ge=0)
    concurrency: int = Field(
        default=32, ge=1, le=512, description="requests in flight at once (threads, connections)"
    )


class RestartSettings(Section):
    """How `nodeward up` restarts a daemon that dies: after `backoff`, doubling to
    `backoff_max`; after `limit` restarts within `window` it gives up on that component."""

    backoff: Duration = timedelta(seconds=1)
    backoff_max: Duration = timedelta(seconds=30)
    limit: int = Field(default=5, ge=0, description="restarts per window; 0 never restarts")
    window: Duration = timedelta(minutes=10)


class DaemonSettings(Section):
    """The HTTP endpoint every daemon serves: /healthz, /readyz, /metrics."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    shutdown_timeout: Duration = timedelta(seconds=20)
    restart: RestartSettings = RestartSettings()


class AuthCalloutSettings(Section):
    """How the auth callout signs, what it grants, and whose tokens it takes."""

    issuer_seed_file: Path | None = None
    """the account nkey seed (SA...) whose public key is the server's auth_callout.issuer; it signs
    every answer"""
    xkey_seed_file: Path | None = None
    """a curve seed (SX...) whose public key is the server's auth_callout.xkey: requests (which
    carry tokens) and answers are then sealed"""
    permissions_file: Path | None = None
    """the grants (`python -m launch.access nats-permissions`); the chart's
    files/nats-permissions.json"""
    account: str = "NODEWARD"
    """the account users are placed in: its name (server config accounts), or its public key A...
    (operator mode, where the issuer is its signing key)"""
    namespace: str = "nodeward"
    """where nodeward's pods run"""
    release: str = "nodeward"
    """ServiceAccounts are <release>-<name>"""
    audience: str = "nats"
    """the audience tokens must be for"""
    user_ttl: Duration = timedelta(hours=1)
    """how long a grant lasts for a token that does not end (one that does: until it ends; the
    daemon reconnects with its rotated token before then)"""
    queue: str = "nodeward-auth-callout"
    """replicas share requests"""


class LogSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NODEWARD_",
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    bus: BusSettings = BusSettings()
    cluster: ClusterSettings = ClusterSettings()
    daemon: DaemonSettings = DaemonSettings()
    log: LogSettings = LogSettings()
    auth_callout: AuthCalloutSettings = AuthCalloutSettings()
    agents: dict[str, dict[str, Any]] = Field(default_factory=dict)
    services: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment overrides it.
        return env_settings, init_settings


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate. `str()` is one line."""


def read_yaml(path: Path) -> dict[str, Any]:
    data = yamlfile.read_yaml(path, what="config", error=ConfigError, empty={})
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of sections")
    return dict(data)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from the YAML file (if any) and the environment; `overrides` win over the file."""
    from pydantic import ValidationError

    from schemas.cloudevents import one_line

    data = read_yaml(config_file) if config_file else {}
    for key, value in overrides.items():
        data.setdefault(key, {}).update(value) if isinstance(value, dict) else data.__setitem__(
            key, value
        )
    try:
        return Settings(**data)
    except ValidationError as exc:
        where = f" in {config_file}" if config_file else ""
        raise ConfigError(f"invalid configuration{where}: {one_line(exc)}") from None


def section(
    settings: Settings, group: Literal["agents", "services"], name: str, model: type[Section]
) -> Any:
    """Validate one daemon's section (`services.cordon`, ...) with that daemon's model."""
    from pydantic import ValidationError

    from schemas.cloudevents import one_line

    raw = getattr(settings, group).get(name, {})
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid {group}.{name} configuration: {one_line(exc)}") from None
