"""services.culler: idle sessions warned, then stopped. `policy` (pure), `service` (the handlers), its KV records in `schemas.state.culler`."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="culler",
    package=__name__,
    view="view:view",
    handlers="service:app",
)
