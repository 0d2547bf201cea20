"""services.directory: each user namespace's owner from LDAP, as labels and annotations.
`settings` (its section), `mapping` (pure: entries into an owner, the owner into a patch),
`ldap` (the directory read with bonsai, loaded only by the daemon), `service` (the sync
loop, the namespace watch, the owner-left flag)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="directory",
    package=__name__,
)
