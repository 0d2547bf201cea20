"""services.notifier: notices to people. `routing`, `grouping` and `render` (pure), `channels` (delivery), `owners` (who owns a pod), `service` (the handlers)."""
