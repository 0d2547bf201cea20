"""Fixtures of the integration tests. The sim cluster's live in `simkube.py`."""

from tests.helpers.registry import auth_registry, registry  # noqa: F401
from tests.integration.accounting_fixtures import accounting_env  # noqa: F401
from tests.integration.capacity_fixtures import capacity_env  # noqa: F401
from tests.integration.cordon_fixtures import cordon_env  # noqa: F401
from tests.integration.credentials_fixtures import creds_env, kdc, oauth2_idp  # noqa: F401
from tests.integration.culler_fixtures import culler_env  # noqa: F401
from tests.integration.falco_fixtures import falco_env  # noqa: F401
from tests.integration.jupyter_peer import jupyter_kernel, jupyter_peer  # noqa: F401
from tests.integration.ldap_peer import directory_env, slapd  # noqa: F401
from tests.integration.maintenance_fixtures import maintenance_env  # noqa: F401
from tests.integration.notifier_peers import (  # noqa: F401
    alertmanager,
    chat_env,
    notifier_env,
    receiver,
    smtp_server,
)
from tests.integration.simkube import admin, port_for, sim  # noqa: F401
