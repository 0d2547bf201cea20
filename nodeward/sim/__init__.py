"""Simulated peers for `nodeward up` and the tests: the sim cluster (`nodeward.sim.cluster`)."""
