"""services.notifier: notices to people. `routing`, `grouping` and `render` (pure), `channels` (delivery), `owners` (who owns a pod), `service` (the handlers)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="notifier",
    package=__name__,
)
