"""A local MIT Kerberos KDC (k5test): the realm `nodeward up` runs for the seeded Kerberos
Secrets, where the KDC packages are installed.

`missing()` says what is not installed (the KDC binaries, Debian `krb5-kdc`; the `k5test`
package); `Realm.start()` creates a realm with its KDC on a free block of loopback ports,
and `Realm.ticket()` gets a user a renewable ticket cache, as `kinit -r` in a notebook does.
Blocking (k5test runs the KDC tools as subprocesses): call it from a thread.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

REALM = "NODEWARD.SIM"
KDC_BINARIES = ("krb5kdc", "kdb5_util", "kadmin.local", "kinit")
_SBIN = "/usr/sbin"


class KdcError(RuntimeError):
    """The realm could not be made or used; `str()` is one line."""


def _path() -> str:
    return os.environ.get("PATH", "") + os.pathsep + _SBIN


def missing() -> list[str]:
    """What this machine lacks for a local KDC; empty when it can run one."""
    lacking = [
        f"{b} (Debian krb5-kdc, krb5-user: scripts/system-deps.sh)"
        for b in KDC_BINARIES
        if not shutil.which(b, path=_path())
    ]
    try:
        import k5test  # noqa: F401
    except ImportError:
        lacking.append("k5test (pip install 'nodeward[test]')")
    return lacking


def free_port_base() -> int:
    """A port base with ten free ports after it (k5test uses a fixed block)."""
    for _ in range(50):
        base = random.randrange(20000, 59000, 10)  # noqa: S311 - a port, not a secret
        try:
            for port in range(base, base + 10):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise OSError("no free block of ten loopback ports for the KDC")


@dataclass
class Realm:
    """A running realm: its k5test object and the krb5.conf clients use."""

    k5: Any

    @property
    def name(self) -> str:
        return str(self.k5.realm)

    @property
    def krb5_config(self) -> str:
        return str(self.k5.env["KRB5_CONFIG"])

    @classmethod
    def start(cls, renewable: timedelta = timedelta(days=7)) -> Realm:
        """A new realm and its KDC; tickets renewable up to `renewable`."""
        import k5test

        life = f"{int(renewable.total_seconds())}s"
        found = {name: shutil.which(name, path=_path()) for name in KDC_BINARIES}
        try:
            k5 = k5test.K5Realm(
                realm=REALM,
                portbase=free_port_base(),
                get_creds=False,
                kdc_conf={"realms": {"$realm": {"max_renewable_life": life, "max_life": "1d"}}},
                krb5_conf={"libdefaults": {"renew_lifetime": life}},
                **{name: path for name, path in found.items() if path},
            )
        except Exception as exc:  # noqa: BLE001 - k5test raises bare Exception
            raise KdcError(f"the KDC did not start: {str(exc).splitlines()[0]}") from None
        return cls(k5)

    def ticket(self, user: str, *, life: timedelta, renewable: timedelta) -> tuple[str, bytes]:
        """A new principal `user@REALM` (a random password) and a renewable ticket cache for
        it, as `kinit -l LIFE -r RENEWABLE` writes it: (principal, cache bytes)."""
        principal = f"{user}@{self.name}"
        password = secrets.token_urlsafe(24)
        with tempfile.TemporaryDirectory(prefix="nodeward-kinit-") as tmp:
            cache = Path(tmp) / "krb5cc"
            flags = ["-c", f"FILE:{cache}", "-l", f"{int(life.total_seconds())}s"]
            flags += ["-r", f"{int(renewable.total_seconds())}s"]
            try:
                self.k5.addprinc(principal, password)
                self.k5.kinit(principal, password, flags=flags)
            except Exception as exc:  # noqa: BLE001 - k5test raises bare Exception
                raise KdcError(f"no ticket for {principal}: {str(exc).splitlines()[0]}") from None
            return principal, cache.read_bytes()

    def stop(self) -> None:
        """Stop the KDC and remove the realm's files."""
        self.k5.stop()
