"""The sim cluster's HTTP API: the paths, verbs, status codes and bodies of a kube-apiserver.

`SimCluster` runs it in-process on the caller's event loop:

    async with SimCluster(seed, port=0) as sim:
        sim.write_kubeconfig(path)             # admin context by default
        sim.write_kubeconfig(path, identity="cordon")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from nodeward.aio import within
from nodeward.logs import get_logger
from sim.cluster import (
    apply,
    checkpoints,
    convert,
    decoding,
    disruption,
    listing,
    openapi,
    protobuf,
    rbac,
    resources,
    tables,
    tokens,
    versions,
    webhooks,
)
from sim.cluster.admission import scheme_defaults
from sim.cluster.controllers import ControllerAdmission, ControlPlane
from sim.cluster.errors import ApiError, bad_request
from sim.cluster.kubelet import Kubelets
from sim.cluster.nodelifecycle import NodeLifecycle, default_grace_s
from sim.cluster.patch import apply_patch
from sim.cluster.resources import ResourceType, lookup
from sim.cluster.seed import Seed, SeedError, apply_seed, load_seed
from sim.cluster.selectors import (
    match_fields,
    match_labels,
    parse_field_selector,
    parse_label_selector,
)
from sim.cluster.store import Change, Fields, Obj, Store, clone, now
from sim.cluster.tls import make_serving_cert

if TYPE_CHECKING:
    from nodeward.kube.access import Access

CLUSTER_NAME = "nodeward-sim"
SERVICE_NAMESPACE = "nodeward"
_PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")
_EVENTS_V1 = resources.require("events.k8s.io", "v1", "events")
_IDENTITY = web.RequestKey("sim_identity", rbac.Identity)  # the request's authenticated identity
KUBE_VERSION_ENV = "NODEWARD_SIM_KUBE_VERSION"
UNKNOWN_FIELDS_ENV = "NODEWARD_SIM_UNKNOWN_FIELDS"
"""`fail`: a write that a real API server would store with an `unknown field` warning (its
`fieldValidation` being Warn) is refused instead, so that a test whose code writes a field a
real cluster would silently drop fails. Anything else: the API server's own behaviour."""


@dataclass
class Checkpoint:
    """A container checkpoint the node-proxy endpoint recorded."""

    node: str
    namespace: str
    pod: str
    container: str
    path: str
    timeout: int | None
    time: str
    file: Path | None = None
    """The archive written on this machine (`archive_root/<node>/<path>`), if the sim writes them."""


@dataclass
class Fault:
    """Answer the next `count` matching requests with `status` (a Status body), as a failing server would."""

    count: int
    status: int
    method: str | None = None
    path_contains: str | None = None
    message: str = "injected by the sim cluster"

    def matches(self, method: str, path: str) -> bool:
        return (
            self.count > 0
            and (self.method is None or self.method == method)
            and (self.path_contains is None or self.path_contains in path)
        )


@dataclass
class _Route:
    rt: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str
    rest: list[str] = field(default_factory=list)


def _not_found_path() -> ApiError:
    return ApiError(
        404,
        "NotFound",
        "the server could not find the requested resource",
        details={
            "causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]
        },
    )


def _is_resource_path(parts: list[str]) -> bool:
    """Whether a path names resources (`/api/v1/pods`), not discovery (`/api/v1`, `/apis/g/v`)
    or another non-resource URL."""
    if parts[:1] == ["api"]:
        return len(parts) > 2
    if parts[:1] == ["apis"]:
        return len(parts) > 3
    return False


def _encoded(body: Any) -> bytes:
    """JSON as the API server writes it (`encoding/json`'s Encoder): compact, HTML
    characters escaped, one trailing newline."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        text = text.replace(char, escaped)
    return (text + "\n").encode()


def _json(
    body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=_encoded(body), status=status, headers=headers, content_type="application/json"
    )


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _is_apply(request: web.Request) -> bool:
    media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    return media == "application/apply-patch+yaml"


def _options_invalid(kind: str, field: str, reason: str, message: str) -> ApiError:
    """422 Invalid on a request's options (`CreateOptions`, `PatchOptions`, ...)."""
    return ApiError(
        422,
        "Invalid",
        f'{kind}.meta.k8s.io "" is invalid: {field}: {message}',
        details={
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [{"reason": reason, "message": message, "field": field}],
        },
    )


def _delete_options(request: web.Request, body: Any) -> dict[str, Any]:
    """A delete's DeleteOptions: its body, with the query's `gracePeriodSeconds` and
    `propagationPolicy` where the body does not say them."""
    options = dict(body) if isinstance(body, dict) else {}
    grace = request.query.get("gracePeriodSeconds")
    if grace is not None and "gracePeriodSeconds" not in options:
        try:
            options["gracePeriodSeconds"] = int(grace)
        except ValueError:
            raise bad_request(f"gracePeriodSeconds: {grace!r} is not an integer") from None
    policy = request.query.get("propagationPolicy")
    if policy is not None and "propagationPolicy" not in options:
        options["propagationPolicy"] = policy
    if options.get("orphanDependents") is True and "propagationPolicy" not in options:
        options["propagationPolicy"] = "Orphan"
    return options


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return "as=Table" in accept


def _wants_metadata(request: web.Request) -> bool:
    """A metadata-only list, as client-go's metadata client asks (JSON; protobuf is not
    served): `application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`."""
    accept = request.headers.get("Accept", "")
    return any(
        "as=PartialObjectMetadataList" in part and part.strip().startswith("application/json")
        for part in accept.split(",")
    )


def _wants_partial(request: web.Request) -> bool:
    """A metadata-only watch or get (client-go's metadata client): each object as a
    `PartialObjectMetadata`, `application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`
    (`handlers/response.go` `transformObject`)."""
    accept = request.headers.get("Accept", "")
    return any(
        "as=PartialObjectMetadata;" in part + ";" and part.strip().startswith("application/json")
        for part in accept.split(",")
    )


class SimCluster:
    """A Kubernetes API server for the resources nodeward uses, with RBAC, on one port."""

    def __init__(
        self,
        seed: Seed | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rbac_dirs: Iterable[Path] | None = None,
        access: Iterable[Access] = (),
        bookmark_interval: float = 5.0,
        history: int = 10000,
        warnings_fail: bool | None = None,
        kube_version: str | None = None,
        enabled: Iterable[str] | None = None,
        token_cache_ttl: float = tokens.CACHE_TTL,
        archive_root: Path | None = None,
        registries: Iterable[str] = (),
        lease_renew_s: float = 10.0,
        node_status_report_s: float = 300.0,
        node_monitor_period_s: float = 5.0,
        node_monitor_grace_s: float | None = None,
        node_startup_grace_s: float = 60.0,
        node_eviction_qps: float = 0.1,
        webhook_endpoints: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        """`kube_version`: the release claimed (`1.33`; default `$NODEWARD_SIM_KUBE_VERSION`,
        else the client models' release), which decides the group-versions served, with the
        feature gates and runtime-config group-versions `enabled` (default
        `versions.DEFAULT_ENABLED`). ValueError for a release the sim cannot claim.
        `token_cache_ttl`: how long a ServiceAccount token that authenticated stays so without
        being checked again (kube-apiserver's 10 s; 0: checked every time).
        `archive_root`: the nodes' filesystems (`<archive_root>/<node>/`); each checkpoint
        then writes its archive there, as CRI-O does (`sim.cluster.checkpoints`).
        `registries`: the registry hosts (`127.0.0.1:5000`, plain HTTP) the kubelets pull
        from; a pod whose image is on one of them is started after its manifest is read,
        and restored if it is a checkpoint image (`sim.cluster.kubelet`).
        Nodes' heartbeats and health (`sim.cluster.kubelet`, `sim.cluster.nodelifecycle`):
        `lease_renew_s`, how often the sim's kubelets renew their node Leases (the kubelet's
        10 s); `node_status_report_s`, how often they post an unchanged node status (its
        `nodeStatusReportFrequency`, 5 min); `node_monitor_period_s`, how often the node
        lifecycle controller checks them (`--node-monitor-period`, 5 s);
        `node_monitor_grace_s`, how long without a sign before a node is `Unknown`
        (`--node-monitor-grace-period`; by default the claimed release's, 40 s up to 1.31,
        50 s from 1.32); `node_startup_grace_s`, the same for a node that never posted `Ready`
        (60 s); `node_eviction_qps`, the rate per zone of `NoExecute` taints for unhealthy
        nodes (`--node-eviction-rate`, 0.1).
        `webhook_endpoints`: where the backend of a Service an admission webhook names
        listens, by (namespace, service): `{("nodeward", "nodeward-admission"):
        "127.0.0.1:8443"}` (the sim has no service network; `sim.cluster.webhooks`)."""
        claimed = kube_version or os.environ.get(KUBE_VERSION_ENV)
        self.apis = versions.Apis(versions.parse_version(claimed) if claimed else None, enabled)
        self.seed = seed if isinstance(seed, Seed) else load_seed(seed)
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history=history)
        self.tokens = tokens.Tokens(self.store, self.apis.minor, cache_ttl=token_cache_ttl)
        """ServiceAccount tokens: TokenRequest, TokenReview, bearer authentication."""
        self.checkpoints: list[Checkpoint] = []
        self.archive_root = Path(archive_root) if archive_root is not None else None
        grace = (
            node_monitor_grace_s
            if node_monitor_grace_s is not None
            else default_grace_s(self.apis.minor)
        )
        self.kubelets = Kubelets(
            self.store,
            registries=registries,
            lease_renew_s=lease_renew_s,
            status_report_s=node_status_report_s,
            grace_s=grace,
            archive_root=self.archive_root,
        )
        """The nodes' kubelets; `kubelets.restores` lists the containers restored."""
        self.node_lifecycle = NodeLifecycle(
            self.store,
            monitor_period_s=node_monitor_period_s,
            grace_s=grace,
            startup_grace_s=node_startup_grace_s,
            eviction_qps=node_eviction_qps,
        )
        """kube-controller-manager's node lifecycle controller."""
        self._nodes_task: asyncio.Task[None] | None = None
        self.checkpoint_delay = 0.0  # seconds each checkpoint takes, as CRIU dumping memory does
        # (identity, method, path, status) of the latest requests, for tests and debugging
        self.requests: deque[tuple[str, str, str, int]] = deque(maxlen=10000)
        self.faults: list[Fault] = []
        self.evictions: list[tuple[str, str, str]] = []  # namespace, pod, Eviction apiVersion
        # (method, path, text) of every Warning header sent
        self.warnings: list[tuple[str, str, str]] = []
        self.warnings_fail = (
            os.environ.get(UNKNOWN_FIELDS_ENV) == "fail" if warnings_fail is None else warnings_fail
        )
        self._fields: decoding.Fields | None = None
        self.identities: dict[str, rbac.Identity] = {rbac.ADMIN: rbac.admin_identity()}
        self._by_token: dict[str, rbac.Identity] = {}
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._openapi_build: asyncio.Future[openapi.Documents] | None = None
        self._log = get_logger(component="sim-cluster")
        self.tls = make_serving_cert(host)
        self.webhook_endpoints: dict[tuple[str, str], str] = dict(webhook_endpoints or {})
        """Where each webhook Service's backend listens; may be changed while running."""
        self.webhooks = webhooks.Dispatcher(
            self.store, self.apis, self._started_fields, self.webhook_endpoints
        )
        """The admission webhooks' dispatcher (`webhooks.calls`: every call made)."""
        self._load(list(rbac_dirs) if rbac_dirs is not None else None, tuple(access))

    # --- setup ---------------------------------------------------------------------------

    def _load(self, rbac_dirs: list[Path] | None, access: tuple[Access, ...]) -> None:
        """Seed the store, then load RBAC: the API server's default roles, then from
        `rbac_dirs`, else the source tree's deploy/rbac, else the same roles built from
        the daemons' declared `access`."""
        disruption.watch_pods(self.store)
        self.kubelets.install()
        ControlPlane(
            self.store,
            admission=ControllerAdmission(self._admitted_by_webhooks, self._create_for_controller),
        ).install()
        self.node_lifecycle.install()
        default = rbac.default_rbac_dir()
        try:
            if rbac_dirs is not None:
                manifests = rbac.load_manifests(rbac_dirs)
            elif default is not None:
                manifests = rbac.load_manifests([default])
            else:
                manifests = rbac.manifests_from_access(access)
        except (OSError, yaml.YAMLError) as exc:
            raise SeedError(f"cannot load RBAC manifests: {' '.join(str(exc).split())}") from None
        ns_rt = lookup("", "v1", "namespaces")
        assert ns_rt is not None
        try:
            apply_seed(self.store, self.seed, kubelet_version=self.apis.git_version)
        except ApiError as exc:
            raise SeedError(f"seed does not apply: {exc.message}") from None
        for doc in [*rbac.bootstrap_manifests(), *manifests]:
            meta = doc.get("metadata") or {}
            ns = meta.get("namespace")
            if ns and self.store.find(ns_rt, "", ns) is None:
                self.store.create(
                    ns_rt, "", {"metadata": {"name": ns}, "status": {"phase": "Active"}}
                )
            rt = resources.by_kind(doc.get("apiVersion", ""), doc.get("kind", ""))
            if rt is None:
                continue
            try:
                self.store.put_raw(rt, doc)
            except ApiError as exc:
                raise SeedError(f"RBAC manifest does not apply: {exc.message}") from None
            if rt.kind == "ServiceAccount":
                name = meta["name"]
                short = name.removeprefix("nodeward-")
                self.identities[short] = rbac.service_account_identity(ns or "default", name, short)
        self._by_token = {i.token: i for i in self.identities.values()}

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    async def start(self) -> None:
        # before serving: a write never waits on them (from the disk cache: milliseconds)
        self._fields = await asyncio.to_thread(decoding.Fields.load)
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.tls.ssl_context())
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._nodes_task = asyncio.create_task(self._nodes())
        self._log.info("sim cluster listening", url=self.url)

    async def stop(self) -> None:
        self._closing.set()
        if self._nodes_task is not None:
            self._nodes_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._nodes_task
            self._nodes_task = None
        await self.kubelets.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _nodes(self) -> None:
        """The nodes' clock: the kubelets' heartbeats every `lease_renew_s`, the node
        lifecycle controller's pass every `node_monitor_period_s`; heartbeats first, so that
        a stalled event loop does not make nodes look silent."""
        loop = asyncio.get_running_loop()
        next_beat = next_pass = loop.time()
        while True:
            if loop.time() >= next_beat:
                next_beat = loop.time() + self.kubelets.lease_renew_s
                try:
                    await self.kubelets.heartbeat()
                except Exception:  # noqa: BLE001 - a bug in the sim: logged, the clock goes on
                    self._log.exception("kubelet heartbeat failed")
            if loop.time() >= next_pass:
                next_pass = loop.time() + self.node_lifecycle.monitor_period_s
                try:
                    self.node_lifecycle.monitor()
                except Exception:  # noqa: BLE001 - a bug in the sim: logged, the clock goes on
                    self._log.exception("node lifecycle pass failed")
            await asyncio.sleep(max(0.0, min(next_beat, next_pass) - loop.time()))

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def archives(self, node: str | None = None) -> list[Path]:
        """The checkpoint archives written on this machine (of `node`, or every node's)."""
        if self.archive_root is None:
            return []
        return checkpoints.archives(self.archive_root, node)

    def fail_next(
        self,
        count: int,
        status: int = 503,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        message: str = "injected by the sim cluster",
    ) -> Fault:
        """Make the next `count` matching requests fail with `status`."""
        fault = Fault(count, status, method, path_contains, message)
        self.faults.append(fault)
        return fault

    # --- kubeconfig ----------------------------------------------------------------------

    def kubeconfig(self, identity: str = rbac.ADMIN) -> dict[str, Any]:
        """A kubeconfig with one user and context per identity; `identity` is the current one."""
        if identity not in self.identities:
            raise KeyError(
                f"unknown identity {identity!r}; known: {', '.join(sorted(self.identities))}"
            )

        def ctx(short: str) -> str:
            return "nodeward-admin" if short == rbac.ADMIN else f"nodeward-{short}"

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [
                {
                    "name": CLUSTER_NAME,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.tls.ca_pem).decode(),
                    },
                }
            ],
            "users": [
                {"name": ctx(s), "user": {"token": i.token}}
                for s, i in sorted(self.identities.items())
            ],
            "contexts": [
                {
                    "name": ctx(s),
                    "context": {
                        "cluster": CLUSTER_NAME,
                        "user": ctx(s),
                        "namespace": "default" if s == rbac.ADMIN else SERVICE_NAMESPACE,
                    },
                }
                for s in sorted(self.identities)
            ],
            "current-context": ctx(identity),
        }

    def write_kubeconfig(self, path: Path, identity: str = rbac.ADMIN) -> Path:
        """Write the kubeconfig (mode 0600) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(self.kubeconfig(identity), sort_keys=False)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    # --- request handling ----------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> rbac.Identity | None:
        """The bearer token's identity: one of the sim's own (as a token file's), else a
        ServiceAccount token the sim issued, valid for the API server's audience; None (401)
        otherwise."""
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer "):
            return None
        token = header[7:].strip()
        ident = self._by_token.get(token)
        if ident is not None:
            return ident
        try:
            found = self.tokens.authenticate(token)
        except tokens.Refused:
            return None
        if found is None:
            return None
        user = found.user
        return rbac.Identity(
            user.username, user.username, user.groups, token, uid=user.uid, extra=user.extra
        )

    def pod_token(
        self,
        namespace: str,
        pod: str,
        *,
        audience: str | None = None,
        expiration_seconds: int | None = None,
    ) -> str:
        """The ServiceAccount token pod `namespace/pod`'s kubelet would mount: a TokenRequest
        for the pod's account bound to the pod (with its uid), for `audience` (default: the
        API server's) and `expiration_seconds` (default: 3607 for the API server, as the
        `kube-api-access` volume asks; 3600, a projected volume's default, for another
        audience). `ApiError` as the TokenRequest would answer."""
        obj = self.store.get(resources.require("", "v1", "pods"), namespace, pod)
        account = (obj.get("spec") or {}).get("serviceAccountName") or "default"
        if expiration_seconds is None:
            expiration_seconds = (
                tokens.DEFAULT_EXPIRATION if audience else tokens.WARN_ONLY_EXPIRATION
            )
        spec: dict[str, Any] = {
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod,
                "uid": obj["metadata"]["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        answer = self.tokens.request(namespace, account, {"spec": spec})
        return str(answer["status"]["token"])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ident = self._authenticate(request)
        status = 500
        try:
            response = await self._dispatch(request, ident)
            status = response.status
            return response
        except ApiError as exc:
            status = exc.code
            return _json(exc.status(), status=exc.code, headers=exc.headers)
        except json.JSONDecodeError as exc:
            status = 400
            err = bad_request(f"the body of the request could not be decoded: {exc.msg}")
            return _json(err.status(), status=400)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the sim: answer as the API server does, and log it
            self._log.exception(
                "sim cluster request failed", method=request.method, path=request.path_qs
            )
            err = ApiError(
                500, "InternalError", f"Internal error occurred: {type(exc).__name__}: {exc}"
            )
            return _json(err.status(), status=500)
        finally:
            who = ident.name if ident else "-"
            self.requests.append((who, request.method, request.path_qs, status))
            self._log.debug(
                "request", identity=who, method=request.method, path=request.path_qs, status=status
            )

    async def _dispatch(
        self, request: web.Request, ident: rbac.Identity | None
    ) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC_PATHS:
            return (
                _json(self.apis.version_info()) if path == "/version" else web.Response(text="ok")
            )
        if ident is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        for fault in self.faults:
            if fault.matches(request.method, request.path):
                fault.count -= 1
                reasons = {
                    429: "TooManyRequests",
                    500: "InternalError",
                    503: "ServiceUnavailable",
                    504: "Timeout",
                }
                raise ApiError(
                    fault.status, reasons.get(fault.status, "InternalError"), fault.message
                )
        parts = [p for p in path.split("/") if p]
        # discovery, OpenAPI: RBAC's nonResourceURLs decide
        if not _is_resource_path(parts) and not rbac.authorize_path(
            ident, request.method.lower(), request.path, self._rbac_objects()
        ):
            raise ApiError(
                403,
                "Forbidden",
                f'forbidden: User "{ident.user}" cannot {request.method.lower()} '
                f'path "{request.path}"',
                details={},
            )
        if parts[:1] == ["openapi"] and request.method == "GET":
            return await self._openapi(request, parts)
        if not parts or parts[0] not in ("api", "apis"):
            raise _not_found_path()
        if request.method == "GET":
            discovery = self._discovery(parts)
            if discovery is not None:
                return _json(discovery)
        route = self._route(parts)
        verb = self._verb(request, route)
        if verb not in route.rt.verbs:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        attrs = rbac.Request(
            verb,
            route.rt.group,
            route.rt.resource,
            route.subresource,
            route.namespace or "",
            route.name or "",
        )
        if not rbac.authorize(ident, attrs, self._rbac_objects()):
            raise ApiError(
                403,
                "Forbidden",
                rbac.forbidden_message(ident, attrs),
                details={
                    "name": route.name or "",
                    "group": route.rt.group,
                    "kind": route.rt.resource,
                },
            )
        if route.subresource == "token":
            return await self._token_request(request, route)
        if route.rt.resource == "tokenreviews":
            return await self._token_review(request, route)
        if route.rt.resource in resources.REVIEWS:
            return await self._review(request, route, ident)
        request[_IDENTITY] = ident
        return await self._serve(request, route, verb)

    async def _token_request(self, request: web.Request, route: _Route) -> web.Response:
        """`POST .../serviceaccounts/<name>/token`: a TokenRequest, answered with its token
        (`sim.cluster.tokens`), 201."""
        if request.method != "POST":
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        dry_values = request.query.getall("dryRun", [])
        if any(v != "All" for v in dry_values):
            raise bad_request(
                f"Invalid dry run value: {', '.join(dry_values)}: valid values are 'All'"
            )
        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be an object")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind and kind != "TokenRequest":
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind (TokenRequest)"
            )
        if api_version and api_version != f"{tokens.GROUP}/v1":
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({tokens.GROUP}/v1)"
            )
        mode = decoding.directive(request.query, "CreateOptions")
        decoded = self._started_fields().decode(tokens.GROUP, "v1", "TokenRequest", body)
        decoding.refuse_body("TokenRequest", "v1", decoded, mode)
        warned = self._warnings_of(request, decoded.strict if mode == "Warn" else [])
        answer = self.tokens.request(route.namespace or "", route.name or "", decoded.obj)
        return self._warned(_json(answer, status=201), warned)

    async def _token_review(self, request: web.Request, route: _Route) -> web.Response:
        """`POST /apis/authentication.k8s.io/v1/tokenreviews`: what the token in `spec` is,
        for `spec.audiences` (default: the API server's), 201."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be an object")
        self._check_kind(route, body)
        body, warned = await self._decode(request, route, body, "CreateOptions")
        spec = body.get("spec") or {}
        token = str(spec.get("token") or "")
        if not token:
            raise bad_request("token is required for TokenReview in authentication")
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        out = {
            "kind": route.rt.kind,
            "apiVersion": route.rt.api_version(route.version),
            "metadata": {**(meta or {}), "creationTimestamp": None},
            "spec": spec,
            "status": self._token_status(token, list(spec.get("audiences") or [])),
        }
        return self._warned(_json(out, status=201), warned)

    def _token_status(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """A TokenReview's `status`, as the API server's authenticators answer: the sim's own
        tokens (a token file's, audience-agnostic: good for the API server's audiences), then
        its ServiceAccount tokens; `authenticated` is left out when false, as Go's
        `omitempty` does."""
        requested = audiences or list(self.tokens.audiences)
        ident = self._by_token.get(token)
        if ident is not None:
            accepted = [a for a in requested if a in self.tokens.audiences]
            if accepted:
                return {
                    "authenticated": True,
                    "user": self._user_info(ident),
                    "audiences": accepted,
                }
            return {"user": {}, "error": tokens.INVALID_BEARER_TOKEN}
        try:
            found = self.tokens.authenticate(token, requested)
        except tokens.Refused as exc:
            return {"user": {}, "error": str(exc)}
        if found is None:
            return {"user": {}, "error": tokens.INVALID_BEARER_TOKEN}
        return {
            "authenticated": True,
            "user": found.user.info(),
            "audiences": list(found.audiences),
        }

    async def _review(
        self, request: web.Request, route: _Route, ident: rbac.Identity
    ) -> web.Response:
        """The self reviews, answered from the RBAC the sim enforces: `kubectl auth can-i`
        (SelfSubjectAccessReview), `auth can-i --list` (SelfSubjectRulesReview) and `auth
        whoami` (SelfSubjectReview)."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be an object")
        self._check_kind(route, body)
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise bad_request("spec must be an object")
        objects = self._rbac_objects()
        status: dict[str, Any]
        if route.rt.kind == "SelfSubjectAccessReview":
            status = rbac.access_review_status(ident, spec, objects)
        elif route.rt.kind == "SelfSubjectRulesReview":
            status = rbac.review_status(ident, str(spec.get("namespace") or ""), objects)
        else:
            status = {"userInfo": self._user_info(ident)}
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        out: dict[str, Any] = {
            "kind": route.rt.kind,
            "apiVersion": route.rt.api_version(route.version),
            "metadata": {**(meta or {}), "creationTimestamp": None},
        }
        if route.rt.kind != "SelfSubjectReview":
            out["spec"] = spec
        out["status"] = status
        return _json(out, status=201)

    def _user_info(self, ident: rbac.Identity) -> dict[str, Any]:
        """`UserInfo` as the authenticator reports it; a ServiceAccount's carries its uid,
        and a ServiceAccount token's its `extra` (pod, node, credential id)."""
        info: dict[str, Any] = {"username": ident.user}
        prefix = "system:serviceaccount:"
        if ident.uid:
            info["uid"] = ident.uid
        elif ident.user.startswith(prefix):
            namespace, _, name = ident.user.removeprefix(prefix).partition(":")
            sa = self.store.find(resources.require("", "v1", "serviceaccounts"), namespace, name)
            if sa is not None:
                info["uid"] = sa["metadata"]["uid"]
        info["groups"] = list(ident.groups)
        if ident.extra:
            info["extra"] = {k: list(v) for k, v in sorted(ident.extra)}
        return info

    async def _openapi_documents(self) -> openapi.Documents:
        """The OpenAPI documents, built on first use in a thread (it takes seconds)."""
        if self._openapi_build is None:
            self._openapi_build = asyncio.ensure_future(asyncio.to_thread(openapi.build, self.apis))
        try:
            return await asyncio.shield(self._openapi_build)
        except Exception:
            if self._openapi_build.done():
                self._openapi_build = None  # a failed build is tried again on the next request
            raise

    async def _openapi(self, request: web.Request, parts: list[str]) -> web.Response:
        """`/openapi/v2` (JSON, or protobuf for kubectl) and `/openapi/v3[/<group version>]`,
        negotiated on Accept as the API server does (406 when nothing offered is acceptable),
        with ETags, and on v3 the `?hash=` of each document's URL."""
        if parts != ["openapi", "v2"] and parts[:2] != ["openapi", "v3"]:
            raise _not_found_path()
        docs = await self._openapi_documents()
        headers = {"Vary": "Accept"}
        # (media type accepted, content type answered, body, its hash)
        offers: list[tuple[str, str, bytes, str]]
        if parts == ["openapi", "v2"]:
            json_hash, proto_hash = docs.v2_hashes
            offers = [
                ("application/json", "application/json", docs.v2_json, json_hash),
                (openapi.V2_PROTOBUF_ASKED, openapi.V2_PROTOBUF, docs.v2_proto, proto_hash),
                (openapi.V2_PROTOBUF, openapi.V2_PROTOBUF, docs.v2_proto, proto_hash),
            ]
        elif parts == ["openapi", "v3"]:
            index = json.dumps(docs.v3_index()).encode()
            offers = [("application/json", "application/json", index, openapi.etag(index))]
        else:
            gv = "/".join(parts[2:])
            if gv not in docs.v3:
                raise _not_found_path()
            current = docs.v3_hashes[gv]
            wanted = request.query.get("hash")
            if wanted is not None and wanted != current:
                return web.Response(
                    status=301, headers={"Location": f"/openapi/v3/{gv}?hash={current}"}
                )
            if wanted is not None:
                headers["Cache-Control"] = "public, immutable"
                headers["Expires"] = "Thu, 31 Dec 2099 00:00:00 GMT"
            offers = [("application/json", "application/json", docs.v3[gv], current)]
        chosen = openapi.negotiate(request.headers.get("Accept", ""), offers)
        if chosen is None:
            return web.Response(status=406)
        content_type, body, digest = chosen
        headers["ETag"] = f'"{digest}"'
        headers.setdefault("Cache-Control", "no-cache, private")
        if request.headers.get("If-None-Match") == headers["ETag"]:
            return web.Response(status=304, headers=headers)
        headers["Content-Type"] = content_type
        return web.Response(body=body, headers=headers)

    def _rbac_objects(self) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {}
        for name in ("clusterroles", "clusterrolebindings", "roles", "rolebindings"):
            rt = lookup("rbac.authorization.k8s.io", "v1", name)
            assert rt is not None
            out[name] = self.store.list(rt)
        return out

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        if parts == ["api"]:
            return resources.api_versions(f"{self.host}:{self.port}")
        if parts == ["apis"]:
            return self.apis.api_group_list()
        if parts[0] == "api" and len(parts) == 2:
            found = self.apis.resource_list("", parts[1])
            if found is None:
                raise _not_found_path()
            return found
        if parts[0] == "apis" and len(parts) == 2:
            group = self.apis.api_group(parts[1])
            if group is None:
                raise _not_found_path()
            return group
        if parts[0] == "apis" and len(parts) == 3:
            found = self.apis.resource_list(parts[1], parts[2])
            if found is None:
                raise _not_found_path()
            return found
        return None

    def _route(self, parts: list[str]) -> _Route:
        if parts[0] == "api":
            if len(parts) < 2:
                raise _not_found_path()
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) < 3:
                raise _not_found_path()
            group, version, rest = parts[1], parts[2], parts[3:]
        if not rest:
            raise _not_found_path()
        namespace: str | None = None
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (group == "" and len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        resource = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        rt = lookup(group, version, resource)
        if (
            rt is None
            or not self.apis.serves(group, version, resource)
            or (namespace is not None and not rt.namespaced)
        ):
            raise _not_found_path()
        if sub and sub not in rt.subresources:
            raise _not_found_path()
        if len(rest) > 3 and sub != "proxy":
            raise _not_found_path()
        return _Route(rt, version, namespace, name, sub, rest[3:])

    def _verb(self, request: web.Request, route: _Route) -> str:
        method = request.method
        if route.subresource == "proxy":
            return {
                "GET": "get",
                "POST": "create",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }.get(method, "get")
        if method == "GET":
            if route.name:
                return "get"
            return "watch" if request.query.get("watch") in ("1", "true", "True") else "list"
        if method == "POST":
            if route.name and not route.subresource:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            return "create"
        if method in ("PUT", "PATCH"):
            if not route.name:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            return "update" if method == "PUT" else "patch"
        if method == "DELETE":
            return "delete" if route.name else "deletecollection"
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    # --- serving -------------------------------------------------------------------------

    def _storage(self, route: _Route) -> ResourceType:
        """The resource type whose store holds `route`'s objects (core events live as events.k8s.io)."""
        return _EVENTS_V1 if route.rt.key == _EVENTS_V1.key else route.rt

    def _out(self, route: _Route, obj: Obj) -> Obj:
        """An object as the requested group version shows it."""
        if route.rt.group == "" and route.rt.resource == "events":
            return convert.to_core_event(obj)
        obj["apiVersion"] = route.rt.api_version(route.version)
        return obj

    def _in(self, route: _Route, obj: Obj) -> Obj:
        if route.rt.group == "" and route.rt.resource == "events":
            return convert.from_core_event(obj)
        return obj

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media == "application/vnd.kubernetes.protobuf":
            try:
                return protobuf.decode(raw)
            except protobuf.UndecodableError:
                pass
        if media and "json" not in media and "yaml" not in media:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json, application/yaml (the sim cluster does not decode {media})",
            )
        try:
            return json.loads(raw, object_pairs_hook=decoding.object_pairs)
        except json.JSONDecodeError:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError:
                raise bad_request("the body of the request could not be decoded") from None

    def _attributes(
        self,
        request: web.Request,
        route: _Route,
        operation: str,
        *,
        obj: Obj | None,
        old: Obj | None,
        dry: bool,
        options: Obj,
    ) -> webhooks.Attributes:
        """The request's admission attributes, for its webhooks."""
        user = self._user_info(request[_IDENTITY])
        return self._attributes_as(
            user, route, operation, obj=obj, old=old, dry=dry, options=options
        )

    def _attributes_as(
        self,
        user: Obj,
        route: _Route,
        operation: str,
        *,
        obj: Obj | None,
        old: Obj | None,
        dry: bool,
        options: Obj | None,
    ) -> webhooks.Attributes:
        """The admission attributes of `user`'s request."""
        name = route.name or str(((obj or {}).get("metadata") or {}).get("name") or "")
        namespace = route.namespace or ""
        if route.rt.group == "" and route.rt.resource == "namespaces":
            namespace = name  # as the API server sets it for a Namespace's own requests
        return webhooks.Attributes(
            operation,
            route.rt,
            route.version,
            route.subresource,
            namespace,
            name,
            obj,
            old,
            dry,
            options,
            user,
        )

    def _webhook_warnings(self, request: web.Request, warned: list[str]) -> list[str]:
        for text in warned:
            self.warnings.append((request.method, request.path_qs, text))
        return warned

    async def _create(
        self, request: web.Request, route: _Route, body: Obj, *, dry: bool, fields: Fields
    ) -> tuple[Obj, list[str]]:
        """A create as the API server runs it: built-in admission, the mutating webhooks,
        the registry's preparation and validation, the validating webhooks, storage. The
        object as stored (or would be, under dryRun) and the webhooks' warnings."""
        options = webhooks.options("CreateOptions", request.query, dry)
        user = self._user_info(request[_IDENTITY])
        created, warned = await self._create_as(
            user, route, body, dry=dry, fields=fields, options=options
        )
        self._webhook_warnings(request, warned)
        return created, warned

    async def _create_as(
        self, user: Obj, route: _Route, body: Obj, *, dry: bool, fields: Fields | None, options: Obj
    ) -> tuple[Obj, list[str]]:
        """`_create` for `user`, with or without an HTTP request (a controller's create)."""
        store_rt, ns = self._storage(route), route.namespace or ""

        def admitted(obj: Obj) -> Obj:
            return self._out(route, self.store.admit_create(store_rt, ns, self._in(route, obj)))

        obj = admitted(body)
        attrs = self._attributes_as(
            user, route, "CREATE", obj=obj, old=None, dry=dry, options=options
        )
        mutated, warned = await self.webhooks.mutate(
            attrs, lambda o: scheme_defaults(route.rt.group, route.rt.kind, o), admitted
        )
        assert mutated is not None
        prepared = self.store.prepare_create(store_rt, ns, self._in(route, mutated), fields)
        attrs.obj = self._out(route, clone(prepared))
        warned += await self.webhooks.validate(attrs)
        if dry:
            return self._out(route, prepared), warned
        return self._out(route, self.store.commit_create(store_rt, ns, prepared)), warned

    def _controller_user(self, controller: str) -> Obj:
        """A kube-controller-manager controller's identity (its ServiceAccount in
        kube-system, as `--use-service-account-credentials` runs each)."""
        return {
            "username": f"system:serviceaccount:kube-system:{controller}",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                "system:authenticated",
            ],
        }

    def _pod_route(self, namespace: str) -> _Route:
        return self._route(["api", "v1", "namespaces", namespace, "pods"])

    def _admitted_by_webhooks(self, namespace: str, pod: Obj, controller: str) -> bool:
        """Whether a webhook would be called on this controller's pod create."""
        attrs = self._attributes_as(
            self._controller_user(controller),
            self._pod_route(namespace),
            "CREATE",
            obj=pod,
            old=None,
            dry=False,
            options=None,
        )
        return self.webhooks.would_call(attrs)

    async def _create_for_controller(self, namespace: str, pod: Obj, controller: str) -> Obj:
        """A controller's pod create, as the API server admits it (webhooks included)."""
        route = self._pod_route(namespace)
        options = webhooks.options("CreateOptions", {}, False)
        created, _ = await self._create_as(
            self._controller_user(controller),
            route,
            pod,
            dry=False,
            fields=None,
            options=options,
        )
        return created

    async def _update(
        self,
        request: web.Request,
        route: _Route,
        body: Obj,
        *,
        dry: bool,
        fields: Fields,
        remake: Callable[[], Awaitable[Obj]] | None = None,
    ) -> tuple[Obj, list[str]]:
        """An update (or patch) as the API server runs it: the mutating webhooks, the
        registry's preparation and validation, the validating webhooks, storage; tried
        again, as `GuaranteedUpdate` does, when the object was written while its webhooks
        ran and the request named no resourceVersion (a patch: `remake` applies it again to
        the object as it now is). The object as stored and the webhooks' warnings."""
        store_rt, ns, name = self._storage(route), route.namespace or "", route.name or ""
        pinned = remake is None and bool((body.get("metadata") or {}).get("resourceVersion"))
        options = webhooks.options("UpdateOptions", request.query, dry)
        for attempt in range(5):
            if attempt and remake is not None:
                body = await remake()
            old = self._out(route, self.store.get(store_rt, ns, name))
            attrs = self._attributes(
                request, route, "UPDATE", obj=clone(body), old=old, dry=dry, options=options
            )
            mutated, warned = await self.webhooks.mutate(
                attrs, lambda o: scheme_defaults(route.rt.group, route.rt.kind, o), None
            )
            assert mutated is not None
            try:
                prepared = self.store.prepare_update(
                    store_rt,
                    ns,
                    name,
                    self._in(route, mutated),
                    subresource=route.subresource,
                    fields=fields,
                )
                if not prepared.noop:
                    attrs.obj = self._out(route, clone(prepared.new))
                    warned += await self.webhooks.validate(attrs)
                if prepared.noop:
                    stored = clone(prepared.old)
                elif dry:
                    stored = prepared.new
                else:
                    stored = self.store.commit_update(store_rt, ns, name, prepared)
            except ApiError as exc:
                # written meanwhile (the body's resourceVersion, or the commit's check)
                if exc.reason == "Conflict" and not pinned and attempt < 4:
                    continue
                raise
            return self._out(route, stored), self._webhook_warnings(request, warned)
        raise AssertionError("unreachable")

    async def _delete_admitted(
        self, request: web.Request, route: _Route, name: str, options: Obj, dry: bool
    ) -> list[str]:
        """The webhooks of a delete (object none, the stored one old): their warnings."""
        store_rt, ns = self._storage(route), route.namespace or ""
        old = self._out(route, self.store.get(store_rt, ns, name))
        typed = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", **options}
        if dry:
            typed["dryRun"] = ["All"]
        attrs = self._attributes(
            request, route, "DELETE", obj=None, old=old, dry=dry, options=typed
        )
        attrs.name = name
        _, warned = await self.webhooks.mutate(attrs, lambda o: o, None)
        warned += await self.webhooks.validate(attrs)
        return self._webhook_warnings(request, warned)

    async def _serve(self, request: web.Request, route: _Route, verb: str) -> web.StreamResponse:
        rt, store_rt = route.rt, self._storage(route)
        ns = route.namespace or ""
        dry_values = request.query.getall("dryRun", [])
        if any(v != "All" for v in dry_values):
            raise bad_request(
                f"Invalid dry run value: {', '.join(dry_values)}: valid values are 'All'"
            )
        dry = bool(dry_values)
        if route.subresource == "proxy":
            return await self._proxy(request, route)
        if route.subresource == "eviction":
            body = await self._body(request)
            if isinstance(body, dict) and "All" in (
                (body.get("deleteOptions") or {}).get("dryRun") or []
            ):
                dry = True
            hooked: list[str] = []
            if isinstance(body, dict):  # a CREATE of pods/eviction, its kind policy/v1 Eviction
                options = webhooks.options("CreateOptions", request.query, dry)
                attrs = self._attributes(
                    request, route, "CREATE", obj=body, old=None, dry=dry, options=options
                )
                attrs.kind = {"group": "policy", "version": "v1", "kind": "Eviction"}
                admitted, hooked = await self.webhooks.mutate(attrs, lambda o: o, None)
                body = admitted if admitted is not None else body
                hooked += await self.webhooks.validate(attrs)
                self._webhook_warnings(request, hooked)
            disruption.evict(self.store, store_rt, ns, route.name or "", body, dry_run=dry)
            if not dry:
                self.evictions.append((ns, route.name or "", str(body.get("apiVersion"))))
            return self._warned(
                _json(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "code": 201,
                    },
                    status=201,
                ),
                hooked,
            )
        if verb == "get":
            obj = self._out(route, self.store.get(store_rt, ns, route.name or ""))
            if _wants_table(request):
                return _json(
                    tables.table(
                        rt,
                        [obj],
                        obj["metadata"]["resourceVersion"],
                        request.query.get("includeObject", "Metadata"),
                    )
                )
            return _json(obj)
        if verb == "list":
            return self._list(request, route)
        if verb == "watch":
            return await self._watch(request, route)
        if verb == "create":
            body = await self._body(request)
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be an object")
            self._check_kind(route, body)
            body, warned = await self._decode(request, route, body, "CreateOptions")
            created, hooked = await self._create(
                request, route, body, dry=dry, fields=self._tracked(request, route)
            )
            return self._warned(_json(created, status=201), warned + hooked)
        if verb == "update":
            body = await self._body(request)
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be an object")
            self._check_kind(route, body)
            body, warned = await self._decode(request, route, body, "UpdateOptions")
            updated, hooked = await self._update(
                request, route, body, dry=dry, fields=self._tracked(request, route)
            )
            return self._warned(_json(updated), warned + hooked)
        if verb == "patch" and _is_apply(request):
            return await self._apply(request, route, dry)
        if verb == "patch":
            if request.query.get("force"):
                raise _options_invalid(
                    "PatchOptions",
                    "force",
                    "FieldValueForbidden",
                    "Forbidden: may not be specified for non-apply patch",
                )
            body = await self._body(request)
            pinned = isinstance(body, dict) and bool(
                (body.get("metadata") or {}).get("resourceVersion")
            )

            async def patch_now() -> tuple[Obj, list[str]]:
                current = self._out(route, self.store.get(store_rt, ns, route.name or ""))
                patched = apply_patch(
                    current,
                    body,
                    request.headers.get("Content-Type", ""),
                    rt.kind,
                    strategic=not rt.custom,
                )
                if not isinstance(patched, dict):
                    raise bad_request("the patch did not produce an object")
                return await self._decode(request, route, patched, "PatchOptions")

            async def remake() -> Obj:
                return (await patch_now())[0]

            patched, warned = await patch_now()
            updated, hooked = await self._update(
                request,
                route,
                patched,
                dry=dry,
                fields=self._tracked(request, route),
                remake=None if pinned else remake,
            )
            return self._warned(_json(updated), warned + hooked)
        if verb == "delete":
            body = await self._body(request) or {}
            options = _delete_options(request, body)
            pre = options.get("preconditions") or {}
            dry = dry or "All" in (options.get("dryRun") or [])
            hooked = await self._delete_admitted(request, route, route.name or "", options, dry)
            gone = self.store.delete(
                store_rt,
                ns,
                route.name or "",
                precondition_rv=pre.get("resourceVersion"),
                precondition_uid=pre.get("uid"),
                dry_run=dry,
                grace_period=options.get("gracePeriodSeconds"),
                propagation=options.get("propagationPolicy"),
            )
            # Not deleted yet (graceful, finalizers): the object as it stands. Deleted: the
            # object for pods (the pod registry's ReturnDeletedObject), else a Status.
            still = self.store.find(store_rt, ns, route.name or "")
            if rt.kind == "Pod" or (still is not None and not dry):
                return self._warned(_json(self._out(route, gone)), hooked)
            return self._warned(
                _json(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": {
                            "name": route.name,
                            "group": rt.group,
                            "kind": rt.resource,
                            "uid": gone["metadata"]["uid"],
                        },
                    }
                ),
                hooked,
            )
        if verb == "deletecollection":
            items = self._select(request, route, self.store.list(store_rt, route.namespace))
            options = _delete_options(request, await self._body(request) or {})
            hooked = []
            for item in items:
                hooked += await self._delete_admitted(
                    request, route, item["metadata"]["name"], options, dry
                )
                self.store.delete(
                    store_rt,
                    item["metadata"].get("namespace", ""),
                    item["metadata"]["name"],
                    dry_run=dry,
                    grace_period=options.get("gracePeriodSeconds"),
                    propagation=options.get("propagationPolicy"),
                )
            return self._warned(_json(self._list_body(route, items)), hooked)
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    def _tracked(self, request: web.Request, route: _Route) -> Fields:
        """How a create, update or non-apply patch changes field ownership (`Update`)."""
        manager = apply.manager_of(
            request.query.get("fieldManager"), request.headers.get("User-Agent", "")
        )

        def fields(old: Obj | None, new: Obj) -> list[Obj]:
            return apply.track_update(
                old,
                new,
                kind=route.rt.kind,
                manager=manager,
                api_version=route.rt.api_version(route.version),
                subresource=route.subresource,
                with_status="status" in route.rt.subresources,
                now=now(),
            )

        return fields

    async def _apply(self, request: web.Request, route: _Route, dry: bool) -> web.Response:
        """Server-side apply (`sim.cluster.apply`): creates the object if it is missing."""
        manager = request.query.get("fieldManager", "")
        if not manager:
            raise _options_invalid(
                "PatchOptions",
                "fieldManager",
                "FieldValueRequired",
                "Required value: is required for apply patch",
            )
        force = request.query.get("force", "") in ("true", "1", "True")
        config = await self._body(request)
        if not isinstance(config, dict):
            raise bad_request("error decoding patch: the apply configuration is not an object")
        self._check_kind(route, config)
        mode = decoding.directive(request.query, "PatchOptions")
        fields = self._started_fields()
        decoded = fields.decode(route.rt.group, route.version, route.rt.kind, config)
        if decoded.type_error is not None:
            raise bad_request(f"error decoding patch: {decoded.type_error}")
        if decoded.strict and mode == "Strict":
            raise bad_request(
                f"error strict decoding patch: {decoding.strict_error(decoded.strict)}"
            )
        warned = self._warnings_of(request, decoded.strict if mode == "Warn" else [])
        store_rt, ns, name = self._storage(route), route.namespace or "", route.name or ""
        meta = decoded.obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        meta["name"] = name
        found = self.store.find(store_rt, ns, name)
        current = self._out(route, found) if found is not None else None
        merged = apply.server_side_apply(
            current,
            decoded.obj,
            kind=route.rt.kind,
            custom=route.rt.custom,
            manager=manager,
            force=force,
            api_version=route.rt.api_version(route.version),
            subresource=route.subresource,
            with_status="status" in route.rt.subresources,
            now=now(),
        )
        managed: list[Obj] = merged["metadata"]["managedFields"]

        def keep(old: Obj | None, new: Obj) -> list[Obj]:
            return managed

        if current is None:
            created, hooked = await self._create(request, route, merged, dry=dry, fields=keep)
            return self._warned(_json(created, status=201), warned + hooked)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        updated, hooked = await self._update(request, route, merged, dry=dry, fields=keep)
        return self._warned(_json(updated), warned + hooked)

    def _started_fields(self) -> decoding.Fields:
        assert self._fields is not None, "the sim cluster is not started"
        return self._fields

    def _warnings_of(self, request: web.Request, warned: list[str]) -> list[str]:
        """The warnings a write sends (each remembered), or, with warnings as failures, 400."""
        if warned and self.warnings_fail:
            self._log.error(
                "sim cluster: a write a real API server would store without these fields",
                method=request.method,
                path=request.path_qs,
                fields=warned,
            )
            raise bad_request(
                f"the sim cluster refuses what a real API server would drop with a warning "
                f"({UNKNOWN_FIELDS_ENV}=fail): {', '.join(warned)}"
            )
        for text in warned:
            self.warnings.append((request.method, request.path_qs, text))
        return warned

    async def _decode(
        self, request: web.Request, route: _Route, body: Obj, options: str
    ) -> tuple[Obj, list[str]]:
        """`body` as the API server stores it (`decoding`), and the warnings to send with it;
        refused as the server refuses it."""
        mode = decoding.directive(request.query, options)
        fields = self._started_fields()
        rt = route.rt
        decoded = fields.decode(rt.group, route.version, rt.kind, body)
        if options == "PatchOptions":
            decoding.refuse_patch(body, decoded, mode)
        else:
            decoding.refuse_body(rt.kind, route.version, decoded, mode)
        return decoded.obj, self._warnings_of(request, decoded.strict if mode == "Warn" else [])

    @staticmethod
    def _warned(response: web.Response, warned: list[str]) -> web.Response:
        for text in warned:
            response.headers.add("Warning", decoding.warning_header(text))
        return response

    def _check_kind(self, route: _Route, body: Obj) -> None:
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if route.rt.group == "" and route.rt.resource == "events":
            expected = {"v1"}
        else:
            expected = {route.rt.api_version(v) for v in route.rt.versions}
        if kind and kind != route.rt.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({route.rt.kind})"
            )
        if api_version and api_version not in expected:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({route.rt.api_version(route.version)})"
            )

    def _selectors(self, request: web.Request, route: _Route) -> tuple[Any, Any]:
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(
            request.query.get("fieldSelector"), route.rt.fields, route.rt.resource
        )
        return labels, fields

    def _select(self, request: web.Request, route: _Route, items: list[Obj]) -> list[Obj]:
        labels, fields = self._selectors(request, route)
        out = []
        for item in items:
            shown = self._out(route, item)
            if match_labels(labels, shown["metadata"].get("labels")) and match_fields(
                fields, shown
            ):
                out.append(shown)
        return out

    def _list_body(
        self,
        route: _Route,
        items: list[Obj],
        cont: str = "",
        rv: int | None = None,
        remaining: int | None = None,
    ) -> Obj:
        meta: dict[str, Any] = {
            "resourceVersion": str(rv if rv is not None else self.store.resource_version)
        }
        if cont:
            meta["continue"] = cont
            if remaining is not None:
                meta["remainingItemCount"] = remaining
        return {
            "kind": f"{route.rt.kind}List",
            "apiVersion": route.rt.api_version(route.version),
            "metadata": meta,
            "items": items,
        }

    def _list(self, request: web.Request, route: _Route) -> web.Response:
        """A list as the API server reads it from etcd: every page of a paginated list at the
        first page's revision (the continue token carries it, and the key to go on after),
        `resourceVersion` with `resourceVersionMatch` (`Exact`: that revision, 410 once
        compacted; `NotOlderThan`: at least as new), `remainingItemCount` when unfiltered."""
        query = request.query
        page = listing.read(query, self.store.resource_version)
        store_rt = self._storage(route)
        objects = None
        if page.rv is not None and page.rv != self.store.resource_version:
            objects = self.store.snapshot(store_rt, page.rv, route.namespace)
            if objects is None:
                raise listing.expired(page, self.store.resumable_from(store_rt.key))
        rv = page.rv if page.rv is not None else self.store.resource_version
        if objects is None:
            objects = self.store.list(store_rt, route.namespace)
        if page.after:
            objects = [o for o in objects if listing.key_of(o) > page.after]
        items = self._select(request, route, objects)
        cont, remaining = "", None
        if page.limit and page.limit < len(items):
            items, rest = items[: page.limit], items[page.limit :]
            cont = listing.token(rv, listing.key_of(items[-1]))
            filtered = "labelSelector" in query or "fieldSelector" in query
            remaining = None if filtered else len(rest)
        if _wants_table(request):
            body = tables.table(route.rt, items, str(rv), query.get("includeObject", "Metadata"))
            if cont:
                body["metadata"]["continue"] = cont
            return _json(body)
        body = self._list_body(route, items, cont, rv, remaining)
        if _wants_metadata(request):
            body |= {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1"}
            body["items"] = [tables.partial(obj) for obj in items]
        return _json(body)

    async def _watch(self, request: web.Request, route: _Route) -> web.StreamResponse:
        labels, fields = self._selectors(request, route)
        store_rt = self._storage(route)
        bookmarks = request.query.get("allowWatchBookmarks") in ("1", "true", "True")
        timeout = float(request.query.get("timeoutSeconds") or 0) or None
        rv_text = request.query.get("resourceVersion") or ""

        def matches(obj: Obj | None) -> Obj | None:
            if obj is None:
                return None
            meta = obj["metadata"]
            if route.namespace is not None and meta.get("namespace") != route.namespace:
                return None
            shown = self._out(route, copy.deepcopy(obj))
            ok = match_labels(labels, shown["metadata"].get("labels")) and match_fields(
                fields, shown
            )
            return shown if ok else None

        def event_for(change: Change) -> dict[str, Any] | None:
            new, old = (
                matches(change.obj),
                matches(change.old) if change.type != "DELETED" else None,
            )
            if change.type == "DELETED":
                return {"type": "DELETED", "object": new} if new else None
            if change.type == "ADDED":
                return {"type": "ADDED", "object": new} if new else None
            if new and old:
                return {"type": "MODIFIED", "object": new}
            if new:
                return {"type": "ADDED", "object": new}
            if old:
                gone = matches(change.old)
                assert gone is not None
                gone["metadata"]["resourceVersion"] = str(change.rv)
                return {"type": "DELETED", "object": gone}
            return None

        as_table = _wants_table(request)
        include = request.query.get("includeObject", "Metadata")

        partial = not as_table and _wants_partial(request)

        def encode(ev: dict[str, Any]) -> bytes:
            if partial and ev["type"] in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                ev = {"type": ev["type"], "object": tables.partial(ev["object"])}
            if as_table and ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                obj = ev["object"]
                ev = {
                    "type": ev["type"],
                    "object": tables.table(
                        route.rt, [obj], obj["metadata"]["resourceVersion"], include
                    ),
                }
            return _encoded(ev)

        watcher = self.store.subscribe(store_rt.key, route.namespace)
        backlog: list[dict[str, Any]] = []
        try:
            if rv_text in ("", "0"):
                for obj in self.store.list(store_rt, route.namespace):
                    if shown := matches(obj):
                        backlog.append({"type": "ADDED", "object": shown})
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    raise bad_request(f"invalid resource version: {rv_text!r}") from None
                oldest = self.store.resumable_from(store_rt.key)
                if since < oldest:
                    backlog.append(
                        {
                            "type": "ERROR",
                            "object": {
                                "kind": "Status",
                                "apiVersion": "v1",
                                "metadata": {},
                                "status": "Failure",
                                "message": f"too old resource version: {since} ({oldest + 1})",
                                "reason": "Expired",
                                "code": 410,
                            },
                        }
                    )
                else:
                    for change in self.store.history_since(since, store_rt.key):
                        if ev := event_for(change):
                            backlog.append(ev)
            expired = bool(backlog) and backlog[0]["type"] == "ERROR"
            last_rv = self.store.resource_version
            response = web.StreamResponse(
                status=200,
                headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"},
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            for ev in backlog:
                await response.write(encode(ev))
            if expired:
                await response.write_eof()
                return response
            deadline = time.monotonic() + timeout if timeout else None
            next_bookmark = time.monotonic() + self.bookmark_interval
            while not self._closing.is_set():
                now_m = time.monotonic()
                if deadline is not None and now_m >= deadline:
                    break
                if request.transport is None or request.transport.is_closing():
                    if request.transport is not None:
                        request.transport.abort()
                    break
                if bookmarks and now_m >= next_bookmark:
                    bm = {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": route.rt.kind,
                            "apiVersion": route.rt.api_version(route.version),
                            "metadata": {"resourceVersion": str(last_rv)},
                        },
                    }
                    await response.write(json.dumps(bm).encode() + b"\n")
                    next_bookmark = now_m + self.bookmark_interval
                wait = 0.5
                if bookmarks:
                    wait = min(wait, max(next_bookmark - now_m, 0.01))
                if deadline is not None:
                    wait = min(wait, max(deadline - now_m, 0.01))
                try:
                    change = await within(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    continue
                last_rv = change.rv
                if ev := event_for(change):
                    await response.write(encode(ev))
            if self._closing.is_set() and request.transport is not None:
                # Shutting down: drop the stream rather than wait on a TLS close handshake
                # with a client that may be gone.
                request.transport.abort()
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
        except ConnectionError:  # the client went away mid-write
            if request.transport is not None:
                request.transport.abort()
            raise
        finally:
            self.store.unsubscribe(watcher)

    async def _proxy(self, request: web.Request, route: _Route) -> web.Response:
        """The node proxy; only the kubelet's checkpoint endpoint is served."""
        node = route.name or ""
        self.store.get(route.rt, "", node)
        rest = route.rest
        if request.method != "POST" or len(rest) != 4 or rest[0] != "checkpoint":
            return web.Response(status=404, text="404 page not found\n", content_type="text/plain")
        _, ns, pod_name, container = rest
        pods = lookup("", "v1", "pods")
        assert pods is not None
        pod = self.store.find(pods, ns, pod_name)
        if pod is None or (pod.get("spec") or {}).get("nodeName") != node:
            return web.Response(status=404, text="pod does not exist\n", content_type="text/plain")
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        if container not in names:
            return web.Response(
                status=404,
                text=f"container {container} does not exist\n",
                content_type="text/plain",
            )
        failure = self.seed.fails_checkpoint(ns, pod_name, container)
        if failure is not None:
            return web.Response(
                status=500,
                content_type="text/plain",
                text=(
                    f"checkpointing of {ns}/{pod_name}/{container} failed "
                    f"(rpc error: code = Unknown desc = {failure.message})\n"
                ),
            )
        if self.checkpoint_delay:
            await asyncio.sleep(self.checkpoint_delay)
        stamp = now()
        path = f"/var/lib/kubelet/checkpoints/checkpoint-{pod_name}_{ns}-{container}-{stamp}.tar"
        timeout = request.query.get("timeout")
        file = None
        if self.archive_root is not None:
            file = checkpoints.local_path(self.archive_root, node, path)
            data = checkpoints.archive_bytes(pod, container, node, stamp, time.time())
            await asyncio.to_thread(checkpoints.write_archive, file, data)
        self.checkpoints.append(
            Checkpoint(
                node,
                ns,
                pod_name,
                container,
                path,
                int(timeout) if timeout and timeout.isdigit() else None,
                stamp,
                file,
            )
        )
        return _json({"items": [path]})
