"""Fixtures of the integration tests. The sim cluster's live in `simkube.py`."""

from tests.integration.cordon_fixtures import cordon_env  # noqa: F401
from tests.integration.simkube import admin, port_for, sim  # noqa: F401
