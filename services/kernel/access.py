"""What the remediation kernel publishes for each service that acts through it."""

from __future__ import annotations

PUBLISHES = ("remediation.>", "notify.>")
"""An audit event and a notice per action (`services.kernel.audit`, `owner_notice`)."""

AUDIT_READ = "$JS.API.STREAM.MSG.GET.AUDIT"
"""Reading the last audit record of a subject: an action resumed after a restart is
audited once, even past the stream's duplicate window (`Auditor.stored`)."""
