"""services.maintenance: checkpoint, then drain, before node maintenance (the daemon keeps the name `checkpoint`). `plan` (pure), `service` (the workflow)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="checkpoint",
    package=__name__,
    view="view:view",
    commands={"maintenance": "cli:maintenance_app"},
)
