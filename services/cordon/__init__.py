"""services.cordon: GPU quarantine. `policy` (pure: health event to decision), `service` (the handlers), `marks` (what a quarantine puts on a node), its KV records in `schemas.state.cordon`."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="cordon",
    package=__name__,
    view="view:view",
    commands={"breaker": "cli:breaker_app", "quarantine": "cli:quarantine_app"},
)
