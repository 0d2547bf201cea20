"""What the remediation kernel publishes for each service that acts through it."""

from __future__ import annotations

PUBLISHES = ("remediation.>", "notify.>")
"""An audit event and a notice per action (`services.kernel.audit`, `owner_notice`)."""
