"""services.credentials: Kerberos and OAuth2 renewal in opted-in Secrets. `schedule` (what is due), `secret` (reading a credential), `kerberos` and `oauth2` (renewers), `service` (the handlers), `view` (its rows in `nodeward status`)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="credentials",
    package=__name__,
    view="view:view",
)
