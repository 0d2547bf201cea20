"""services.maintenance: checkpoint, then drain, before node maintenance (the daemon keeps the name `checkpoint`). `plan` (pure), `service` (the workflow)."""
