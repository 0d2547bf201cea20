"""Embedded stand-ins for running nodeward without a cluster: NATS, the sim cluster, GPUs."""
