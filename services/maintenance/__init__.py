"""services.maintenance: checkpoint, then drain, before node maintenance (the daemon keeps the name `checkpoint`). `plan` (pure), `service` (its declared handlers), `intake`, `steps`, `controls`, `state` (its KV records), `view`."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="checkpoint",
    package=__name__,
    view="view:view",
    commands={"maintenance": "cli:maintenance_app"},
)
