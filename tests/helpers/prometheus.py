"""Debian's Prometheus as a test peer: started on a free port in a temp dir, stopped after,
and its HTTP API read the way a dashboard reads it."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from nodeward.bus.server import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


@contextlib.contextmanager
def prometheus(folder: Path, config: Mapping[str, Any], timeout: float = 30) -> Iterator[str]:
    """Prometheus with `config` (its prometheus.yml, as a mapping), its data in `folder`;
    yields its URL once `/-/ready` answers, and stops it on the way out."""
    assert PROMETHEUS is not None, "Debian `prometheus` is not installed (scripts/system-deps.sh)"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _ready(url):
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited: {(folder / 'prometheus.log').read_text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError("prometheus /-/ready: not ready in time")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def api(url: str, path: str, **params: str) -> Any:
    """`GET /api/v1/<path>`'s `data`; an error answer raises with Prometheus' own words."""
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    if body.get("status") != "success":
        raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector (or scalar, as one sample) `expr` gives now."""
    data = api(url, "query", query=expr)
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return list(data["result"])
