"""`nodeward up` survives its nats-server dying: SIGKILL the child, and within 15 s every
daemon is ready again, a new XID 79 is quarantined and the story tells it (the restart too).
And a daemon of `up` that dies is restarted with its component, on its port, and told; past
its limit `up` gives up on it, says so, and the rest keep running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nodeward.failpoints import FILE_ENV
from schemas.state.cordon import TAINT_KEY
from tests.e2e.platform import Up, ready, running_up
from tests.e2e.test_cli import NODEWARD, run, wait_until

pytestmark = pytest.mark.timeout(180)

NODE = "gpu-h100-02"


def _nats_pid(state: Path) -> int | None:
    """The nats-server child's pid, from the ports file it writes (one per running server)."""
    files = sorted((state / "nats" / "ports").glob("*.ports"))
    return int(files[0].stem.rsplit("_", 1)[1]) if files else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); /proc tells a reaped-or-defunct child apart.
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _tainted(state: Path, node: str) -> bool:
    got = subprocess.run(
        ["kubectl", "--kubeconfig", str(state / "kubeconfig"), "get", "node", node, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if got.returncode != 0:
        return False
    taints = json.loads(got.stdout).get("spec", {}).get("taints") or []
    return any(t.get("key") == TAINT_KEY for t in taints)


def _quarantined_and_told(up: Up, node: str) -> None:
    """A new XID 79 on `node` GPU 0 taints the node, and the story tells it."""
    told = len(up.output.out)
    injected = run(
        "sim",
        "inject",
        "--state-dir",
        str(up.state),
        "--node",
        node,
        "--gpu",
        "0",
        "--xid",
        "79",
        env={"NODEWARD_NATS_URL": ""},
    )
    assert injected.returncode == 0, injected.stderr
    wait_until(lambda: _tainted(up.state, node), timeout=30, what=f"{node} tainted")

    def story_tells_it() -> bool:
        new = up.output.out[told:]
        return any(line.startswith("GPU ") and f"{node} GPU 0" in line for line in new) and any(
            line.startswith("CORDON ") and node in line for line in new
        )

    wait_until(story_tells_it, timeout=30, what=f"the story to tell it: {up.output.out[told:]}")


def _told(up: Up, since: int, text: str) -> bool:
    """The story printed a RESTART line containing `text` after its line `since`."""
    return any("RESTART" in line and text in line for line in up.output.out[since:])


def _readiness(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_up_restarts_a_killed_nats_server_and_everything_recovers(tmp_path: Path) -> None:
    with running_up(tmp_path, "--nodes", "3", "--scenario", "none", timeout=60) as up:
        state, output = up.state, up.output
        nats_url = up.endpoints["nats_url"]
        pid = _nats_pid(state)
        assert pid is not None and _alive(pid)

        told = len(output.out)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not _alive(pid), timeout=5, what="the nats-server to die")

        def restarted() -> bool:
            new = _nats_pid(state)
            return new is not None and new != pid and _alive(new)

        wait_until(restarted, timeout=15, what="a new nats-server")
        # Same port: the URL every client (and endpoints.json) knows.
        assert json.loads((state / "endpoints.json").read_text())["nats_url"] == nats_url
        wait_until(
            lambda: not up.unready(),
            timeout=max(0.0, 15 - (time.monotonic() - killed)),
            what=f"every /readyz within 15 s: {up.unready()}",
        )
        assert sum("nats_server.restarted" in line for line in output.err) == 1
        address = nats_url.removeprefix("nats://")
        wait_until(
            lambda: _told(up, told, f"nats-server: exited (signal 9); back on {address} after "),
            timeout=15,
            what=f"the story to tell the restart: {output.out[told:]}",
        )
        _quarantined_and_told(up, NODE)


def test_up_restarts_a_dead_service_daemon_then_gives_up_on_it(tmp_path: Path) -> None:
    """The cordon service's reconcile task fails (a failpoint armed through a file): `up`
    restarts cordon on its port, tells it, and the new cordon quarantines. With a limit of
    one restart, its second death is the last: `up` gives up on cordon, says so on the
    story and in the platform daemon's readiness, and every other daemon keeps running."""
    armed = tmp_path / "failpoints"
    env = {FILE_ENV: str(armed), "NODEWARD_DAEMON__RESTART__LIMIT": "1"}
    args = ("--nodes", "3", "--scenario", "none")
    with running_up(tmp_path, *args, timeout=60, env=env) as up:
        cordon = up.daemons["cordon"]
        told = len(up.output.out)
        armed.write_text("cordon.reconcile=raise\n")
        began = time.monotonic()
        wait_until(lambda: not armed.exists(), timeout=10, what="the failpoint to fire")
        cause = "cordon: task reconcile failed: FailpointError: failpoint cordon.reconcile"
        wait_until(
            lambda: _told(up, told, f"{cause}; restarted (1st time in 10 min)"),
            timeout=15,
            what=f"the story to tell the restart: {up.output.out[told:]}",
        )
        wait_until(
            lambda: ready(cordon),
            timeout=max(0.0, 15 - (time.monotonic() - began)),
            what="cordon's /readyz within 15 s",
        )
        back = time.monotonic() - began
        assert up.reread()["metrics"]["cordon"] == cordon  # rebound on its port
        assert not up.unready()
        assert sum("up.restarted" in line for line in up.output.err) == 1
        _quarantined_and_told(up, NODE)
        print(f"cordon ready again {back:.1f} s after its failpoint was armed")

        told = len(up.output.out)
        armed.write_text("cordon.reconcile=raise\n")
        wait_until(
            lambda: _told(up, told, f"{cause}; gave up after 1 restart in 10 min"),
            timeout=15,
            what=f"the story to tell it gave up: {up.output.out[told:]}",
        )
        wait_until(lambda: "cordon" not in up.reread()["metrics"], timeout=5, what="endpoints")
        status, body = _readiness(up.daemons["platform"])
        assert status == 503 and body["failing"] == ["gave up on cordon"]
        assert not ready(cordon)
        assert [n for n in up.unready() if n != "platform"] == []  # the rest keep running
        assert any("up.gave_up" in line for line in up.output.err)


def _up(state: Path) -> subprocess.Popen[bytes]:
    state.parent.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    return subprocess.Popen(
        [*NODEWARD, "up", "--state-dir", str(state), "--nodes", "1", "--scenario", "none"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=state.parent,
        env=env,
    )


@pytest.mark.parametrize("how", [signal.SIGHUP, signal.SIGKILL], ids=["hung-up", "killed"])
def test_up_hung_up_stops_cleanly_and_killed_leaves_no_nats_server(
    tmp_path: Path, how: signal.Signals
) -> None:
    """A terminal closed under `up` (SIGHUP) killed it without its shutdown, and its
    nats-server (a session of its own) ran on, holding the port and the store; so did a
    SIGKILL. Hung up, `up` stops as on Ctrl-C (exit 0); killed, its nats-server goes too."""
    state = tmp_path / "up" / "state"
    proc = _up(state)
    try:
        wait_until((state / "endpoints.json").exists, timeout=60, what="up")
        pid = _nats_pid(state)
        assert pid is not None and _alive(pid)
        proc.send_signal(how)
        code = proc.wait(timeout=60)
        assert code == (0 if how == signal.SIGHUP else -signal.SIGKILL), code
        wait_until(lambda: not _alive(pid), timeout=10, what="the nats-server to go")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
