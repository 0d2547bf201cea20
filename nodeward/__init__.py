"""nodeward's runtime: bus, daemon lifecycle, config, logging, metrics, CLI and simulators."""
