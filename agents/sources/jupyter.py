"""A Jupyter server's kernels, read from its `/api/kernels`, as the idleness agent's evidence.

The server's URL comes from the pod object: the annotation `nodeward.io/jupyter-url` if
set, else `http://<status.podIP>:<port><NB_PREFIX>` (Kubeflow Notebooks run the server under
`NB_PREFIX=/notebook/<ns>/<name>` on the container port named `notebook-port`). Anything
but a 200 answer holding a list of kernels (refused, timed out, 403 from a mesh or a wrong
token, 5xx, HTML, another JSON shape) is *unknown*, with one line saying why: never idle.
No kernels at all is a valid, known answer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field, ValidationError

from agents.sources.activity import KernelsReading
from nodeward.config import Section
from nodeward.durations import Duration
from schemas.session import KernelActivity

URL_ANNOTATION = "nodeward.io/jupyter-url"
DEFAULT_URL = "http://{ip}:{port}{prefix}"


class JupyterSettings(Section):
    """How the idleness agent finds and reads a session pod's Jupyter server."""

    port: int = Field(
        default=8888, ge=1, le=65535, description="when no container port is named for it"
    )
    port_names: list[str] = Field(
        default_factory=lambda: ["notebook-port"],
        description="container port names of the server (Kubeflow: notebook-port); "
        "else the first port whose name starts with `http`",
    )
    timeout: Duration = timedelta(seconds=3)
    token_file: Path | None = None
    """file holding the servers' API token (sent, never logged)"""
    url: str | None = Field(
        default=None,
        description="template of the server's base URL for every pod, with {ip} {port} "
        "{prefix} {namespace} {name}; default " + DEFAULT_URL,
    )
    url_annotation: str = URL_ANNOTATION
    """pod annotation that gives the base URL itself"""


class NoServerUrl(ValueError):
    """The pod object does not say where its Jupyter server is (one line why)."""


def _env(container: Mapping[str, Any], name: str) -> str | None:
    for entry in container.get("env") or ():
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get("value")
            return str(value) if value is not None else None
    return None


def _port(containers: list[Mapping[str, Any]], settings: JupyterSettings) -> int:
    """The named server port, else the first `http*`-named port, else the default."""
    http: int | None = None
    for container in containers:
        for port in container.get("ports") or ():
            if not isinstance(port, Mapping) or not isinstance(port.get("containerPort"), int):
                continue
            name = str(port.get("name") or "")
            if name in settings.port_names:
                return int(port["containerPort"])
            if http is None and name.startswith("http"):
                http = int(port["containerPort"])
    return http if http is not None else settings.port


def _prefix(value: str | None) -> str:
    """NB_PREFIX as a URL path: a leading slash, no trailing one ('' for none)."""
    path = (value or "").strip().strip("/")
    return f"/{path}" if path else ""


def server_url(pod: Mapping[str, Any], settings: JupyterSettings) -> str:
    """The base URL of the Jupyter server in `pod` (`NoServerUrl` if it cannot be told)."""
    meta = pod.get("metadata") or {}
    override = (meta.get("annotations") or {}).get(settings.url_annotation)
    if override:
        url = str(override).strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise NoServerUrl(f"annotation {settings.url_annotation} is not an http(s) URL")
        return url
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise NoServerUrl("pod has no IP yet")
    try:
        host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else str(ip)
    except ValueError:
        raise NoServerUrl(f"pod IP {ip!r} is not an IP address") from None
    containers = [
        c for c in (pod.get("spec") or {}).get("containers") or () if isinstance(c, Mapping)
    ]
    # The container that says NB_PREFIX is the notebook's: look there first.
    containers.sort(key=lambda c: _env(c, "NB_PREFIX") is None)
    prefix = _prefix(next((p for c in containers if (p := _env(c, "NB_PREFIX"))), None))
    template = settings.url or DEFAULT_URL
    try:
        url = template.format(
            ip=host,
            port=_port(containers, settings),
            prefix=prefix,
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise NoServerUrl(f"url template {template!r} is not usable: {exc}") from None
    return url.rstrip("/")


def shown(url: str) -> str:
    """`url` without credentials or query, for messages."""
    try:
        u = httpx.URL(url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return str(u.copy_with(query=None, fragment=None, username=None, password=None))


class NotKernels(ValueError):
    """An answer that is not Jupyter's kernel list (one line why)."""


def parse_kernels(payload: Any) -> list[KernelActivity]:
    """Jupyter's kernel list; `NotKernels` for any other shape."""
    if not isinstance(payload, list):
        raise NotKernels(f"expected a list of kernels, got {type(payload).__name__}")
    kernels = []
    for i, item in enumerate(payload):
        if not isinstance(item, Mapping):
            raise NotKernels(f"kernel {i} is a {type(item).__name__}, not an object")
        try:
            kernels.append(KernelActivity.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "kernel"
            raise NotKernels(f"kernel {i}: {where}: {first['msg']}") from None
    return kernels


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class JupyterKernels:
    """Reads the kernels of the Jupyter server in a pod (a `KernelSource`)."""

    def __init__(
        self, settings: JupyterSettings | None = None, *, client: httpx.AsyncClient | None = None
    ) -> None:
        self.settings = settings or JupyterSettings()
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=self.settings.timeout.total_seconds(),
            follow_redirects=False,  # a redirect (to a login page) is not the kernel list
            trust_env=False,  # pod IPs are reached directly, never through a proxy
        )

    def _headers(self) -> dict[str, str]:
        path = self.settings.token_file
        if path is None:
            return {}
        token = path.read_text().strip()  # read each time: a rotated token is picked up
        return {"Authorization": f"token {token}"} if token else {}

    async def kernels(self, pod: Mapping[str, Any]) -> KernelsReading:
        try:
            base = server_url(pod, self.settings)
        except NoServerUrl as exc:
            return KernelsReading(kernels=None, error=f"jupyter: {exc}")
        try:
            headers = self._headers()
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            return KernelsReading(
                kernels=None, error=f"jupyter: token file {self.settings.token_file}: {why}"
            )
        url = f"{base}/api/kernels"
        where = f"jupyter {shown(url)}"
        timeout = self.settings.timeout.total_seconds()
        try:
            response = await self._client.get(url, headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            return KernelsReading(kernels=None, error=f"{where}: no answer within {timeout:g}s")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return KernelsReading(kernels=None, error=f"{where}: cannot connect ({_one_line(exc)})")
        if response.status_code != 200:
            hint = " (token refused or access denied)" if response.status_code in (401, 403) else ""
            return KernelsReading(kernels=None, error=f"{where}: HTTP {response.status_code}{hint}")
        try:
            payload = response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content-type")
            return KernelsReading(kernels=None, error=f"{where}: answer is not JSON ({kind})")
        try:
            return KernelsReading(kernels=parse_kernels(payload))
        except NotKernels as exc:
            return KernelsReading(kernels=None, error=f"{where}: not a kernel list: {exc}")

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()
