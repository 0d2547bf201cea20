"""The sim cluster: a local Kubernetes API server for the resources nodeward uses."""

from nodeward.sim.cluster.seed import Seed, SeedError, load_seed
from nodeward.sim.cluster.server import Checkpoint, SimCluster

__all__ = ["Checkpoint", "Seed", "SeedError", "SimCluster", "load_seed"]
