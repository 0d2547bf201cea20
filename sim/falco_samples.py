"""The sample Falco alerts (`sim/data/falco-alerts.jsonl`) and the sim seed holding the
pods they are about (`sim/data/falco-seed.yaml`), for tests, benches and trying the
Falco response by hand."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import yaml

from schemas.tokens import falco_rule_token
from sim.cluster.seed import CheckpointSeed, Seed

NODE = "gpu-node-07"
DROP_AND_EXECUTE = "Drop and execute new binary in container"
SEED_FILE = "falco-seed.yaml"


def samples() -> list[dict[str, Any]]:
    """The eight sample alerts, in Falcosidekick's NATS payload form."""
    text = (files("sim") / "data" / "falco-alerts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sidekick_subject(alert: dict[str, Any]) -> str:
    """The subject Falcosidekick's NATS output publishes `alert` on."""
    return f"falco.{alert['priority'].lower()}.{falco_rule_token(alert['rule'])}"


def sample_seed(suffix: str | None = None) -> Seed:
    """`sim/data/falco-seed.yaml`: node `gpu-node-07` with the sample alerts' pods, bob's
    with a sibling replica, `user-dave/exempt-trainer` labelled exempt, and carol's vllm
    container failing to checkpoint as a runtime without CRIU does. With a `suffix`, every
    namespace but `nodeward` is renamed `<name>-<suffix>` (tests sharing a NATS keep apart)."""
    text = (files("sim") / "data" / SEED_FILE).read_text()
    seed = Seed.model_validate(yaml.safe_load(text))
    if not suffix:
        return seed

    def ns(name: str) -> str:
        return name if name == "nodeward" else f"{name}-{suffix}"

    return seed.model_copy(
        update={
            "namespaces": [ns(n) for n in seed.namespaces],
            "pods": [p.model_copy(update={"namespace": ns(p.namespace)}) for p in seed.pods],
            "checkpoint": CheckpointSeed(
                fail=[
                    f.model_copy(update={"namespace": ns(f.namespace)})
                    for f in seed.checkpoint.fail
                ]
            ),
        }
    )


def with_sample_pods(seed: Seed) -> Seed:
    """`seed` plus the sample alerts' pods (and their namespaces and checkpoint failure) on
    its last GPU node, so `nodeward up` answers every sample alert as it is. Not the first:
    the default scenario's GPU fails there, and an exempt or isolated sample pod would (rightly)
    keep its recovery from rebooting the node."""
    samples_seed = sample_seed()
    gpu_nodes = [n.name for n in seed.nodes if n.gpu is not None and n.gpu.count > 0]
    if not gpu_nodes:
        return seed
    taken = {(p.namespace, p.name) for p in seed.pods}
    pods = [
        p.model_copy(update={"node": gpu_nodes[-1]})
        for p in samples_seed.pods
        if (p.namespace, p.name) not in taken
    ]
    namespaces = [
        *seed.namespaces,
        *(n for n in samples_seed.namespaces if n not in seed.namespaces),
    ]
    fail = [*seed.checkpoint.fail, *samples_seed.checkpoint.fail]
    return seed.model_copy(
        update={
            "namespaces": namespaces,
            "pods": [*seed.pods, *pods],
            "checkpoint": CheckpointSeed(fail=fail),
        }
    )
