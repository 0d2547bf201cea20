"""The NATS auth callout (`nodeward auth-callout`): components sign in to NATS with their
Kubernetes ServiceAccount tokens, and a new node's agent connects with no configuration."""
