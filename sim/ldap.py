"""A real LDAP directory for the demo and the tests: Debian's OpenLDAP `slapd` on loopback.

`Slapd(root).start()` writes a `slapd.conf` into `root` (the core, cosine, nis and
inetOrgPerson schemas; an mdb database under `root`; a small `sizelimit`, so a client must
page (RFC 2696) to read more; TLS with a throwaway CA, for ldaps:// and StartTLS), starts
slapd on two free loopback ports (ldap:// and ldaps://), seeds the suffix, a bind account
for nodeward (`bind_dn`, `bind_password`, written to `password_file`) and the organisational
units for people, groups and e-groups, and returns once `ldapsearch` answers. `add_user`,
`add_group`, `delete`, `modify` change it as an administrator would (`ldapadd`,
`ldapdelete`, `ldapmodify` as the rootdn). Only loopback, only temp dirs; `stop()` ends the
slapd it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sim.cluster.tls import make_serving_cert

SLAPD = "/usr/sbin/slapd"
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")
CLIENTS = ("ldapadd", "ldapsearch", "ldapdelete", "ldapmodify")


def missing() -> str | None:
    """Why slapd cannot run here (what is not installed), or None."""
    if not os.access(SLAPD, os.X_OK):
        return f"{SLAPD} not installed (apt-get install slapd; scripts/system-deps.sh)"
    for client in CLIENTS:
        if shutil.which(client) is None:
            return f"{client} not installed (apt-get install ldap-utils)"
    for schema in SCHEMAS:
        if not (SCHEMA_DIR / f"{schema}.schema").exists():
            return f"{SCHEMA_DIR / schema}.schema missing"
    if not (MODULE_DIR / "back_mdb.la").exists() and not list(MODULE_DIR.glob("back_mdb*")):
        return f"back_mdb not in {MODULE_DIR}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class User:
    """A posixAccount + inetOrgPerson entry."""

    login: str
    uid: int | str
    gid: int | str
    mail: str | None = None
    name: str | None = None
    experiment: str | None = None
    """departmentNumber"""
    extra: tuple[tuple[str, str], ...] = ()
    """more (attribute, value) pairs, e.g. (("employeeNumber", "ten"),)"""

    def ldif(self, base: str) -> str:
        lines = [
            f"dn: uid={self.login},{base}",
            "objectClass: inetOrgPerson",
            "objectClass: posixAccount",
            f"uid: {self.login}",
            f"cn: {self.name or self.login}",
            f"sn: {self.login}",
            f"uidNumber: {self.uid}",
            f"gidNumber: {self.gid}",
            f"homeDirectory: /home/{self.login}",
        ]
        if self.mail:
            lines.append(f"mail: {self.mail}")
        if self.name:
            lines.append(f"displayName: {self.name}")
        if self.experiment:
            lines.append(f"departmentNumber: {self.experiment}")
        lines += [f"{attribute}: {value}" for attribute, value in self.extra]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Group:
    """A posixGroup entry with its `memberUid`s."""

    name: str
    gid: int
    members: tuple[str, ...] = ()

    def ldif(self, base: str) -> str:
        lines = [
            f"dn: cn={self.name},{base}",
            "objectClass: posixGroup",
            f"cn: {self.name}",
            f"gidNumber: {self.gid}",
        ]
        lines += [f"memberUid: {m}" for m in self.members]
        return "\n".join(lines) + "\n"


@dataclass
class Slapd:
    """One slapd under `root`; see the module's docstring."""

    root: Path
    suffix: str = "dc=nodeward,dc=test"
    sizelimit: int = 5
    start_timeout: float = 30.0
    port: int = 0
    tls_port: int = 0
    root_password: str = field(default_factory=lambda: secrets.token_hex(12))
    bind_password: str = field(default_factory=lambda: secrets.token_hex(12))
    dies_with_parent: bool = False
    """slapd is sent SIGTERM when this process ends, even by SIGKILL (`setpriv --pdeathsig`,
    where installed), as `nodeward up`'s other children are"""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    # where things are -------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://127.0.0.1:{self.tls_port}"

    @property
    def root_dn(self) -> str:
        return f"cn=admin,{self.suffix}"

    @property
    def bind_dn(self) -> str:
        return f"cn=nodeward,ou=services,{self.suffix}"

    @property
    def people(self) -> str:
        return f"ou=people,{self.suffix}"

    @property
    def groups(self) -> str:
        return f"ou=groups,{self.suffix}"

    @property
    def egroups(self) -> str:
        return f"ou=egroups,{self.suffix}"

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    @property
    def password_file(self) -> Path:
        return self.root / "bind-password"

    @property
    def log_file(self) -> Path:
        return self.root / "slapd.log"

    # life -------------------------------------------------------------------------------
    def start(self) -> Slapd:
        """Configure, start and seed; returns once it answers. RuntimeError (with slapd's
        log) if it does not start."""
        why = missing()
        if why:
            raise RuntimeError(why)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "db").mkdir(exist_ok=True)
        cert = make_serving_cert("127.0.0.1")
        self.ca_file.write_bytes(cert.ca_pem)
        (self.root / "server.crt").write_bytes(cert.cert_pem)
        key = self.root / "server.key"
        key.write_bytes(cert.key_pem)
        key.chmod(0o600)
        self.password_file.write_text(self.bind_password + "\n")
        self.password_file.chmod(0o600)
        (self.root / "slapd.conf").write_text(self._conf())
        for attempt in range(5):
            self.port = self.port if self.port and attempt == 0 else free_port()
            self.tls_port = self.tls_port if self.tls_port and attempt == 0 else free_port()
            if self._launch():
                break
        else:
            raise RuntimeError(f"slapd did not start: {self._log_tail()}")
        self._seed()
        return self

    def restart(self) -> None:
        """Start the stopped slapd again on the same ports, with the same data."""
        if self.running:
            return
        if not self._launch():
            raise RuntimeError(f"slapd did not start again: {self._log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> Slapd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _conf(self) -> str:
        includes = "\n".join(f"include {SCHEMA_DIR / s}.schema" for s in SCHEMAS)
        limit = self.sizelimit
        return f"""{includes}
pidfile {self.root / "slapd.pid"}
argsfile {self.root / "slapd.args"}
modulepath {MODULE_DIR}
moduleload back_mdb
TLSCACertificateFile {self.ca_file}
TLSCertificateFile {self.root / "server.crt"}
TLSCertificateKeyFile {self.root / "server.key"}
sizelimit size.soft={limit} size.hard={limit} size.prtotal=unlimited

database mdb
maxsize 104857600
suffix "{self.suffix}"
rootdn "{self.root_dn}"
rootpw {self.root_password}
directory {self.root / "db"}
index objectClass,uid,mail,memberUid eq
access to attrs=userPassword by anonymous auth by * none
access to * by users read by * none
"""

    def _launch(self) -> bool:
        urls = f"{self.url}/ {self.ldaps_url}/"
        log = self.log_file.open("ab")
        argv = [SLAPD, "-d", "0", "-h", urls, "-f", str(self.root / "slapd.conf")]
        setpriv = shutil.which("setpriv") if self.dies_with_parent else None
        if setpriv:  # PR_SET_PDEATHSIG survives the exec; no preexec_fn in a threaded process
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        self._proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return False
            if self._answers():
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def _answers(self) -> bool:
        done = subprocess.run(
            [
                "ldapsearch",
                "-x",
                "-LLL",
                "-H",
                self.url,
                "-b",
                "",
                "-s",
                "base",
                "-o",
                "nettimeout=2",
            ],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return done.returncode == 0

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log_file.read_text(errors="replace").splitlines()[-5:])
        return "(no log)"

    # changes, as an administrator makes them --------------------------------------------
    def _seed(self) -> None:
        top = self.suffix.split(",")[0].split("=")[1]
        entries = [
            f"dn: {self.suffix}\nobjectClass: dcObject\nobjectClass: organization\n"
            f"dc: {top}\no: nodeward test\n",
        ]
        for ou in ("people", "groups", "egroups", "services"):
            entries.append(
                f"dn: ou={ou},{self.suffix}\nobjectClass: organizationalUnit\nou: {ou}\n"
            )
        entries.append(
            f"dn: {self.bind_dn}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
            f"cn: nodeward\nuserPassword: {self.bind_password}\n"
        )
        self.add("\n".join(entries))

    def _admin(self, tool: str, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [tool, "-x", "-H", self.url, "-D", self.root_dn, "-w", self.root_password, *args],
            input=stdin.encode() if stdin is not None else None,
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.decode().strip()}")
        return done.stdout.decode()

    def add(self, ldif: str) -> None:
        """`ldapadd` the entries in `ldif` (separated by blank lines)."""
        self._admin("ldapadd", stdin=ldif)

    def modify(self, ldif: str) -> None:
        self._admin("ldapmodify", stdin=ldif)

    def delete(self, *dns: str) -> None:
        self._admin("ldapdelete", *dns)

    def add_users(self, users: Iterable[User]) -> None:
        self.add("\n".join(u.ldif(self.people) for u in users))

    def add_groups(self, groups: Iterable[Group], *, egroups: bool = False) -> None:
        base = self.egroups if egroups else self.groups
        self.add("\n".join(g.ldif(base) for g in groups))

    def user_dn(self, login: str) -> str:
        return f"uid={login},{self.people}"

    def search(self, base: str, filter_: str = "(objectClass=*)", *attrs: str) -> str:
        """`ldapsearch` as the rootdn (no size limit), LDIF out."""
        return self._admin("ldapsearch", "-LLL", "-b", base, filter_, *attrs)

    def search_as_bind(
        self, base: str, filter_: str, *attrs: str
    ) -> subprocess.CompletedProcess[str]:
        """An unpaged `ldapsearch` as nodeward's bind account (limits apply: rc 4 past them)."""
        return subprocess.run(
            [
                "ldapsearch",
                "-x",
                "-LLL",
                "-H",
                self.url,
                "-D",
                self.bind_dn,
                "-w",
                self.bind_password,
                "-b",
                base,
                filter_,
                *attrs,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def set_bind_password(self, password: str) -> None:
        """Change nodeward's bind password in the directory (the password file stays)."""
        self.modify(
            f"dn: {self.bind_dn}\nchangetype: modify\nreplace: userPassword\n"
            f"userPassword: {password}\n"
        )


@contextlib.contextmanager
def running(root: Path, **options: object) -> Iterator[Slapd]:
    """A started `Slapd` under `root`, stopped on exit."""
    server = Slapd(root, **options)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.stop()
