"""Simulated peers, beside the runtime: the sim cluster (a Kubernetes API), SimNvml, scenarios
and fault injection. Only the composition root (`launch`), tests and benches import this."""
