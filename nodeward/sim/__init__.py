"""Embedded stand-ins for running nodeward without a cluster: NATS, Kubernetes, GPUs."""
