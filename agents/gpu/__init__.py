"""agents.gpu: the GPU health agent (NVML), one per node. `agent` runs it; `health` is its pure policy: NVML samples and XIDs to GPU health."""
