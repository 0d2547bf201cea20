"""services.cordon: GPU quarantine. `policy` (pure: health event to decision), `service` (the handlers), `marks` (what a quarantine puts on a node), its KV records in `schemas.state.cordon`."""
