"""The CLI as a person uses it: real processes, real nats-server, one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

NODEWARD = [sys.executable, "-m", "launch"]


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NODEWARD, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | (env or {}),
        cwd=REPO,
    )


class Output:
    """A child process's stdout and stderr lines, read as they come (threads)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s or []), daemon=True)
            for stream, lines in ((proc.stdout, self.out), (proc.stderr, self.err))
        ]
        for reader in self.readers:
            reader.start()

    def join(self, timeout: float) -> None:
        """Wait for the rest of the output once the process has ended."""
        for reader in self.readers:
            reader.join(timeout=timeout)


def spawn(
    *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """`nodeward ARGS` started in `cwd`, its output piped as text."""
    return subprocess.Popen(
        [*NODEWARD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )


def wait_until(condition, timeout: float = 20.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def embedded_bus(tmp_path: Path) -> Iterator[str]:
    """`nodeward bus --port 0` as a user runs it; yields the URL it prints."""
    proc = spawn("bus", "--state-dir", str(tmp_path / "state"), "--port", "0")
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("nats://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
    yield url
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0


def test_example_published_shows_up_in_tail_with_the_same_id(embedded_bus: str) -> None:
    env = {"NODEWARD_NATS_URL": embedded_bus}
    example = run("schemas", "example", "gpu.health.v1")
    assert example.returncode == 0, example.stderr
    sent = json.loads(example.stdout)
    published = run("publish", "gpu.health.v1", "--data", "@-", stdin=example.stdout, env=env)
    assert published.returncode == 0, published.stderr
    assert sent["id"] in published.stdout

    tail = run("tail", "gpu.health.>", "--since", "1m", "--count", "1", "--json", env=env)
    assert tail.returncode == 0, tail.stderr
    got = json.loads(tail.stdout.splitlines()[0])
    assert got["id"] == sent["id"]
    assert got["type"] == "gpu.health.v1"
    assert got["data"] == sent["data"]

    # The same event again is stored once (JetStream de-duplication by id).
    again = run("publish", "gpu.health.v1", "--data", "@-", "--json", stdin=example.stdout, env=env)
    assert json.loads(again.stdout)["duplicate"] is True
    streams = run("streams", "--json", env=env)
    gpu = next(s for s in json.loads(streams.stdout) if s["stream"] == "GPU")
    assert gpu["messages"] == 1


def test_every_command_that_talks_to_a_platform_finds_it_by_state_dir(
    embedded_bus: str, tmp_path: Path
) -> None:
    """`--state-dir` of a running `nodeward up` (its endpoints.json) is all they need."""
    from nodeward.endpoints import Endpoints

    state = tmp_path / "elsewhere"
    state.mkdir()
    Endpoints(nats_url=embedded_bus, state_dir=state).write()  # this process stands for `up`
    where = ["--state-dir", str(state)]
    example = run("schemas", "example", "gpu.health.v1")
    published = run("publish", "gpu.health.v1", "--data", "@-", *where, stdin=example.stdout)
    assert published.returncode == 0, published.stderr
    tail = run("tail", "gpu.health.>", "--since", "1m", "--count", "1", "--json", *where)
    assert tail.returncode == 0, tail.stderr
    assert json.loads(tail.stdout.splitlines()[0])["id"] == json.loads(example.stdout)["id"]
    streams = run("streams", *where)
    assert streams.returncode == 0, streams.stderr
    header = next(line for line in streams.stdout.splitlines() if "redelivered" in line)
    # Piped, the table is whole: no header cut at 80 columns.
    assert all(h in header for h in ("stream", "messages", "consumer", "unacked", "redelivered"))
    # No GPU agent answers on this bare bus; the flag itself is accepted.
    inject = run("sim", "inject", "--node", "gpu-x", "--xid", "79", "--timeout", "0.5", *where)
    assert "No such option" not in inject.stderr
    assert inject.returncode == 1 and len(inject.stderr.strip().splitlines()) == 1, inject.stderr


def test_invalid_data_is_refused_with_one_line(embedded_bus: str) -> None:
    result = run(
        "publish",
        "gpu.health.v1",
        "--data",
        '{"node": "n1", "state": "on-fire"}',
        env={"NODEWARD_NATS_URL": embedded_bus},
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("nodeward: error: invalid gpu.health.v1 data:")
    assert "gpu_index: Field required" in lines[0]


@pytest.mark.parametrize("bad", ["gpu-*", ">", "a b"])
def test_names_that_are_not_kubernetes_names_are_refused(embedded_bus: str, bad: str) -> None:
    data = json.loads(run("schemas", "example", "gpu.health.v1").stdout)["data"] | {"node": bad}
    result = run(
        "publish",
        "gpu.health.v1",
        "--data",
        json.dumps(data),
        "--json",
        env={"NODEWARD_NATS_URL": embedded_bus},
    )
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nodeward: error: invalid gpu.health.v1 data: node:")
    assert "RFC 1123" in lines[0]


def test_oversized_event_is_refused_at_once_with_one_line(
    embedded_bus: str, tmp_path: Path
) -> None:
    """A 2 MB event: "maximum payload exceeded" is not retried; one line, exit 1."""
    data = json.loads(run("schemas", "example", "gpu.health.v1").stdout)["data"]
    big = tmp_path / "big.json"
    big.write_text(json.dumps(data | {"gpu_uuid": "x" * 2_000_000}))
    began = time.monotonic()
    result = run(
        "publish", "gpu.health.v1", "--data", f"@{big}", env={"NODEWARD_NATS_URL": embedded_bus}
    )
    elapsed = time.monotonic() - began
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nodeward: error: not published:")
    assert "maximum payload exceeded" in lines[0]
    assert elapsed < 10  # the process's start-up; no retries with back-off


def test_unknown_fields_are_refused(embedded_bus: str) -> None:
    data = json.loads(run("schemas", "example", "notify.v1").stdout)["data"] | {
        "sevrity": "critical"
    }
    result = run(
        "publish", "notify.v1", "--data", json.dumps(data), env={"NODEWARD_NATS_URL": embedded_bus}
    )
    assert result.returncode == 1
    assert "unknown field(s) for notify.v1: sevrity" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["publish"], 2, "Missing argument 'TYPE'"),
        (["publish", "gpu.health.v1", "--data", "{nope"], 1, "--data is not valid JSON"),
        (["publish", "no.such.v1", "--data", "{}"], 1, "unknown event type 'no.such.v1'"),
        (
            ["publish", "gpu.health.v1", "--data", "@/nonexistent/file.json"],
            1,
            "cannot read /nonexistent/file.json",
        ),
        (["tail", "--since", "5 fortnights"], 2, "Invalid value for --since: not a duration"),
        (["status", "--agent-timeout", "5x"], 2, "Invalid value for --agent-timeout"),
        (
            ["sim", "inject", "--node", "gpu-h100-01"],
            2,
            "give exactly one of --xid, --fault, --recover, --load or --hang",
        ),
        (["sim", "inject", "--hang"], 2, "--hang takes --node (and no --scenario)"),
        (
            ["sim", "inject", "--node", "n", "--hang", "--xid", "79"],
            2,
            "--hang hangs the whole node: no --gpu, --xid, --fault, --recover or --load",
        ),
        (
            ["sim", "inject", "--node", "gpu-h100-01", "--recover", "--via", "kmsg"],
            2,
            "--via and --driver go with --xid only",
        ),
        (["sim", "inject", "--node", "n", "--load", "150"], 2, "--load: Input should be less"),
        (["sim", "inject", "--node", "n", "--fault", "melt"], 2, "unknown fault 'melt'"),
        (["sim", "inject", "--xid", "79"], 2, "give --node (or --scenario)"),
        (["tail", "bogus.subject"], 1, "no nodeward stream holds subject 'bogus.subject'"),
        (["schemas", "example", "gpu.health.v9"], 1, "unknown event type 'gpu.health.v9'"),
        (["frobnicate"], 2, "No such command 'frobnicate'"),
    ],
)
def test_bad_arguments_give_one_clear_line(args: list[str], code: int, message: str) -> None:
    result = run(*args, env={"NODEWARD_NATS_URL": "nats://127.0.0.1:1"})
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]


def test_unreachable_nats_is_one_line() -> None:
    data = json.loads(run("schemas", "example", "gpu.health.v1").stdout)["data"]
    result = run(
        "publish",
        "gpu.health.v1",
        "--data",
        json.dumps(data),
        env={"NODEWARD_NATS_URL": "nats://127.0.0.1:1"},
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("nodeward: error: cannot connect to NATS at nats://127.0.0.1:1")
    )


def test_bad_config_file_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "nodeward.yaml"
    cfg.write_text("bus:\n  url: 42\n  frobs: true\n")
    result = run("streams", "--config", str(cfg))
    assert result.returncode == 1
    assert result.stderr.startswith("nodeward: error: invalid configuration in")
    assert len(result.stderr.strip().splitlines()) == 1


def test_up_runs_the_platform_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / ".nodeward"  # the default state dir, relative to where it runs
    proc = spawn("up", "--state-dir", str(state), "--scenario", "none")
    try:
        endpoints_file = state / "endpoints.json"
        wait_until(endpoints_file.exists, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        assert endpoints["nats_url"].startswith("nats://127.0.0.1:")
        assert Path(endpoints["outbox"]).is_dir()
        ready = httpx.get(endpoints["metrics"]["platform"] + "/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        metrics = httpx.get(endpoints["metrics"]["platform"] + "/metrics", timeout=5).text
        assert "nodeward_bus_connected 1.0" in metrics
        # The sim cluster runs, and its kubeconfig works with kubectl.
        assert endpoints["kube_api"].startswith("https://127.0.0.1:")
        assert Path(endpoints["kubeconfig"]) == state / "kubeconfig"
        if shutil.which("kubectl"):
            nodes = subprocess.run(
                ["kubectl", "--kubeconfig", endpoints["kubeconfig"], "get", "nodes", "-o", "name"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert nodes.returncode == 0, nodes.stderr
            assert len(nodes.stdout.split()) == 11  # with the AMD and the DRA nodes
        # A second `up` on the same state dir is refused.
        second = run("up", "--state-dir", str(state))
        assert second.returncode == 1 and "already running" in second.stderr
        # Other commands find the running platform through endpoints.json.
        streams = subprocess.run(
            [*NODEWARD, "streams", "--json"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
            | {"PYTHONPATH": str(REPO)},
            timeout=30,
        )
        assert streams.returncode == 0, streams.stderr
        assert {s["stream"] for s in json.loads(streams.stdout)} >= {"GPU", "AUDIT", "DLQ"}
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert not (state / "endpoints.json").exists()
    # Quietly: services stop before NATS, so no hook times out and no client loses its server
    # (it printed 13 JSON lines: `shutdown hook timed out`, `nats: unexpected EOF`, `Connect
    # call failed`). Warnings a loaded machine may bring while it runs are not the stop's.
    said = out + err
    for symptom in ("shutdown hook timed out", "unexpected EOF", "Connect call failed"):
        assert symptom not in said, [line for line in said.splitlines() if symptom in line][:3]
    assert "Traceback" not in err


async def _inject(url: str, node: str, request: dict[str, object]) -> dict[str, object]:
    import nats

    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"sim.inject.{node}", json.dumps(request).encode(), timeout=5)
        reply: dict[str, object] = json.loads(msg.data)
        return reply
    finally:
        await nc.close()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_injected_xid_quarantines_the_node_within_two_seconds(tmp_path: Path) -> None:
    """The whole path through `nodeward up`: sim GPU agent → bus → cordon → sim cluster."""
    proc = spawn(
        "up", "--scenario", "none", cwd=tmp_path, env=os.environ | {"PYTHONPATH": str(REPO)}
    )
    try:
        endpoints_file = tmp_path / ".nodeward" / "endpoints.json"
        wait_until(endpoints_file.exists, timeout=30, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        wait_until(
            lambda: all(
                httpx.get(u + "/readyz", timeout=5).status_code == 200
                for u in endpoints["metrics"].values()
            ),
            timeout=30,
            what="every daemon ready",
        )
        # The injection as `nodeward sim inject` sends it, from a client already connected:
        # the two seconds are the platform's, not a Python interpreter's start-up.
        started = time.monotonic()
        reply = asyncio.run(_inject(endpoints["nats_url"], "gpu-h100-03", {"gpu": 0, "xid": 79}))
        assert reply["ok"] is True, reply

        def quarantined(name: str = "gpu-h100-03") -> bool:
            got = subprocess.run(
                [
                    "kubectl",
                    "--kubeconfig",
                    endpoints["kubeconfig"],
                    "get",
                    "node",
                    name,
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            node = json.loads(got.stdout)
            taints = {t["key"] for t in node["spec"].get("taints", [])}
            return bool(node["spec"].get("unschedulable")) and "nodeward.io/gpu-unhealthy" in taints

        wait_until(quarantined, timeout=20, what="taint and cordon in the API")
        print(f"taint and cordon seen by kubectl after {time.monotonic() - started:.2f}s")
        other = subprocess.run(
            [
                "kubectl",
                "--kubeconfig",
                endpoints["kubeconfig"],
                "get",
                "node",
                "gpu-h100-04",
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert not json.loads(other.stdout)["spec"].get("unschedulable")  # only the sick node
        # The second detector: an XID the driver logs in the kernel log only (NVML silent).
        reply = asyncio.run(
            _inject(endpoints["nats_url"], "gpu-a100-01", {"gpu": 2, "xid": 79, "via": "kmsg"})
        )
        assert reply["ok"] is True and reply["applied"] == "XID 79 via kmsg", reply
        wait_until(lambda: quarantined("gpu-a100-01"), timeout=5, what="kmsg XID: taint and cordon")
        # The notifier leaves on-call's notice in the outbox (its group waits 10 s).
        outbox = Path(endpoints["outbox"])
        wait_until(
            lambda: any("gpu-h100-03" in p.read_text() for p in outbox.glob("*.txt")),
            timeout=30,
            what="the quarantine notice in the outbox",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def test_service_reset_breaker_and_unknown_names(embedded_bus: str) -> None:
    env = {"NODEWARD_NATS_URL": embedded_bus}
    reset = run("service", "cordon", "--reset-breaker", env=env)
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith("cordon: circuit breaker reset")
    unknown = run("service", "nope", env=env)
    assert unknown.returncode == 1
    assert (
        unknown.stderr.strip()
        == "nodeward: error: no service named 'nope' (known: accounting, admission, capacity, checkpoint, console, cordon, credentials, culler, directory, falco, notifier, recovery)"
    )
    assert (
        run("agent", "nope", env=env).stderr.strip()
        == "nodeward: error: no agent named 'nope' (known: energy, gpu, idle)"
    )


def test_service_runs_alone_and_becomes_ready(embedded_bus: str, tmp_path: Path) -> None:
    """`nodeward service cordon` as its Deployment runs it, with its own kubeconfig context."""
    sim = spawn("sim", "cluster", "--kubeconfig", str(tmp_path / "kc"))
    cfg = tmp_path / "cordon.yaml"
    cfg.write_text("daemon:\n  port: 0\n")
    svc = None
    try:
        wait_until((tmp_path / "kc").exists, what="sim kubeconfig")
        svc = spawn(
            "--log-level",
            "info",
            "service",
            "cordon",
            "--kubeconfig",
            str(tmp_path / "kc"),
            "--config",
            str(cfg),
            env=os.environ
            | {"NODEWARD_NATS_URL": embedded_bus, "NODEWARD_CLUSTER__CONTEXT": "nodeward-cordon"},
        )
        assert svc.stderr is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = svc.stderr.readline()
            if "daemon started" in line:
                url = json.loads(line)["url"]
        assert url, "the service never said where it listens"
        wait_until(
            lambda: httpx.get(url + "/readyz", timeout=5).status_code == 200, what="cordon ready"
        )
    finally:
        for p in (svc, sim):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=30) == 0


def test_service_with_its_port_in_use_says_so_in_one_line(
    embedded_bus: str, tmp_path: Path
) -> None:
    sim = spawn("sim", "cluster", "--kubeconfig", str(tmp_path / "kc"))
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        wait_until((tmp_path / "kc").exists, what="sim kubeconfig")
        env = {
            "NODEWARD_NATS_URL": embedded_bus,
            "NODEWARD_CLUSTER__CONTEXT": "nodeward-cordon",
            "NODEWARD_DAEMON__HOST": "127.0.0.1",
            "NODEWARD_DAEMON__PORT": str(port),
        }
        args = ["service", "cordon", "--kubeconfig", str(tmp_path / "kc")]
        result = run(*args, env=env, timeout=60)
        assert result.returncode == 1
        errors = [ln for ln in result.stderr.splitlines() if "error" in ln.lower()]
        assert "Traceback" not in result.stderr, result.stderr
        assert errors[-1].startswith("nodeward: error: cordon: cannot listen on 127.0.0.1:")
        assert "in use" in errors[-1]
    finally:
        taken.close()
        sim.send_signal(signal.SIGTERM)
        assert sim.wait(timeout=30) == 0


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_up_plays_a_scenario(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text("- {after: 0s, node: gpu-a100-02, gpu: 1, xid: 79}\n")
    bad = run(
        "up", "--scenario", str(tmp_path / "missing.yaml"), "--state-dir", str(tmp_path / "s")
    )
    assert bad.returncode == 1 and "cannot read scenario" in bad.stderr
    proc = spawn(
        "up",
        "--scenario",
        "scenario.yaml",
        "--quiet",
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    try:
        kubeconfig = tmp_path / ".nodeward" / "kubeconfig"
        wait_until((tmp_path / ".nodeward" / "endpoints.json").exists, timeout=30, what="up")

        def cordoned() -> bool:
            got = subprocess.run(
                [
                    "kubectl",
                    "--kubeconfig",
                    str(kubeconfig),
                    "get",
                    "node",
                    "gpu-a100-02",
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return got.returncode == 0 and bool(json.loads(got.stdout)["spec"].get("unschedulable"))

        wait_until(cordoned, timeout=20, what="the scenario's XID to quarantine gpu-a100-02")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
    assert "DECISION " not in out  # --quiet: no story


def test_tail_filters_by_node_and_severity(embedded_bus: str) -> None:
    env = {"NODEWARD_NATS_URL": embedded_bus}
    base = json.loads(run("schemas", "example", "gpu.health.v1").stdout)["data"]
    for node, state in (("node-a", "healthy"), ("node-b", "failed"), ("node-a", "degraded")):
        data = base | {"node": node, "state": state}
        assert run("publish", "gpu.health.v1", "--data", json.dumps(data), env=env).returncode == 0
    by_node = run(
        "tail",
        "gpu.health.>",
        "--since",
        "1m",
        "--node",
        "node-b",
        "--count",
        "1",
        "--json",
        env=env,
    )
    assert json.loads(by_node.stdout)["data"]["node"] == "node-b"
    warned = run(
        "tail", "--since", "1m", "--severity", "warning", "--count", "2", "--json", env=env
    )
    assert [json.loads(line)["data"]["state"] for line in warned.stdout.splitlines()] == [
        "failed",
        "degraded",
    ]
    readable = run(
        "tail", "gpu.health.>", "--since", "1m", "--count", "3", env=env
    ).stdout.splitlines()
    assert [line.split()[1] for line in readable] == ["INFO", "CRIT", "WARN"]
    bad = run("tail", "--severity", "loud", env=env)
    assert bad.returncode == 2 and "--severity" in bad.stderr
