"""services.culler: idle sessions warned, then stopped. `policy` (pure), `service` (the handlers), `state` (its KV records), `view`."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="culler",
    package=__name__,
    view="view:view",
)
