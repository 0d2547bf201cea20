"""The directory service refuses to start in one line without what it needs: bonsai (the
`ldap` extra) or a readable bind password file; without a url it needs neither."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodeward.daemon import DaemonError
from services.directory.service import prepare
from services.directory.settings import DirectorySettings


async def test_a_missing_bonsai_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bonsai", None)  # import bonsai raises ImportError
    with pytest.raises(DaemonError) as caught:
        await prepare(DirectorySettings(url="ldaps://ldap.example.org"))
    said = str(caught.value)
    assert "\n" not in said
    assert said.startswith("services.directory needs bonsai") and "nodeward[ldap]" in said


async def test_a_missing_password_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    settings = DirectorySettings(url="ldap://l", bind_dn="cn=x", bind_password_file=missing)
    with pytest.raises(DaemonError, match=f"bind_password_file {missing} is not a file"):
        await prepare(settings)


async def test_without_a_url_nothing_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bonsai", None)
    await prepare(DirectorySettings())


def test_the_plugin_loads_no_ldap_client() -> None:
    import subprocess

    code = (
        "import sys; from nodeward.plugin import service; service('directory'); "
        "import services.directory.access; print('bonsai' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
