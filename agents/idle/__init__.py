"""agents.idle: the session idleness agent. `agent` publishes verdicts; `evidence` judges a session from its signals (pure); `settings`; `wiring` builds it from the config."""
