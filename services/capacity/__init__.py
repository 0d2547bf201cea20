"""services.capacity: free GPUs per model and MIG profile, per node and in total. `policy` (pure counting), `service` (the watches, the bus, the snapshot), its KV record in `schemas.state.capacity`."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="capacity",
    package=__name__,
    commands={"capacity": "cli:capacity"},
)
