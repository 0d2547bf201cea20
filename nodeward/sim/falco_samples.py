"""The sample Falco alerts (`nodeward/data/falco-alerts.jsonl`) and the sim seed holding the
pods they are about (`nodeward/data/falco-seed.yaml`), for tests, benches and trying the
Falco response by hand."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import yaml

from nodeward.sim.cluster.seed import CheckpointSeed, Seed
from schemas.tokens import falco_rule_token

NODE = "gpu-node-07"
DROP_AND_EXECUTE = "Drop and execute new binary in container"
SEED_FILE = "falco-seed.yaml"


def samples() -> list[dict[str, Any]]:
    """The eight sample alerts, in Falcosidekick's NATS payload form."""
    text = (files("nodeward") / "data" / "falco-alerts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sidekick_subject(alert: dict[str, Any]) -> str:
    """The subject Falcosidekick's NATS output publishes `alert` on."""
    return f"falco.{alert['priority'].lower()}.{falco_rule_token(alert['rule'])}"


def sample_seed(suffix: str | None = None) -> Seed:
    """`nodeward/data/falco-seed.yaml`: node `gpu-node-07` with the sample alerts' pods, bob's
    with a sibling replica, `user-dave/exempt-trainer` labelled exempt, and carol's vllm
    container failing to checkpoint as a runtime without CRIU does. With a `suffix`, every
    namespace but `nodeward` is renamed `<name>-<suffix>` (tests sharing a NATS keep apart)."""
    text = (files("nodeward") / "data" / SEED_FILE).read_text()
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
