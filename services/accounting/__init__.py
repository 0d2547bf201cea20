"""The accounting service: energy, CO2e and GPU-hours per namespace, owner, node and GPU model."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="accounting",
    package=__name__,
    commands={"report": "cli:report"},
)
