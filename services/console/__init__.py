"""The console: a read-only web page of the fleet, live over Server-Sent Events."""
