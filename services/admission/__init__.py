"""services.admission: the mutating admission webhook that mounts users' credential Secrets
into their pods and sets the namespace owner's identity. `policy` (pure: review in, answer
and JSONPatch out), `cache` (namespaces and credential Secrets' metadata, watch-fed),
`server` (the HTTPS edge, its certificate reloaded on rotation), `webhook` (the
MutatingWebhookConfiguration it needs), `settings`, `service` (the daemon)."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(name="admission", package=__name__)
