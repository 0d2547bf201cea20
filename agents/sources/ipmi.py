"""Node power from the BMC over IPMI: the DCMI power reading, else SDR sensors in Watts.

python-ipmi sends each request through `ipmitool` (`-I open` in-band via /dev/ipmi0,
`-I lanplus`/`-I lan` over the LAN). Here that interface runs ipmitool without a shell,
with the password in its environment (`-E`, never on the command line or in logs) and
under a deadline, so a BMC that hangs costs at most `settings.timeout` per read.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyipmi
import pyipmi.sdr
from pydantic import Field, SecretStr
from pyipmi.errors import (
    AuthenticationError,
    CompletionCodeError,
    IpmiConnectionError,
    IpmiLongPasswordError,
    IpmiTimeoutError,
)
from pyipmi.interfaces.ipmitool import Ipmitool

from agents.sources.power import PowerSample, SourceError
from nodeward.config import Section
from nodeward.durations import Duration
from nodeward.logs import get_logger
from schemas.energy import PowerSource

WATTS_UNIT = 6  # IPMI base unit type code for Watts (units_2 of a full sensor record)
DCMI_SYSTEM_POWER = 1  # Get Power Reading mode: system power statistics
DCMI_MEASUREMENT_ACTIVE = 0x40  # reading_state bit 6: the BMC is measuring power
DEVICE_PATHS = (Path("/dev/ipmi0"), Path("/dev/ipmi/0"), Path("/dev/ipmidev/0"))
# Cipher suites tried in turn over RMCP+: 17 (HMAC-SHA256, ipmitool's default) then 3
# (HMAC-SHA1). Naming one skips ipmitool's cipher-suite discovery, which some BMCs
# (ipmi_sim among them) never answer, costing seconds per request.
LANPLUS_CIPHERS = (17, 3)
MAX_SDRS = 1024  # a repository walk stops here, and at a record ID seen before
SDR_WALK_RUNS = 30  # the SDR walk's budget, in `settings.timeout`s (each run has one at most)
_PSU = re.compile(r"\bPSU?\s*_?(\d+)", re.IGNORECASE)
_SYSTEM = re.compile(
    r"^sys|system|total|\bnode\b|platform|chassis|consumption|power\s*meter", re.IGNORECASE
)
# a PSU's output power (its input is what the node draws): not read unless named
_OUTPUT = re.compile(r"out(put)?\b|\bpout\b", re.IGNORECASE)
# what ipmitool says when the BMC turns the user or password down
_AUTH_REFUSED = re.compile(r"RAKP|unauthorized name|Activate Session|password", re.IGNORECASE)
_T = TypeVar("_T")


class IpmiSettings(Section):
    """The node's BMC: in-band (`/dev/ipmi0`) without a host, else over the LAN."""

    enabled: bool = True
    host: str | None = None
    """None: in-band through /dev/ipmi0"""
    port: int = Field(default=623, ge=1, le=65535)
    user: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    """read at start; wins over password"""
    interface: Literal["lanplus", "lan"] = "lanplus"
    """RMCP+ (IPMI 2.0); `lan` for BMCs with RMCP only"""
    timeout: Duration = timedelta(seconds=5)
    sensors: list[str] = Field(
        default_factory=list,
        description="SDR sensor names to read when there is no DCMI; empty: every Watts sensor",
    )

    def secret(self) -> str | None:
        """The password, from `password_file` if set (one line, trailing newline dropped)."""
        if self.password_file is not None:
            return self.password_file.read_text().rstrip("\n")
        return self.password.get_secret_value() if self.password else None


def _errors(output: str) -> list[str]:
    """The lines of ipmitool's output that say what went wrong."""
    lines = (ln.strip() for ln in output.splitlines())
    return [ln for ln in lines if re.search(r"error|unable|invalid|fail", ln, re.IGNORECASE)]


class _NoTool(Exception):
    """The ipmitool binary is not there."""


class _Deadline(Exception):
    """The read's time budget ran out before ipmitool answered."""

    def __init__(self, output: str = "") -> None:
        super().__init__(output)
        self.output = output


class BoundedIpmitool(Ipmitool):  # type: ignore[misc]  # pyipmi is untyped
    """python-ipmi's `ipmitool` interface, run without a shell, bounded by a deadline,
    with the password passed through `IPMI_PASSWORD` (`-E`)."""

    def __init__(
        self,
        interface_type: str,
        *,
        binary: str = "ipmitool",
        password: str | None = None,
        cipher: int | None = None,
        try_timeout_s: int | None = None,
    ) -> None:
        lan = interface_type in ("lan", "lanplus")
        super().__init__(
            interface_type=interface_type,
            cipher=cipher,
            retries=1 if lan else None,  # -R 0 means ipmitool's default (4 retries)
            timeout=try_timeout_s if lan else None,
        )
        self.binary = binary
        self._password = password
        self.run_s = 30.0  # the most one ipmitool run may take (the reader sets its timeout)
        self.deadline = float("inf")  # time.monotonic() by which the current call must end
        self.last_output = ""

    def _build_ipmitool_credentials(self) -> str:
        user = self._get_session().auth_username_bytes.decode()
        return f" -U {shlex.quote(user)} -E"

    def _run_ipmitool(self, cmd: str) -> tuple[bytes, int]:
        argv = [a for a in shlex.split(cmd) if a != "2>&1"]
        argv[0] = self.binary
        env = {k: v for k, v in os.environ.items() if k != "IPMI_PASSWORD"}
        if self._interface_type in ("lan", "lanplus"):
            env["IPMI_PASSWORD"] = self._password or ""  # -E with no variable would prompt
        now = time.monotonic()
        remaining = min(self.deadline, now + self.run_s) - now
        if remaining <= 0:
            raise _Deadline
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=remaining,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            partial = e.stdout if isinstance(e.stdout, bytes) else b""
            self.last_output = partial.decode(errors="replace")
            raise _Deadline(self.last_output) from e
        except FileNotFoundError as e:
            raise _NoTool from e
        self.last_output = done.stdout.decode(errors="replace")
        return done.stdout, done.returncode


@dataclass(frozen=True)
class PowerSensor:
    """A full SDR sensor in Watts and the component its readings are for."""

    name: str
    number: int
    lun: int
    component: str
    convert: Callable[[int | None], float | None]


def component_for(name: str) -> str:
    """`psu-<n>` for a power supply's sensor, `system` for the whole node, else a token."""
    if m := _PSU.search(name):
        return f"psu-{int(m.group(1))}"
    if _SYSTEM.search(name):
        return "system"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "sensor"


def watts_from_dcmi(rsp: Any) -> float:
    """The current power of a DCMI Get Power Reading response; `SourceError` if the BMC
    is not measuring (`reading_state` bit 6 clear)."""
    if not int(rsp.reading_state) & DCMI_MEASUREMENT_ACTIVE:
        raise SourceError("DCMI power measurement is not active")
    return float(rsp.current_power)


class IpmiReader:
    """A `PowerReader` for the node's BMC (see the module docstring).

    `probe()` (run by the first `read()` if not called) asks for the DCMI power reading
    and falls back to the SDR repository's Watts sensors (`settings.sensors` narrows them
    by name; without it every Watts sensor is read but PSU output ones). The probe walks the SDR repository, one ipmitool run per request, so it is
    slower than a read; each request is bounded by `settings.timeout`.
    """

    name = "ipmi"

    def __init__(self, settings: IpmiSettings, *, ipmitool: str = "ipmitool") -> None:
        self.settings = settings
        self._ipmitool = ipmitool
        self._timeout_s = settings.timeout.total_seconds()
        self.bmc = (
            "in-band BMC (/dev/ipmi0)"
            if settings.host is None
            else f"BMC {settings.host}:{settings.port}"
        )
        self._ipmi: Any = None
        self._intf: BoundedIpmitool | None = None
        self._dcmi = False
        self._sensors: list[PowerSensor] = []
        self._probed = False
        self._log: Any = get_logger(source="ipmi", bmc=self.bmc)

    # -- connection -------------------------------------------------------------------

    def _password(self) -> str | None:
        try:
            return self.settings.secret()
        except (OSError, UnicodeDecodeError) as e:
            raise SourceError(
                f"ipmi: {self.bmc}: cannot read the password file"
                f" {self.settings.password_file}: {getattr(e, 'strerror', None) or e}"
            ) from None

    def _connect(self, cipher: int | None) -> None:
        s = self.settings
        interface_type = "open" if s.host is None else s.interface
        intf = BoundedIpmitool(
            interface_type,
            binary=self._ipmitool,
            password=self._password() if s.host is not None else None,
            cipher=cipher,
            # ipmitool's timeout per try (-N, whole seconds); it takes about twice that to
            # give up with -R 1, so it usually says why before the deadline kills it
            try_timeout_s=max(1, int((self._timeout_s - 0.5) / 2)),
        )
        ipmi = pyipmi.create_connection(intf)
        if s.host is not None:
            ipmi.session.set_session_type_rmcp(s.host, s.port)
            if s.user is not None or s.password is not None or s.password_file is not None:
                # the password goes to ipmitool through its environment, not the session
                ipmi.session.set_auth_type_user(s.user or "", "")
            ipmi.session.set_priv_level("user")
        ipmi.target = pyipmi.Target()  # the BMC itself: no `-t`, no bridging
        ipmi.session.establish()
        intf.run_s = self._timeout_s
        self._ipmi, self._intf = ipmi, intf

    def _check_device(self) -> None:
        found = [p for p in DEVICE_PATHS if p.exists()]
        if not found:
            raise SourceError(
                f"ipmi: {self.bmc}: /dev/ipmi0 is missing (load the ipmi_si and ipmi_devintf"
                " kernel modules, or set agents.energy.ipmi.host to read the BMC over the LAN)"
            )
        if not os.access(found[0], os.R_OK | os.W_OK):
            raise SourceError(
                f"ipmi: {self.bmc}: no read/write access to {found[0]} (run as root, or grant"
                " this user rw on the device, e.g. a udev rule with GROUP and MODE=0660)"
            )

    def _call(self, what: str, fn: Callable[[], _T], budget_s: float | None = None) -> _T:
        """Run python-ipmi calls within `budget_s` (default: `settings.timeout`), each
        ipmitool run within `settings.timeout`; every failure -> `SourceError`."""
        assert self._intf is not None
        self._intf.deadline = time.monotonic() + (budget_s or self._timeout_s)
        try:
            return fn()
        except SourceError:
            raise
        except _NoTool:
            raise SourceError(
                f"ipmi: {self.bmc}: {self._ipmitool} not found (install the ipmitool package)"
            ) from None
        except _Deadline as e:
            said = f" (ipmitool said: {self._tool_said()})" if _errors(e.output) else ""
            raise SourceError(
                f"ipmi: {self.bmc}: no answer to {what} within {self._timeout_s:g}s{said}"
            ) from None
        except (AuthenticationError, IpmiLongPasswordError):
            raise self._auth_failed() from None
        except CompletionCodeError:
            raise  # the BMC answered "no": the caller decides
        except (IpmiConnectionError, IpmiTimeoutError):
            if self._intf is not None and _AUTH_REFUSED.search(self._intf.last_output):
                raise self._auth_failed() from None
            raise SourceError(
                f"ipmi: {self.bmc}: cannot reach or open a session for {what}: {self._tool_said()}"
            ) from None
        except Exception as e:  # noqa: BLE001  # a garbage answer can fail anywhere in decoding
            raise SourceError(
                f"ipmi: {self.bmc}: bad answer to {what}: {type(e).__name__}: {e}"
                f"; ipmitool said: {self._tool_said()}"
            ) from None

    def _auth_failed(self) -> SourceError:
        out = self._intf.last_output if self._intf is not None else ""
        lines = (ln.strip().lstrip("> ") for ln in out.splitlines())
        said = next((ln for ln in lines if _AUTH_REFUSED.search(ln)), "")
        user = repr(self.settings.user) if self.settings.user else "(anonymous)"
        return SourceError(
            f"ipmi: {self.bmc}: authentication failed for user {user}: {said or 'refused'}"
        )

    def _tool_said(self) -> str:
        out = self._intf.last_output if self._intf is not None else ""
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        return " / ".join((_errors(out) or lines)[-2:])[:300] or "nothing"

    # -- probing ----------------------------------------------------------------------

    def probe(self) -> None:
        """Find out how this BMC reports power: DCMI, else SDR sensors in Watts."""
        if self._probed:
            return
        if self.settings.host is None:
            self._check_device()
        ciphers: tuple[int | None, ...] = (
            LANPLUS_CIPHERS
            if self.settings.host is not None and self.settings.interface == "lanplus"
            else (None,)
        )
        for i, cipher in enumerate(ciphers):
            self._connect(cipher)
            try:
                self._dcmi = self._probe_dcmi()
                break
            except SourceError:
                if i + 1 == len(ciphers) or not self._cipher_refused():
                    raise
        if not self._dcmi:
            self._sensors = self._probe_sdr()
        self._probed = True
        self._log.info("ipmi power source", found=self.describe())

    def _cipher_refused(self) -> bool:
        out = self._intf.last_output if self._intf is not None else ""
        return "authentication algorithm" in out or "cipher" in out.lower()

    def _probe_dcmi(self) -> bool:
        try:
            rsp = self._call(
                "DCMI Get Power Reading", lambda: self._ipmi.get_power_reading(DCMI_SYSTEM_POWER)
            )
        except CompletionCodeError:
            return False  # "invalid command" & co: no DCMI on this BMC
        return bool(int(rsp.reading_state) & DCMI_MEASUREMENT_ACTIVE)

    def _walk_sdr(self) -> list[Any]:
        """The SDR repository's records, guarded against a BMC whose record IDs loop."""
        reservation = self._ipmi.reserve_sdr_repository()
        records: list[Any] = []
        seen: set[int] = set()
        record_id = 0
        while record_id != 0xFFFF and record_id not in seen and len(records) < MAX_SDRS:
            seen.add(record_id)
            record = self._ipmi.get_repository_sdr(record_id, reservation)
            records.append(record)
            record_id = record.next_id
        return records

    def _probe_sdr(self) -> list[PowerSensor]:
        try:
            sdrs = self._call(
                "reading the SDR repository", self._walk_sdr, SDR_WALK_RUNS * self._timeout_s
            )
        except CompletionCodeError as e:
            raise SourceError(
                f"ipmi: {self.bmc}: no DCMI power reading and the SDR repository is"
                f" unreadable (completion code 0x{e.cc:02x})"
            ) from None
        watts = [
            s
            for s in sdrs
            if s.type == pyipmi.sdr.SDR_TYPE_FULL_SENSOR_RECORD and s.units_2 == WATTS_UNIT
        ]
        wanted = {n.lower() for n in self.settings.sensors}
        if wanted:
            names = {s.device_id_string.lower() for s in watts}
            if missing := sorted(wanted - names):
                raise SourceError(
                    f"ipmi: {self.bmc}: no Watts sensor named {', '.join(map(repr, missing))}"
                    f" (it has: {', '.join(repr(s.device_id_string) for s in watts) or 'none'})"
                )
            watts = [s for s in watts if s.device_id_string.lower() in wanted]
        else:
            watts = [s for s in watts if not _OUTPUT.search(s.device_id_string)]
        if not watts:
            raise SourceError(f"ipmi: {self.bmc}: no DCMI power reading and no SDR sensor in Watts")
        seen: dict[str, int] = {}
        sensors = []
        for s in watts:
            component = component_for(s.device_id_string)
            seen[component] = seen.get(component, 0) + 1
            if seen[component] > 1:
                component = f"{component}-{seen[component]}"
            sensors.append(
                PowerSensor(
                    s.device_id_string,
                    s.number,
                    s.owner_lun,
                    component,
                    s.convert_sensor_raw_to_value,
                )
            )
        return sensors

    # -- PowerReader ------------------------------------------------------------------

    def describe(self) -> str:
        """Which reading this BMC gives (after `probe()`), one line."""
        if not self._probed:
            return f"{self.bmc}: not probed yet"
        if self._dcmi:
            return f"{self.bmc}: DCMI power reading"
        listed = ", ".join(f"{s.name!r} (W) as {s.component}" for s in self._sensors)
        return f"{self.bmc}: SDR sensors: {listed}"

    @property
    def max_read_s(self) -> float:
        """The longest one `read()` can take under its own deadlines (a probe first, if due)."""
        runs = 1 if self._dcmi else max(1, len(self._sensors))
        if not self._probed:
            runs += SDR_WALK_RUNS + 2
        return runs * self._timeout_s

    def read(self) -> list[PowerSample]:
        """One reading of the node (DCMI) or of each chosen sensor (SDR)."""
        self.probe()
        if self._dcmi:
            rsp = self._checked(
                "DCMI Get Power Reading", lambda: self._ipmi.get_power_reading(DCMI_SYSTEM_POWER)
            )
            try:
                watts = watts_from_dcmi(rsp)
            except SourceError as e:
                raise SourceError(f"ipmi: {self.bmc}: {e}") from None
            return [PowerSample(PowerSource.DCMI, "system", time.monotonic(), watts=watts)]
        samples = []
        for s in self._sensors:
            raw, _ = self._checked(
                f"sensor {s.name!r}", partial(self._ipmi.get_sensor_reading, s.number, s.lun)
            )
            value = s.convert(raw)
            if value is None:
                raise SourceError(
                    f"ipmi: {self.bmc}: sensor {s.name!r} has no reading (unavailable)"
                )
            samples.append(
                PowerSample(PowerSource.IPMI_SDR, s.component, time.monotonic(), watts=value)
            )
        return samples

    def _checked(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return self._call(what, fn)
        except CompletionCodeError as e:
            raise SourceError(
                f"ipmi: {self.bmc}: {what} refused (completion code 0x{e.cc:02x})"
            ) from None

    def close(self) -> None:
        """Nothing stays open: ipmitool opens a session per request."""
        self._ipmi = None
        self._intf = None
        self._probed = False
