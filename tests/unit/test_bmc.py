"""The pure parts of the BMC power port (`nodeward.bmc`): where a node's BMC is, its
credentials from a Secret, how failures read; and of the simulated node a BMC powers
(`launch.sim_node`): the VM serial codec and what it posts."""

from __future__ import annotations

import base64
import socket
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import SecretStr
from pyipmi.errors import (
    AuthenticationError,
    CompletionCodeError,
    DecodingError,
    IpmiConnectionError,
    IpmiLongPasswordError,
    MessageStatusCodeError,
    RetryError,
)

from launch.sim_node import (
    GRACEFUL_SHUTDOWN,
    VmDecoder,
    lease_manifest,
    micro_time,
    parse_hostport,
    ready_condition,
)
from nodeward.bmc import (
    BMC_ADDRESS_ANNOTATION,
    Bmc,
    BmcConfigError,
    BmcError,
    BmcFailure,
    BmcTarget,
    bmc_address,
    bmc_credentials,
    bmc_target,
    parse_bmc_address,
)

SECRET = "Tr0ub4dor&3-pw"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- addresses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.5", ("10.0.0.5", 623)),
        ("10.0.0.5:6230", ("10.0.0.5", 6230)),
        (" bmc-n1.example.com:623 ", ("bmc-n1.example.com", 623)),
        ("[fd00::5]:624", ("fd00::5", 624)),
        ("[fd00::5]", ("fd00::5", 623)),
        ("fd00::5", ("fd00::5", 623)),
    ],
)
def test_bmc_addresses_parse(value: str, expected: tuple[str, int]) -> None:
    assert parse_bmc_address(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", " has no host"),
        (":623", " has no host"),
        ("host:", " has an empty port"),
        ("host:0", ": port '0' is not 1..65535"),
        ("host:70000", ": port '70000' is not 1..65535"),
        ("host:ipmi", ": port 'ipmi' is not 1..65535"),
        ("[fd00::5", " is not host[:port]"),
        ("[fd00::5]x", " is not host[:port]"),
        ("[fd00::5]:", " has an empty port"),
        ("bad host:623", " has no host"),
    ],
)
def test_bad_bmc_addresses_say_why(value: str, why: str) -> None:
    with pytest.raises(BmcConfigError) as caught:
        parse_bmc_address(value)
    assert str(caught.value) == f"BMC address {value!r}{why}"


def test_the_address_comes_from_the_node_annotation() -> None:
    assert bmc_address({BMC_ADDRESS_ANNOTATION: "10.1.2.3:6230"}, "n1") == ("10.1.2.3", 6230)
    with pytest.raises(BmcConfigError, match=r"^node n1 has no nodeward.io/bmc-address"):
        bmc_address({}, "n1")
    with pytest.raises(BmcConfigError, match=r"^node n1 has no"):
        bmc_address(None, "n1")
    with pytest.raises(BmcConfigError, match=r"^node n1: BMC address 'h:x'"):
        bmc_address({BMC_ADDRESS_ANNOTATION: "h:x"}, "n1")


# -- credentials ------------------------------------------------------------------------------


def test_a_node_s_own_keys_win_over_the_shared_ones() -> None:
    data = {
        "username": b64("shared"),
        "password": b64("shared-pw"),
        "gpu-01.username": b64("own"),
        "gpu-01.password": b64(SECRET),
    }
    user, password = bmc_credentials(data, "gpu-01")
    assert (user, password.get_secret_value()) == ("own", SECRET)
    user, password = bmc_credentials(data, "gpu-02")
    assert (user, password.get_secret_value()) == ("shared", "shared-pw")


def test_a_trailing_newline_is_dropped() -> None:
    data = {"username": b64("admin\n"), "password": b64(SECRET + "\r\n")}
    user, password = bmc_credentials(data, "n")
    assert (user, password.get_secret_value()) == ("admin", SECRET)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"gpu-01.username": b64("own"), "password": b64(SECRET)},
            "node gpu-01: the BMC secret lacks 'gpu-01.password' (for this node)",
        ),
        (
            {"username": b64("u")},
            "node gpu-01: the BMC secret lacks 'password' (shared, nor per node)",
        ),
        (
            {},
            "node gpu-01: the BMC secret lacks 'username' and 'password' (shared, nor per node)",
        ),
        (
            {"username": b64("u"), "password": SECRET},
            "node gpu-01: BMC secret key 'password' is not base64-encoded UTF-8",
        ),
        (
            {"username": b64("u"), "password": base64.b64encode(b"\xff\xfe").decode()},
            "node gpu-01: BMC secret key 'password' is not base64-encoded UTF-8",
        ),
        (
            {"username": b64(""), "password": b64(SECRET)},
            "node gpu-01: BMC secret key 'username' is empty",
        ),
    ],
)
def test_missing_or_bad_credentials_say_which_key(data: dict[str, str], message: str) -> None:
    with pytest.raises(BmcConfigError) as caught:
        bmc_credentials(data, "gpu-01")
    assert str(caught.value) == message
    assert SECRET not in repr(caught.value)


def test_a_target_from_the_node_and_the_secret() -> None:
    annotations = {BMC_ADDRESS_ANNOTATION: "[fd00::7]:6230"}
    target = bmc_target("n", annotations, {"username": b64("op"), "password": b64(SECRET)})
    assert (target.host, target.port, target.username) == ("fd00::7", 6230, "op")
    assert target.password.get_secret_value() == SECRET
    assert target.address == "[fd00::7]:6230"
    assert target.privilege == "operator"
    for shown in (repr(target), str(target), target.model_dump_json(), repr(target.model_dump())):
        assert SECRET not in shown


def test_a_password_too_long_for_ipmi_is_a_config_error_without_it() -> None:
    long = "p" * 21
    with pytest.raises(BmcConfigError) as caught:
        bmc_target(
            "n", {BMC_ADDRESS_ANNOTATION: "h"}, {"username": b64("u"), "password": b64(long)}
        )
    assert (
        str(caught.value)
        == "node n: BMC target: password: Value error, an IPMI v2.0 password has at most 20 bytes"
    )
    assert long not in repr(caught.value)


# -- failures ---------------------------------------------------------------------------------


def _bmc() -> Bmc:
    return Bmc(BmcTarget(host="10.0.0.9", username="op", password=SecretStr(SECRET)))


@pytest.mark.parametrize(
    ("stage", "error", "kind", "text"),
    [
        (
            "session",
            AuthenticationError("RAKP message 2: invalid key exchange authentication code"),
            "credentials",
            "wrong credentials: user 'op': RAKP message 2: invalid key exchange authentication code",
        ),
        (
            "session",
            IpmiLongPasswordError("password longer than 20 bytes"),
            "credentials",
            "wrong credentials: user 'op': password longer than 20 bytes",
        ),
        (
            "session",
            MessageStatusCodeError(0x0D),
            "credentials",
            "wrong credentials: user 'op': Unauthorized name (RMCP+ status 0x0d)",
        ),
        (
            "session",
            MessageStatusCodeError(0x0F),
            "credentials",
            "wrong credentials: user 'op': Invalid integrity check value (RMCP+ status 0x0f)",
        ),
        (
            "session",
            MessageStatusCodeError(0x0A),
            "refused",
            "refused by the BMC: session refused: Unauthorized role or privilege level"
            " requested (RMCP+ status 0x0a)",
        ),
        (
            "session",
            CompletionCodeError(0xD4),
            "refused",
            "refused by the BMC: session at privilege operator: completion code 0xd4"
            " (Cannot execute command due to insufficient privilege level)",
        ),
        (
            "command",
            CompletionCodeError(0xCC),
            "refused",
            "refused by the BMC: completion code 0xcc (Invalid data field in Request)",
        ),
        (
            "session",
            IpmiConnectionError("no response to RMCP ping from 10.0.0.9:623, check host"),
            "unreachable",
            "unreachable: no answer to the RMCP ping within 2s",
        ),
        (
            "session",
            IpmiConnectionError("connection to 10.0.0.9:623 refused, is the BMC listening?"),
            "unreachable",
            "unreachable: connection refused (nothing answers on that UDP port)",
        ),
        (
            "command",
            RetryError("Max retry"),
            "unreachable",
            "unreachable: no answer during the command within 2s",
        ),
        (
            "session",
            TimeoutError(),
            "unreachable",
            "unreachable: no answer during the session within 2s",
        ),
        (
            "session",
            socket.gaierror(-2, "Name or service not known"),
            "unreachable",
            "unreachable: cannot resolve '10.0.0.9': [Errno -2] Name or service not known",
        ),
        (
            "command",
            DecodingError("short SDU"),
            "protocol",
            "bad answer: DecodingError: short SDU",
        ),
    ],
)
def test_failures_read_as_one_line_of_their_kind(
    stage: str, error: Exception, kind: str, text: str
) -> None:
    err = _bmc()._classify("power off", stage, error)
    assert err.kind == kind
    assert str(err) == f"BMC 10.0.0.9:623: power off: {text}"
    assert SECRET not in repr(err)


def test_a_bmc_error_is_one_line() -> None:
    err = BmcError("h:623", "power on", BmcFailure.PROTOCOL, "first\nsecond\r\n  third")
    assert str(err) == "BMC h:623: power on: bad answer: first second third"


def test_a_bmc_s_repr_hides_the_password() -> None:
    assert SECRET not in repr(_bmc())


# -- the simulated node's machine -------------------------------------------------------------


def test_the_vm_decoder_finds_commands_across_reads_and_unescapes() -> None:
    decoder = VmDecoder()
    # what ipmi_sim sends on connect (version 1, no attention), an IPMI message, a graceful
    # shutdown split over two reads, and a command with an escaped byte (0xA0 as AA B0)
    assert decoder.feed(bytes([0xFF, 0x01, 0xA1, 0x00, 0xA1])) == [b"\xff\x01", b"\x00"]
    assert decoder.feed(bytes([0x05, 0x18, 0x01, 0x00, 0xA0, 0x09])) == []
    assert decoder.feed(bytes([0xA1, 0x42, 0xAA, 0xB0, 0xA1])) == [b"\x09", b"\x42\xa0"]
    assert decoder.feed(bytes([0x03, 0xAA, 0xA1, 0x03, 0xA1])) == [b"\x03"]  # ended in escape
    assert GRACEFUL_SHUTDOWN == "graceful-shutdown"


def test_ready_keeps_its_transition_time_only_while_it_stays_true() -> None:
    now = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)

    def node(status: str) -> dict[str, Any]:
        ready = {"type": "Ready", "status": status, "lastTransitionTime": "2026-11-30T09:00:00Z"}
        return {"status": {"conditions": [{"type": "DiskPressure", "status": "False"}, ready]}}

    assert ready_condition(node("True"), now) == {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-12-01T10:00:00Z",
        "lastTransitionTime": "2026-11-30T09:00:00Z",
    }
    assert ready_condition(node("Unknown"), now)["lastTransitionTime"] == "2026-12-01T10:00:00Z"
    assert ready_condition({}, now)["lastTransitionTime"] == "2026-12-01T10:00:00Z"


def test_the_lease_is_the_kubelet_s() -> None:
    now = datetime(2026, 12, 1, 10, 0, 0, 5, tzinfo=UTC)
    lease = lease_manifest("gpu-01", "uid-1", now)
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert lease["spec"] == {
        "holderIdentity": "gpu-01",
        "leaseDurationSeconds": 40,
        "renewTime": "2026-12-01T10:00:00.000005Z",
    }
    assert micro_time(now) == "2026-12-01T10:00:00.000005Z"
    assert "ownerReferences" not in lease_manifest("gpu-01", None, now)["metadata"]


def test_the_vm_address_parses() -> None:
    assert parse_hostport("127.0.0.1:9002") == ("127.0.0.1", 9002)
    assert parse_hostport("[::1]:9002") == ("::1", 9002)
