"""The accounting service: energy, CO2e and GPU-hours per namespace, owner, node and GPU model."""
