"""The one module that imports the official `kubernetes` client.

It loads in-cluster config or a kubeconfig, sends raw requests (so that every path, patch
content type and subresource is explicit), runs each blocking call in a thread of its own
pool (`concurrency` threads, as many pooled keep-alive connections), retries
5xx and connection errors with jittered exponential back-off, and turns every failure into
a `nodeward.kube.errors` type.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import random
import re
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

import urllib3

from nodeward.config import ClusterSettings
from nodeward.kube import errors
from nodeward.logs import get_logger


def _import_kubernetes() -> None:
    """Import `kubernetes` without its dynamic client's optional `kubernetes_validate`.

    The package's `__init__` imports `kubernetes.dynamic`, which imports
    `kubernetes_validate` when it is installed (a test dependency), and with it jsonschema
    and, where jupyter's extras are installed, the format grammars of `rfc3987_syntax`:
    2.4 s of CPU at the start of every daemon, for a client nodeward never uses. The
    import is skipped for this once only: whoever imports `kubernetes_validate` later
    gets it as usual.
    """
    if "kubernetes" in sys.modules or "kubernetes_validate" in sys.modules:
        return
    sys.modules["kubernetes_validate"] = None  # type: ignore[assignment]  # an ImportError
    try:
        importlib.import_module("kubernetes")
    finally:
        if sys.modules.get("kubernetes_validate", "") is None:
            del sys.modules["kubernetes_validate"]


_import_kubernetes()
import kubernetes.client  # noqa: E402 - after the import above
import kubernetes.config  # noqa: E402
from kubernetes.client.exceptions import ApiException, OpenApiException  # noqa: E402

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# A list of metadata alone, as client-go's metadata client asks (with plain JSON after it).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# Metadata and nothing else (no plain JSON after it: a server that cannot answer so refuses
# with 406 rather than sending whole objects): a list, and each object of a watch.
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential back-off: `base * 2**attempt`, capped, times a random 0.5-1.0."""

    base: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return float(min(self.cap, self.base * 2**attempt) * random.uniform(0.5, 1.0))  # noqa: S311


class _Request(TypedDict):
    """One request's query, body and how long it may take (a watch: connect and read)."""

    query: Sequence[tuple[str, str]]
    body: Any
    content_type: str
    timeout: float | tuple[float, float | None] | None
    accept: NotRequired[str]


class KubeClient:
    """Raw, typed-error access to one API server."""

    def __init__(
        self,
        configuration: Any,
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: Backoff | None = None,
        user_agent: str = "nodeward",
        concurrency: int = 32,
    ) -> None:
        configuration.retries = False  # retries are ours, with back-off and typed errors
        # One thread per request in flight, and a kept-alive connection for each: the
        # event loop's default executor (cores + 4 threads, shared with everything else)
        # and urllib3's default pool (cores * 5) held a busy service to a few at a time.
        configuration.connection_pool_maxsize = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        self._api = kubernetes.client.ApiClient(configuration)
        self._api.user_agent = user_agent
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff or Backoff()
        self._log = get_logger(component="kube")

    @classmethod
    def from_settings(
        cls, settings: ClusterSettings, *, user_agent: str = "nodeward"
    ) -> KubeClient:
        """A kubeconfig (and context) if one is set, else the in-cluster ServiceAccount."""
        configuration = kubernetes.client.Configuration()
        try:
            if settings.kubeconfig is not None:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(settings.kubeconfig),
                    context=settings.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            else:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
        except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
            where = settings.kubeconfig or "in-cluster config"
            raise errors.KubeError(f"cannot load {where}: {' '.join(str(exc).split())}") from None
        return cls(
            configuration,
            timeout=_seconds(settings.request_timeout),
            retries=settings.retries,
            user_agent=user_agent,
            concurrency=settings.concurrency,
        )

    @classmethod
    def from_kubeconfig(cls, path: Path, context: str | None = None, **kw: Any) -> KubeClient:
        return cls.from_settings(ClusterSettings(kubeconfig=path, context=context), **kw)

    async def close(self) -> None:
        await self._in_pool(self._api.close)
        self._pool.shutdown(wait=False)

    async def _in_pool(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in one of this client's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # --- requests ------------------------------------------------------------------------

    def _send(self, method: str, path: str, **request: Unpack[_Request]) -> Any:
        headers = {"Accept": request.get("accept", "application/json")}
        if request["body"] is not None:
            headers["Content-Type"] = request["content_type"]
        req = self._api.param_serialize(
            method,
            path,
            query_params=list(request["query"]),
            header_params=headers,
            body=request["body"],
            auth_settings=["BearerToken"],
        )
        return self._api.call_api(*req, _request_timeout=request["timeout"])

    def _call(
        self, method: str, path: str, **request: Unpack[_Request]
    ) -> tuple[int, Any, Mapping[str, str]]:
        try:
            resp = self._send(method, path, **request)
            raw = resp.read()
        except ApiException as exc:
            return int(exc.status or 0), exc.body or "", dict(exc.headers or {})
        text = (
            raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw or "")
        )
        try:
            data: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            data = text
        return int(resp.status), data, dict(resp.headers or {})

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool | None] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
        retry_statuses: frozenset[int] = RETRY_STATUSES,
        accept: str = "application/json",
    ) -> Any:
        """Send one request; return the decoded body of a 2xx, raise a typed error otherwise.

        `retry_statuses` (and connection errors) are retried up to `retries` times with
        back-off, honouring `Retry-After`.
        """
        params = [(k, _qv(v)) for k, v in (query or {}).items() if v is not None]
        attempt = 0
        while True:
            try:
                status, data, headers = await self._in_pool(
                    self._call,
                    method,
                    path,
                    query=params,
                    body=body,
                    content_type=content_type,
                    timeout=request_timeout or self.timeout,
                    accept=accept,
                )
            except OpenApiException as exc:
                raise errors.KubeError(f"{method} {path}: {_one_line(exc)}") from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt >= self.retries:
                    raise errors.Unavailable(f"{method} {path}: {_one_line(exc)}") from None
                await self._pause(
                    attempt, None, method, path, f"connection error: {_one_line(exc)}"
                )
                attempt += 1
                continue
            if 200 <= status < 300:
                for warning in _warnings(headers):
                    # as client-go's default handler does: the server stored what was sent
                    # less something, or warns of a deprecation; either is worth a look
                    self._log.warning("kube.api_warning", method=method, path=path, said=warning)
                return data
            if isinstance(data, str):
                with contextlib.suppress(json.JSONDecodeError):
                    data = json.loads(data)
            retry_after = _retry_after(headers)
            if status not in retry_statuses or attempt >= self.retries:
                raise errors.from_status(status, data, retry_after)
            await self._pause(attempt, retry_after, method, path, f"HTTP {status}")
            attempt += 1

    async def _pause(
        self, attempt: int, retry_after: float | None, method: str, path: str, why: str
    ) -> None:
        delay = retry_after if retry_after is not None else self.backoff.delay(attempt)
        self._log.debug(
            "kube request retried", method=method, path=path, why=why, delay=round(delay, 3)
        )
        await asyncio.sleep(delay)

    # --- watches -------------------------------------------------------------------------

    async def stream(
        self,
        path: str,
        *,
        query: Mapping[str, str | int | bool | None],
        read_timeout: float,
        accept: str = "application/json",
    ) -> AsyncIterator[dict[str, Any]]:
        """The newline-delimited JSON events of one watch request, until the server ends it
        (`accept`: each object's form, e.g. `METADATA_ONLY`)."""
        params = [(k, _qv(v)) for k, v in query.items() if v is not None]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        try:
            resp = await self._in_pool(
                self._send,
                "GET",
                path,
                query=params,
                body=None,
                content_type="application/json",
                timeout=(self.timeout, read_timeout),
                accept=accept,
            )
        except OpenApiException as exc:
            raise errors.KubeError(f"watch {path}: {_one_line(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.Unavailable(f"watch {path}: {_one_line(exc)}") from None
        if not 200 <= resp.status < 300:
            raw = resp.read()
            try:
                data: Any = json.loads(raw)
            except (json.JSONDecodeError, TypeError):
                data = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            raise errors.from_status(int(resp.status), data)
        raw_resp = resp.response

        def hand_over(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            try:
                for line in raw_resp:
                    if line.strip():
                        hand_over(line)
            except Exception as exc:  # noqa: BLE001 - handed to the event loop, which raises a typed error
                hand_over(exc)
            finally:
                hand_over(done)

        thread = threading.Thread(target=pump, name=f"kube-watch {path}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, Exception):
                    if isinstance(item, urllib3.exceptions.ReadTimeoutError | TimeoutError):
                        return
                    raise errors.Unavailable(f"watch {path}: {_one_line(item)}")
                try:
                    yield json.loads(item)
                except json.JSONDecodeError:
                    raise errors.ServerError(f"watch {path}: undecodable event") from None
        finally:
            # Interrupt the reader and close the connection; it never goes back to the pool
            # with a stream half read.
            with contextlib.suppress(Exception):
                raw_resp.shutdown()
            with contextlib.suppress(Exception):
                raw_resp.close()


def _qv(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def _warnings(headers: Mapping[str, str]) -> list[str]:
    """The texts of the response's `Warning` headers (RFC 7234 `299 - "text"`; several in
    one value when the headers were joined)."""
    out = []
    for key, value in headers.items():
        if key.lower() == "warning":
            out += [re.sub(r"\\(.)", r"\1", m) for m in _WARNING.findall(value)]
    return out


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for key, value in headers.items():
        if key.lower() == "retry-after":
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
