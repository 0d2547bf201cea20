"""The composition root: `nodeward up`, `nodeward sim ...` and the simulated agents. The only package (with tests and benches) that imports both the simulators and the daemons."""
