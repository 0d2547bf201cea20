"""services.recovery: drive a quarantined node back into service (drain, reset or reboot,
validate, release) when the XID catalog says a reset or a reboot cures its fault."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="recovery",
    package=__name__,
    view="view:view",
    commands={"recovery": "cli:recovery_app"},
)
