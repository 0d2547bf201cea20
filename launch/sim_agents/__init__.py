"""Agents wired to simulated hardware (SimNvml, the sim cluster's pods), as `nodeward up` runs them."""
