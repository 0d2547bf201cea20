"""The admission webhook's throughput and latency over HTTPS, against a bare aiohttp echo.

Each case serves from a process of its own (as its Deployment would run it) and is loaded
from this one by aiohttp, `--concurrency` requests in flight over TLS (verifying the CA
the bench made), `--requests` AdmissionReviews of one pod CREATE per run:

- echo: a bare aiohttp HTTPS server that reads the review, parses its JSON and answers
  `allowed` for its uid: the floor any webhook on this stack starts from;
- webhook: `services.admission.server.AdmissionServer`, its cache holding the namespace
  (opted in, an owner with uid, gid and groups) and two credential Secrets, so each review
  is decided and answered with its JSONPatch (volumes, mounts, env, identity).

Prints reviews per second and p50/p99 latency, medians over `--runs`, and webhook / echo.

    python bench/admission.py [--requests 5000] [--concurrency 50] [--runs 3]
"""

from __future__ import annotations

import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import options

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402 - after the path is set
from aiohttp import web  # noqa: E402

from nodeward import certs  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from services.admission.cache import ClusterCache  # noqa: E402
from services.admission.server import AdmissionServer  # noqa: E402
from services.admission.settings import AdmissionSettings  # noqa: E402

NAMESPACE = "team-a"


def review() -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": NAMESPACE, "labels": {"app": "x"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "python:3.12", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "busybox"},
            ],
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "object": pod,
        },
    }


def filled_cache() -> ClusterCache:
    cache = ClusterCache()
    labels = {
        "nodeward.io/admission": "enabled",
        "nodeward.io/owner": "ada",
        "nodeward.io/owner-uid": "1234",
        "nodeward.io/owner-gid": "500",
    }
    annotations = {"nodeward.io/owner-groups": "physics=500,gpu=700"}
    cache.replace_namespaces(
        [{"metadata": {"name": NAMESPACE, "labels": labels, "annotations": annotations}}]
    )
    cache.replace_secrets(
        [
            {
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": {"nodeward.io/credential": kind},
                }
            }
            for name, kind in (("krb", "kerberos"), ("token", "oauth2"))
        ]
    )
    return cache


async def serve(case: str, cert: Path, key: Path) -> None:
    """Serve `case` until stdin closes; print the review URL first."""
    configure_logging("warning")
    settings = AdmissionSettings(host="127.0.0.1", port=0, tls_cert_file=cert, tls_key_file=key)
    if case == "webhook":
        server = AdmissionServer(settings, filled_cache())
        await server.start()
        url = server.url
    else:

        async def echo(request: web.Request) -> web.Response:
            body = json.loads(await request.read())
            answer = {"uid": body["request"]["uid"], "allowed": True}
            return web.json_response(
                {"apiVersion": body["apiVersion"], "kind": body["kind"], "response": answer}
            )

        app = web.Application()
        app.router.add_post("/mutate", echo)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/mutate"
    print(url, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def load(url: str, ca: bytes, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """(reviews per second, latencies in seconds) of `requests` reviews, `concurrency` at once."""
    context = ssl.create_default_context(cadata=ca.decode())
    bodies = [json.dumps(review()).encode() for _ in range(requests)]
    latencies: list[float] = []
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                began = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as reply:
                    answer = await reply.json()
                    assert reply.status == 200 and answer["response"]["allowed"], answer
                latencies.append(time.perf_counter() - began)

        # warm the connections (TLS handshakes) before the clock starts
        await asyncio.gather(
            *(session.post(url, data=bodies[0], headers=headers) for _ in range(concurrency))
        )
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return requests / elapsed, latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_case(
    case: str, tmp: Path, ca: bytes, requests: int, concurrency: int
) -> tuple[float, float, float]:
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, read once
        [
            sys.executable,
            __file__,
            "--serve",
            case,
            "--cert",
            str(tmp / "tls.crt"),
            "--key",
            str(tmp / "tls.key"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        rate, latencies = await load(url, ca, requests, concurrency)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    return rate, pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000


async def main() -> None:
    parser = options(__doc__.splitlines()[0], requests=5000, concurrency=50, runs=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as name:
        tmp = Path(name)
        ca = certs.authority("bench CA")
        certs.serving(ca, ["127.0.0.1"], tmp / "tls.crt", tmp / "tls.key")
        results: dict[str, list[tuple[float, float, float]]] = {"echo": [], "webhook": []}
        for run in range(args.runs):
            for case in ("echo", "webhook"):
                found = await one_case(case, tmp, ca.pem, args.requests, args.concurrency)
                results[case].append(found)
                print(
                    f"run {run + 1} {case:8s} {found[0]:8.0f} reviews/s  "
                    f"p50 {found[1]:6.2f} ms  p99 {found[2]:6.2f} ms",
                    flush=True,
                )
    medians = {
        case: tuple(statistics.median(r[i] for r in rows) for i in range(3))
        for case, rows in results.items()
    }
    print()
    print(f"{args.requests} reviews, {args.concurrency} in flight, medians of {args.runs} runs")
    print(f"{'case':10s} {'reviews/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for case, (rate, p50, p99) in medians.items():
        print(f"{case:10s} {rate:10.0f} {p50:8.2f} {p99:8.2f}")
    echo, hook = medians["echo"], medians["webhook"]
    print(f"webhook / echo: throughput {hook[0] / echo[0]:.2f}x, p99 {hook[2] / echo[2]:.2f}x")


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve_args = options("serve one case")
        serve_args.add_argument("--serve")
        serve_args.add_argument("--cert", type=Path)
        serve_args.add_argument("--key", type=Path)
        given = serve_args.parse_args()
        asyncio.run(serve(given.serve, given.cert, given.key))
    else:
        asyncio.run(main())
