"""services.falco: responses to Falco alerts. `rules` (pure: alert to actions), `alerts` (pure
helpers over one alert), `actions/` (the table of actions, one module each), `ingest` (the
HTTP endpoint), `isolations` (the isolation records, kept true to the API), `settings`,
`service` (the handlers). Its duplicate window is the kernel's
`Dedup` (records: `schemas.state.dedup`)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="falco",
    package=__name__,
    view="view:view",
    commands={"falco": "cli:falco_app"},
)
