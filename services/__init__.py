"""Services: consumers that decide and act. Each is a policy plus handlers; shared actions
and guards live in `services.kernel`."""
