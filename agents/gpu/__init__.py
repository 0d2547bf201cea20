"""agents.gpu: the GPU health agent (NVML), one per node. `health` is its pure policy (NVML
samples and XIDs to GPU health), `agent` samples and publishes, `settings`, `wiring` builds it
from the config (`nodeward agent gpu`)."""
