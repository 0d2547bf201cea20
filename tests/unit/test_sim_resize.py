"""`nodeward up --nodes N`: the default seed cut or grown to N GPU nodes."""

from __future__ import annotations

import pytest

from sim.cluster.resize import resize_seed
from sim.cluster.seed import SeedError, load_seed


def test_fewer_nodes_keep_the_first_and_only_their_pods() -> None:
    seed = load_seed()
    small = resize_seed(seed, 3)
    assert [n.name for n in small.nodes] == ["gpu-h100-01", "gpu-h100-02", "gpu-h100-03"]
    assert small.pods and all(p.node in {n.name for n in small.nodes} for p in small.pods)
    assert len(seed.nodes) == 11  # the original is untouched


def test_more_nodes_clone_the_shapes_in_turn_with_an_agent_pod_each() -> None:
    seed = load_seed()
    big = resize_seed(seed, 14)
    names = [n.name for n in big.nodes]
    assert len(names) == len(set(names)) == 14
    assert names[11:] == ["gpu-h100-05", "gpu-h100-06", "gpu-h100-07"]
    clone = big.nodes[11]
    assert clone.gpu is not None and clone.gpu.product == seed.nodes[0].gpu.product  # type: ignore[union-attr]
    daemons = [p for p in big.pods if p.role == "daemon" and p.node == "gpu-h100-05"]
    assert len(daemons) == 1 and daemons[0].name.startswith("nodeward-agent-")
    assert len({p.name for p in big.pods}) == len(big.pods)


def test_a_fleet_of_thousands_has_no_two_pods_of_one_name() -> None:
    """Five hex digits per agent pod collide by 2,500 nodes (the sim cluster then refused
    the seed: `pods "nodeward-agent-..." already exists`)."""
    big = resize_seed(load_seed(), 5000)
    assert len({(p.namespace, p.name) for p in big.pods}) == len(big.pods)
    assert len([p for p in big.pods if p.role == "daemon"]) >= 5000
    # The first clones keep the names they had (`up --nodes N` below the collisions).
    small = resize_seed(load_seed(), 11)
    assert {p.name for p in small.pods} <= {p.name for p in big.pods}


def test_zero_is_refused() -> None:
    with pytest.raises(SeedError, match="at least 1"):
        resize_seed(load_seed(), 0)
