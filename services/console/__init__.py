"""The console: a read-only web page of the fleet, live over Server-Sent Events."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="console",
    package=__name__,
    access=None,
    handlers=None,
    commands={"console": "cli:console"},
)
