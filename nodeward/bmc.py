"""A node's power through its BMC, over IPMI v2.0 LAN (RMCP+, "lanplus"): the fencing port.

`Bmc` reads the chassis power (Get Chassis Status) and powers the node off (gracefully:
chassis control "soft shutdown", an ACPI request to the OS; or hard: "power down"), on,
or through a cycle. It speaks RMCP+ natively with python-ipmi's `rmcpplus` interface
(python-ipmi 0.6.1 with `cryptography`, for the AES of cipher suites 17 and 3): no
ipmitool process, typed errors, and the password never leaves this process.

Each call opens its own session and closes it: fencing calls are rare and minutes apart,
a kept session would need keep-alive traffic and dies with a BMC reset anyway, and a call
that overran its deadline cannot leave a half-used session behind for the next one.
python-ipmi is blocking, so a call runs in a thread (`asyncio.to_thread`) under
`timeout`; every receive waits at most `try_timeout`, and a control command is not sent
when its answer could no longer come back within `timeout`. A lost datagram is not resent
(`unreachable`): resending a power cycle could cycle twice, so retrying is the caller's.
A command's success is the BMC accepting it, not the power having changed: confirm with
`power_state` (`wait_power_state`).

Every failure is a `BmcError`, one line, with its `kind` (a `BmcFailure`, a `str`):
`credentials` (the BMC turned the user or password down), `unreachable` (no answer from
host:port in time), `refused` (the BMC answered with a completion code, or would not
grant the session's privilege), or `protocol` (an answer that makes no sense). No
password is ever in a message or a log line.

A node's BMC is named by its annotation `nodeward.io/bmc-address` (`host[:port]`) and
its credentials by a Secret (`bmc_credentials`); `bmc_target` puts the two together.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import socket
import time
from collections.abc import Callable, Mapping
from enum import StrEnum, auto
from typing import Any, Literal, TypeVar

import pyipmi
import pyipmi.session
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pyipmi.errors import (
    AuthenticationError,
    CompletionCodeError,
    IpmiConnectionError,
    IpmiLongPasswordError,
    MessageStatusCodeError,
    NotSupportedError,
    RetryError,
)
from pyipmi.interfaces.rmcpplus import RmcpPlus
from pyipmi.msgs import constants as ipmi_constants

from nodeward.aio import within
from nodeward.logs import get_logger

BMC_ADDRESS_ANNOTATION = "nodeward.io/bmc-address"
DEFAULT_PORT = 623
BMC_ADDRESS = 0x20  # the BMC's own IPMB address: no bridging
MAX_USERNAME_BYTES = 16  # IPMI v2.0 user names and passwords (RAKP)
MAX_PASSWORD_BYTES = 20
# RMCP+ session setup status codes that mean the BMC turned the user or password down
_CREDENTIALS_REFUSED = frozenset(
    {
        ipmi_constants.MSC_INVALID_NAME_LENGTH,
        ipmi_constants.MSC_UNAUTHORIZED_NAME,
        ipmi_constants.MSC_UNAUTHORIZED_GUID,
        ipmi_constants.MSC_INVALID_INTEGRITY_CHECK_VALUE,
    }
)
_T = TypeVar("_T")


class PowerState(StrEnum):
    """The chassis power, as Get Chassis Status's power-on bit says."""

    ON = "on"
    OFF = "off"


class BmcFailure(StrEnum):
    """How a BMC call failed (a `str`: `exc.kind == "credentials"` holds)."""

    CREDENTIALS = auto()
    """the BMC turned the user or password down"""
    UNREACHABLE = auto()
    """no answer from host:port in time (or no such host)"""
    REFUSED = auto()
    """the BMC answered no: a completion code, or the session's privilege refused"""
    PROTOCOL = auto()
    """an answer that makes no sense"""


_FAILURE_WORDS = {
    BmcFailure.CREDENTIALS: "wrong credentials",
    BmcFailure.UNREACHABLE: BmcFailure.UNREACHABLE,
    BmcFailure.REFUSED: "refused by the BMC",
    BmcFailure.PROTOCOL: "bad answer",
}


class BmcError(Exception):
    """A BMC call that failed: `kind` says how; the message is one line, without secrets."""

    def __init__(self, bmc: str, what: str, kind: BmcFailure, detail: str) -> None:
        self.bmc = bmc
        self.what = what
        self.kind = kind
        self.detail = " ".join(detail.split())
        super().__init__(f"BMC {bmc}: {what}: {_FAILURE_WORDS[kind]}: {self.detail}")


class BmcConfigError(ValueError):
    """A node's BMC address or credentials are missing or malformed (one line, no secret)."""


class BmcTarget(BaseModel):
    """Where a node's BMC answers and who to log in as. Its repr hides the password."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(min_length=1)
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    username: str = Field(min_length=1)
    password: SecretStr
    privilege: Literal["operator", "administrator"] = "operator"
    """the session's privilege: operator is enough for chassis control"""
    cipher_suite: int | None = None
    """RMCP+ cipher suite; None tries 17 (SHA-256, AES) then 3 (SHA-1, AES)"""

    @field_validator("username")
    @classmethod
    def _username_fits(cls, value: str) -> str:
        if len(value.encode()) > MAX_USERNAME_BYTES:
            raise ValueError(f"an IPMI user name has at most {MAX_USERNAME_BYTES} bytes")
        return value

    @field_validator("password")
    @classmethod
    def _password_fits(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value().encode()) > MAX_PASSWORD_BYTES:
            raise ValueError(f"an IPMI v2.0 password has at most {MAX_PASSWORD_BYTES} bytes")
        return value

    @property
    def address(self) -> str:
        """`host:port` (`[v6]:port` for an IPv6 address)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class _Session(pyipmi.session.Session):  # type: ignore[misc]  # pyipmi is untyped
    """python-ipmi's session, whose text (logged at debug by the interface) has no password."""

    def __str__(self) -> str:
        return f"Session(host={self.rmcp_host}:{self.rmcp_port}, user={self.auth_username!r})"


class _Late(Exception):
    """The call's deadline passed before the command could be sent."""


class Bmc:
    """One node's BMC: chassis power over RMCP+, one session per call (module docstring)."""

    def __init__(
        self, target: BmcTarget, *, timeout: float = 10.0, try_timeout: float = 2.0
    ) -> None:
        self.target = target
        self.timeout = timeout
        """the most one call may take, session setup included"""
        self.try_timeout = min(try_timeout, timeout)
        """the most one request waits for its answer"""
        self._log: Any = get_logger(component="bmc", bmc=target.address)

    def __repr__(self) -> str:
        return f"Bmc({self.target!r})"

    async def power_state(self) -> PowerState:
        """The chassis power now (Get Chassis Status)."""
        on = await self._call("power state", lambda ipmi: ipmi.get_chassis_status().power_on)
        return PowerState.ON if on else PowerState.OFF

    async def power_off(self, *, graceful: bool) -> None:
        """Ask the OS to shut down (`graceful`: chassis control soft shutdown, ACPI), or cut
        the power (power down). The BMC's acceptance only: confirm with `power_state`."""
        if graceful:
            await self._control("graceful power off", "chassis_control_soft_shutdown")
        else:
            await self._control("power off", "chassis_control_power_down")

    async def power_on(self) -> None:
        """Power the chassis up (chassis control power up)."""
        await self._control("power on", "chassis_control_power_up")

    async def power_cycle(self) -> None:
        """Power the chassis down and up again (chassis control power cycle)."""
        await self._control("power cycle", "chassis_control_power_cycle")

    async def wait_power_state(
        self, want: PowerState, *, timeout: float, interval: float = 1.0
    ) -> PowerState:
        """Read the chassis power every `interval` until it is `want` or `timeout` has
        passed; returns the last state read (compare it with `want`)."""
        deadline = time.monotonic() + timeout
        while True:
            state = await self.power_state()
            left = deadline - time.monotonic()
            if state == want or left <= 0:
                return state
            await asyncio.sleep(min(interval, left))

    # -- calls ----------------------------------------------------------------------------

    async def _control(self, what: str, method: str) -> None:
        self._log.info("bmc.power", action=what)
        await self._call(what, lambda ipmi: getattr(ipmi, method)(), command=True)

    async def _call(self, what: str, op: Callable[[Any], _T], *, command: bool = False) -> _T:
        deadline = time.monotonic() + self.timeout
        try:
            return await within(
                asyncio.to_thread(self._session_call, what, op, deadline, command),
                self.timeout,
            )
        except TimeoutError:
            raise self._error(
                what, BmcFailure.UNREACHABLE, f"no answer within {self.timeout:g}s"
            ) from None

    def _session_call(
        self, what: str, op: Callable[[Any], _T], deadline: float, command: bool
    ) -> _T:
        """In a thread: open a session, run `op`, close the session; failures -> BmcError."""
        t = self.target
        stage = "session"
        try:
            intf = RmcpPlus(keep_alive_interval=0, max_retries=0, cipher_suite=t.cipher_suite)
        except NotSupportedError as e:
            raise self._error(what, BmcFailure.PROTOCOL, str(e)) from None
        session = _Session()
        session.set_session_type_rmcp(t.host, t.port)
        session.set_auth_type_user(t.username, t.password.get_secret_value())
        session.set_priv_level(t.privilege)
        ipmi = pyipmi.Ipmi(
            interface=intf, session=session, target=pyipmi.Target(ipmb_address=BMC_ADDRESS)
        )
        try:
            intf.open()
            intf.set_timeout(self._wait_s(deadline))
            session.establish()
            try:
                stage = "command"
                if command and deadline - time.monotonic() < self.try_timeout / 4:
                    raise _Late  # its answer could not come back in time: do not act late
                intf.set_timeout(self._wait_s(deadline))
                return op(ipmi)
            finally:
                self._close(session, intf, what)
        except _Late:
            raise self._error(
                what,
                BmcFailure.UNREACHABLE,
                f"the session took most of {self.timeout:g}s; not sent",
            ) from None
        except Exception as e:  # noqa: BLE001  # every python-ipmi failure becomes a BmcError
            raise self._classify(what, stage, e) from None
        finally:
            intf.close()

    def _close(self, session: Any, intf: Any, what: str) -> None:
        """Close the session, briefly: a BMC drops an idle session by itself anyway."""
        if not session.activated:
            return
        intf.set_timeout(min(self.try_timeout, 1.0))
        try:
            session.close()
        except Exception:  # noqa: BLE001
            self._log.debug("bmc.close_failed", action=what)

    def _wait_s(self, deadline: float) -> float:
        return max(0.05, min(self.try_timeout, deadline - time.monotonic()))

    def _classify(self, what: str, stage: str, e: Exception) -> BmcError:
        """The BmcError for what python-ipmi (or the socket) raised in `stage`."""
        if isinstance(e, AuthenticationError | IpmiLongPasswordError):
            return self._error(what, BmcFailure.CREDENTIALS, f"user {self.target.username!r}: {e}")
        if isinstance(e, MessageStatusCodeError):
            said = f"{e.msc_desc} (RMCP+ status 0x{e.msc:02x})"
            if e.msc in _CREDENTIALS_REFUSED:
                return self._error(
                    what, BmcFailure.CREDENTIALS, f"user {self.target.username!r}: {said}"
                )
            return self._error(what, BmcFailure.REFUSED, f"session refused: {said}")
        if isinstance(e, CompletionCodeError):
            said = f"completion code 0x{e.cc:02x} ({e.cc_desc})"
            if stage == "session":
                return self._error(
                    what,
                    BmcFailure.REFUSED,
                    f"session at privilege {self.target.privilege}: {said}",
                )
            return self._error(what, BmcFailure.REFUSED, said)
        if isinstance(e, IpmiConnectionError):
            if "refused" in str(e):
                detail = "connection refused (nothing answers on that UDP port)"
            else:
                detail = f"no answer to the RMCP ping within {self.try_timeout:g}s"
            return self._error(what, BmcFailure.UNREACHABLE, detail)
        if isinstance(e, RetryError | TimeoutError):
            return self._error(
                what,
                BmcFailure.UNREACHABLE,
                f"no answer during the {stage} within {self.try_timeout:g}s",
            )
        if isinstance(e, ConnectionRefusedError):
            return self._error(what, BmcFailure.UNREACHABLE, "connection refused")
        if isinstance(e, socket.gaierror):
            return self._error(
                what, BmcFailure.UNREACHABLE, f"cannot resolve {self.target.host!r}: {e}"
            )
        if isinstance(e, OSError):
            return self._error(what, BmcFailure.UNREACHABLE, e.strerror or str(e))
        return self._error(what, BmcFailure.PROTOCOL, f"{type(e).__name__}: {e}")

    def _error(self, what: str, kind: BmcFailure, detail: str) -> BmcError:
        """The details are python-ipmi's fixed texts, codes, the user and the address."""
        return BmcError(self.target.address, what, kind, detail)


# -- where a node's BMC is and how to log in --------------------------------------------------


def parse_bmc_address(value: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` (a bare IPv6 address has no port) ->
    (host, port); the port defaults to 623."""
    text = value.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1 :] and not text[end + 1 :].startswith(":")):
            raise BmcConfigError(f"BMC address {value!r} is not host[:port]")
        host, port_text = text[1:end], text[end + 2 :]
        if text[end + 1 :] == ":":
            raise BmcConfigError(f"BMC address {value!r} has an empty port")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        if not port_text:
            raise BmcConfigError(f"BMC address {value!r} has an empty port")
    if not host or any(c.isspace() for c in host):
        raise BmcConfigError(f"BMC address {value!r} has no host")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BmcConfigError(f"BMC address {value!r}: port {port_text!r} is not 1..65535")
    return host, int(port_text)


def bmc_address(annotations: Mapping[str, str] | None, node: str) -> tuple[str, int]:
    """The node's BMC (host, port) from its `nodeward.io/bmc-address` annotation."""
    value = (annotations or {}).get(BMC_ADDRESS_ANNOTATION)
    if value is None or not value.strip():
        raise BmcConfigError(f"node {node} has no {BMC_ADDRESS_ANNOTATION} annotation")
    try:
        return parse_bmc_address(value)
    except BmcConfigError as e:
        raise BmcConfigError(f"node {node}: {e}") from None


def _decoded(data: Mapping[str, str], key: str, node: str) -> str:
    try:
        text = base64.b64decode(data[key], validate=True).decode()
    except (binascii.Error, ValueError, TypeError):
        raise BmcConfigError(
            f"node {node}: BMC secret key {key!r} is not base64-encoded UTF-8"
        ) from None
    return text.removesuffix("\n").removesuffix("\r")  # `echo pw | base64` adds one


def bmc_credentials(data: Mapping[str, str] | None, node: str) -> tuple[str, SecretStr]:
    """A node's BMC (user, password) from a Secret's `data` (base64 values, as the API
    serves them): `<node>.username` and `<node>.password` when the Secret has either, else
    `username` and `password` for every node. A trailing newline in a value is dropped."""
    data = data or {}
    own = (f"{node}.username", f"{node}.password")
    keys = own if any(k in data for k in own) else ("username", "password")
    missing = [k for k in keys if k not in data]
    if missing:
        where = "for this node" if keys == own else "shared, nor per node"
        raise BmcConfigError(
            f"node {node}: the BMC secret lacks {' and '.join(map(repr, missing))} ({where})"
        )
    user, password = (_decoded(data, k, node) for k in keys)
    if not user or not password:
        empty = keys[0] if not user else keys[1]
        raise BmcConfigError(f"node {node}: BMC secret key {empty!r} is empty")
    return user, SecretStr(password)


def bmc_target(
    node: str,
    annotations: Mapping[str, str] | None,
    secret_data: Mapping[str, str] | None,
    **options: Any,
) -> BmcTarget:
    """The node's `BmcTarget` from its annotations and the BMC Secret's `data`; `options`:
    the target's other fields (privilege, cipher_suite)."""
    host, port = bmc_address(annotations, node)
    user, password = bmc_credentials(secret_data, node)
    try:
        return BmcTarget(host=host, port=port, username=user, password=password, **options)
    except ValueError as e:  # pydantic's ValidationError: the fields and why, never the secret
        errors = getattr(e, "errors", None)
        why = (
            "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in errors())
            if callable(errors)
            else str(e)
        )
        raise BmcConfigError(f"node {node}: BMC target: {why}") from None
