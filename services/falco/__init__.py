"""services.falco: responses to Falco alerts. `rules` (pure: alert to actions), `ingest` (the HTTP endpoint), `service` (the handlers)."""
