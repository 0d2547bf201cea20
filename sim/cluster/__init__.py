"""The sim cluster: a local Kubernetes API server for the resources nodeward uses."""

from sim.cluster.embedded import EmbeddedCluster, embedded_cluster
from sim.cluster.seed import Seed, SeedError, load_seed
from sim.cluster.server import Checkpoint, SimCluster

__all__ = [
    "Checkpoint",
    "EmbeddedCluster",
    "Seed",
    "SeedError",
    "SimCluster",
    "embedded_cluster",
    "load_seed",
]
