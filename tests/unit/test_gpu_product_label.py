"""The GPU agent spells each GPU's model as the node's product label does (GPU feature
discovery's `nvidia.com/gpu.product`, AMD's node labeller's `amd.com/gpu.product-name`), so
`nodeward_gpu_info` joins with the capacity service's series, which read that label."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agents.sources import amdsmi, nvml
from agents.sources.amdsmi import amd_product
from agents.sources.nvml import nvidia_product
from nodeward.watchdog import Lane
from schemas.capacity import AMD_PRODUCT_LABEL
from sim.amdsmi import SimAmdSmi
from sim.cluster.seed import load_seed, node_manifest
from sim.nvml import SimNvml


@pytest.fixture
def lane() -> Iterator[Lane]:
    one = Lane("test")
    yield one
    one.close()


@pytest.mark.parametrize(
    ("name", "label"),
    [
        # GFD's own cases of `sanitise` (internal/lm/resource_test.go)...
        ("a space separated string", "a-space-separated-string"),
        ("some(thing)else", "somethingelse"),
        ("some ( thing )else", "some-thing-else"),
        ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
        (" input  with multiple   spaces   ", "input-with-multiple-spaces"),
        ("some [ / thing / ]else", "some-thing-else"),
        ("some-thing.else_new", "some-thing.else_new"),
        # ... and NVML names.
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA GH200 480GB", "NVIDIA-GH200-480GB"),
    ],
)
def test_an_nvml_name_is_spelt_as_gpu_feature_discovery_does(name: str, label: str) -> None:
    assert nvidia_product(name) == label


@pytest.mark.parametrize(
    ("name", "label"),
    [
        # AMD's labeller test data (cmd/k8s-node-labeller/main_test.go) and a board name.
        ("Instinct MI210", "Instinct_MI210"),
        ("AMD Instinct MI300X OAM", "AMD_Instinct_MI300X_OAM"),
        (" Radeon Pro W6800 (Navi 21) ", "Radeon_Pro_W6800_Navi_21"),
    ],
)
def test_an_amd_board_name_is_spelt_as_the_node_labeller_does(name: str, label: str) -> None:
    assert amd_product(name) == label


def test_every_seed_model_identified_by_the_agent_matches_its_node_label(lane: Lane) -> None:
    seen = set()
    for i, node in enumerate(load_seed().nodes):
        gpu = node.gpu
        if gpu is None or not gpu.count or gpu.product in seen:
            continue
        seen.add(gpu.product)
        if gpu.vendor == "amd":
            smi = SimAmdSmi.build(node.name, product=gpu.product, count=1)
            smi.amdsmi_init()
            ident = amdsmi.identify(smi, lane, 0)
        else:
            sim = SimNvml.build(node.name, product=gpu.product, count=1)
            sim.nvmlInit()
            ident = nvml.identify(sim, lane, 0)
        labels = node_manifest(node, i)["metadata"]["labels"]
        label = labels[AMD_PRODUCT_LABEL if gpu.vendor == "amd" else "nvidia.com/gpu.product"]
        assert ident.product == label, (node.name, ident.name)
    assert len(seen) >= 3  # A100, H100 and MI300X
