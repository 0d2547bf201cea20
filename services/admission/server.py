"""The webhook's HTTPS edge: AdmissionReviews in, answers out, the certificate reloaded live.

`POST <path>` (`/mutate`) with `Content-Type: application/json` and an
`admission.k8s.io/v1` AdmissionReview answers 200 with the AdmissionReview the policy
decided (`services.admission.policy`). Otherwise, one line of text: 400 for a body that is
not such a review (bad JSON, wrong apiVersion or kind, no request or uid, over
`max_body_bytes`), 415 for another content type, 405 for another method; 503 while the
cache is not synced, for a namespace it does not know yet, or past `deadline` (the API
server then applies the webhook's failurePolicy). Health, readiness and metrics are on the
daemon's own HTTP port, not here.

TLS: the certificate chain and key are read from files, and checked every
`tls_check_interval` (their mtime, size and inode, and the `..data` link a Secret or
ConfigMap volume swaps on an update): a changed pair is loaded into the listening
`SSLContext`, so the next handshake presents it and no connection or listener is dropped.
A pair that does not load (a key not matching its certificate, half-written) is logged and
the old one kept until the next check.

Logged per review: the pod (namespace/name, or namespace/generateName*), the outcome, the
patch's paths or the refusal; never a Secret's data, which this process never reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from nodeward.daemon import listen
from nodeward.metrics import at_zero
from services.admission.policy import (
    MUTATION_KINDS,
    OUTCOMES,
    REFUSAL_REASONS,
    BadReview,
    CredentialRef,
    Decision,
    NamespaceView,
    ReviewRequest,
    decide,
    parse_review,
    response,
)
from services.admission.settings import AdmissionSettings


class ServerError(RuntimeError):
    """The webhook cannot serve as configured (one line)."""


class Lookup(Protocol):
    """What a review reads: the cache (`services.admission.cache.ClusterCache`)."""

    @property
    def synced(self) -> bool: ...

    def namespace(self, name: str) -> NamespaceView | None: ...

    def credentials_in(self, namespace: str) -> list[CredentialRef]: ...


def _signature(paths: Sequence[Path]) -> tuple[Any, ...]:
    """What changes when a file, or the Secret volume's `..data` link, is replaced."""
    parts: list[Any] = []
    for path in paths:
        try:
            st = path.stat()
            parts.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            parts.append(None)
        with contextlib.suppress(OSError):
            parts.append(os.readlink(path.parent / "..data"))
    return tuple(parts)


class ReloadingTLS:
    """A server `SSLContext` whose certificate chain follows its files."""

    def __init__(self, cert: Path, key: Path, on_reload: Counter | None = None) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.on_reload = on_reload
        self.log = structlog.get_logger().bind(component="admission-tls")
        self.seen = _signature([cert, key])
        try:
            self.context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ServerError(
                f"cannot load the webhook's certificate {cert} and key {key}: {_why(exc)}"
            ) from None

    def check(self) -> bool:
        """Load the pair again if its files changed; True when a new pair was loaded."""
        now = _signature([self.cert, self.key])
        if now == self.seen:
            return False
        try:
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            # half-rotated (a certificate without its key yet): the old pair serves on
            self.log.warning("admission.tls_reload_failed", cert=str(self.cert), error=_why(exc))
            if self.on_reload is not None:
                self.on_reload.labels("failed").inc()
            return False
        self.seen = now
        self.log.info("admission.tls_reloaded", cert=str(self.cert))
        if self.on_reload is not None:
            self.on_reload.labels("loaded").inc()
        return True


def _why(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())


class Metrics:
    """The webhook's metrics, in the daemon's registry; every label from a fixed set."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.reviews = Counter(
            "nodeward_admission_reviews",
            "AdmissionReviews answered, per outcome (mutated, unchanged, skipped, refused, "
            "malformed, not_ready, timeout) and whether it was a dry run (the request's, or "
            "the service's dry_run: the outcome it would have had)",
            ["outcome", "dry_run"],
            registry=registry,
        )
        self.mutations = Counter(
            "nodeward_admission_mutations",
            "Changes made to admitted pods (not dry runs), per kind: volume, mount, env, "
            "identity, rewrite",
            ["kind"],
            registry=registry,
        )
        self.refusals = Counter(
            "nodeward_admission_refusals",
            "Pods refused, per reason: uid, secret_ref, owner_unknown",
            ["reason"],
            registry=registry,
        )
        self.seconds = Histogram(
            "nodeward_admission_review_seconds",
            "Time to answer one AdmissionReview, body read included",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.tls_reloads = Counter(
            "nodeward_admission_tls_reloads",
            "Rotated certificate files loaded into the listener, per result (loaded, failed)",
            ["result"],
            registry=registry,
        )
        # Every series at 0 from the start: a decision's outcome in a dry run or not, a
        # review unanswered (caches not synced) likewise, one malformed or past the
        # deadline as not a dry run (the request was not read).
        at_zero(self.reviews, outcome=(*OUTCOMES, "not_ready"), dry_run=("true", "false"))
        at_zero(self.reviews, outcome=("malformed", "timeout"), dry_run=("false",))
        at_zero(self.refusals, reason=REFUSAL_REASONS)
        at_zero(self.tls_reloads, result=("loaded", "failed"))
        at_zero(self.mutations, kind=MUTATION_KINDS)


class AdmissionServer:
    """The webhook's HTTPS server. `start()` binds it; `url` says where."""

    def __init__(
        self,
        settings: AdmissionSettings,
        lookup: Lookup,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            raise ServerError(
                "the webhook needs tls_cert_file and tls_key_file: the API server calls "
                "webhooks over HTTPS only"
            )
        self.settings = settings
        self.lookup = lookup
        self.metrics = Metrics(registry)
        self.tls = ReloadingTLS(
            settings.tls_cert_file, settings.tls_key_file, self.metrics.tls_reloads
        )
        self.log = structlog.get_logger().bind(component="admission-webhook")
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._checker: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError("the webhook is not started")
        return self._port

    @property
    def url(self) -> str:
        """Where the review path is, e.g. `https://127.0.0.1:8443/mutate`."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(
            self.settings.host, self.settings.host
        )
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{self.port}{self.settings.path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(self.settings.path, self.review)
        self._runner, self._port = await listen(
            app,
            self.settings.host,
            self.settings.port,
            lambda why: ServerError(f"admission webhook: {why}"),
            ssl_context=self.tls.context,
        )
        self._checker = asyncio.get_running_loop().create_task(self._check_tls())
        self.log.info("admission.listening", url=self.url)

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
            self._checker = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _check_tls(self) -> None:
        interval = self.settings.tls_check_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            self.tls.check()

    # --- one review -----------------------------------------------------------------------

    async def review(self, request: web.Request) -> web.StreamResponse:
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.deadline.total_seconds()):
                return await self._review(request)
        except TimeoutError:
            self.metrics.reviews.labels("timeout", "false").inc()
            self.log.warning("admission.deadline_passed", path=request.path)
            return _line(503, "review not answered within the webhook's deadline")
        finally:
            self.metrics.seconds.observe(time.perf_counter() - began)

    async def _review(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            self.metrics.reviews.labels("malformed", "false").inc()
            return _line(415, f"expected Content-Type application/json, got {request.content_type}")
        limit = self.settings.max_body_bytes
        if (request.content_length or 0) > limit:
            return self._malformed(f"body of {request.content_length} bytes; at most {limit}")
        body = await _read(request, limit)
        if body is None:
            return self._malformed(f"body over {limit} bytes")
        try:
            review = parse_review(body)
        except BadReview as exc:
            return self._malformed(str(exc))
        dry = "true" if review.dry_run else "false"
        if not self.lookup.synced:
            self.metrics.reviews.labels("not_ready", dry).inc()
            return _line(503, "not ready: the namespace and Secret caches are not synced yet")
        decision = self._decide(review)
        if decision is None:
            self.metrics.reviews.labels("not_ready", dry).inc()
            return _line(503, f"namespace {review.namespace} is not in the cache yet")
        self._account(review, decision)
        return web.json_response(response(review.uid, decision, audit_only=self.settings.dry_run))

    def _decide(self, review: ReviewRequest) -> Decision | None:
        name = review.namespace or ""
        namespace = self.lookup.namespace(name)
        if namespace is None:
            if review.operation == "CREATE" and review.resource.resource == "pods":
                return None
            namespace = NamespaceView(name)
        return decide(review, namespace, self.lookup.credentials_in(name), self.settings)

    def _malformed(self, why: str) -> web.Response:
        self.metrics.reviews.labels("malformed", "false").inc()
        self.log.info("admission.malformed", why=why)
        return _line(400, why)

    def _account(self, review: ReviewRequest, decision: Decision) -> None:
        dry = review.dry_run or self.settings.dry_run
        self.metrics.reviews.labels(decision.outcome, "true" if dry else "false").inc()
        context = {"pod": decision.pod, "review": review.uid, "dry_run": dry}
        if decision.outcome == "refused":
            self.metrics.refusals.labels(decision.reason).inc()
            self.log.info(
                "admission.refused", reason=decision.reason, message=decision.message, **context
            )
        elif decision.outcome == "mutated":
            if not dry:
                for kind, n in decision.mutations.items():
                    self.metrics.mutations.labels(kind).inc(n)
            self.log.info(
                "admission.mutated",
                paths=decision.paths,
                mutations=dict(decision.mutations),
                **context,
            )
        else:
            self.log.debug("admission.admitted", outcome=decision.outcome, **context)


async def _read(request: web.Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def _line(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=" ".join(text.split()) + "\n")
