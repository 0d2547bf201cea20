"""Benchmark: the series every daemon of `nodeward up --scenario none` exposes, per metric
family and component, at several fleet sizes, against the cardinality budget
(`launch/observability/budget.yaml`, docs/cardinality.md).

For each size it starts `nodeward up --nodes N` from a fresh state directory, waits until
every daemon's `/readyz` answers 200 (or `--ready-timeout` passes: then it measures what
runs, naming the daemons not ready), then scrapes every daemon's `/metrics` every `--every`
seconds until two scrapes in a row hold as many series (or `--settle` passes), and counts
the last one (`launch.observability.budget.count`).

Up to `--fleet-above` GPU nodes each node's agents run for real on simulated hardware; above
it the fleet simulator publishes their events and no agent serves `/metrics`. At those
sizes an agent family's total is extrapolated (marked `~`) from the largest size measured
for real: the seed's own nodes (with their workloads) as measured, plus each node beyond
them (a clone of a seed node's shape, in turn, with only its agents' pod:
`sim.cluster.resize`) at the clones' mean. A service's "per node" is the slope between the
smallest and the largest size, its "fixed" the rest.

Prints, per family and component, the series per node, the fixed part and the total at each
size; the totals with and without prometheus_client's `_created` series (one per counter
series and per histogram; `nodeward.metrics.Exposed` serves none); and the budget's
violations at each size. `--save DIR` keeps every scrape, `--json FILE` the counts,
`--markdown FILE` docs/cardinality.md's table (the budget beside the figures).

    python bench/cardinality.py [--sizes 8,32,256,1000,5000] [--ready-timeout 600] [--settle 180]
                                [--save DIR] [--json FILE] [--markdown FILE --columns 8,256,5000]
    python bench/cardinality.py --from DIR --sizes ...   # count saved scrapes again
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the bench imports the project
    sys.path.insert(0, str(REPO))

from launch.observability.budget import (  # noqa: E402
    AGENT,
    EVERY,
    Counts,
    Limit,
    Tally,
    count,
    load,
    violations,
)
from launch.sim_agents.fleet import FLEET_ABOVE  # noqa: E402
from sim.cluster.seed import load_seed  # noqa: E402


@dataclass
class Measured:
    nodes: int
    counts: Counts
    ready_s: float | None
    unready: list[str] = field(default_factory=list)
    scrapes: int = 0
    error: str | None = None
    texts: dict[str, str] = field(default_factory=dict)
    """The last scrape of each daemon."""


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _ready(url: str) -> bool:
    return _get(f"{url}/readyz", timeout=5)[0] == 200


def _scrape(daemons: dict[str, str]) -> dict[str, str]:
    """Each daemon's exposition (those that answer)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        texts = pool.map(lambda u: _get(f"{u}/metrics"), daemons.values())
        got = dict(zip(daemons, texts, strict=True))
    return {name: text for name, (status, text) in got.items() if status == 200}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(nodes: int, args: argparse.Namespace) -> Measured:
    """`up --nodes N --scenario none`, scraped once its series hold still."""
    tmp = Path(tempfile.mkdtemp(prefix=f"nodeward-cardinality-{nodes}-"))
    state = tmp / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env |= {"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "launch", "up", "--state-dir", str(state)]
    command += ["--nodes", str(nodes), "--fleet-above", str(args.fleet_above)]
    command += ["--scenario", "none", "--quiet"]
    began = time.monotonic()
    log = (tmp / "up.log").open("w")
    proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=log)
    result = Measured(nodes, count({}), None)
    try:
        endpoints = state / "endpoints.json"
        while not endpoints.exists():
            if proc.poll() is not None or time.monotonic() - began > args.ready_timeout:
                result.error = f"no endpoints.json (up exited {proc.poll()}); see {tmp}/up.log"
                return result
            time.sleep(1)
        daemons: dict[str, str] = json.loads(endpoints.read_text())["metrics"]
        while True:
            unready = [name for name, url in daemons.items() if not _ready(url)]
            if not unready:
                result.ready_s = time.monotonic() - began
                break
            if proc.poll() is not None:
                result.error = f"up exited {proc.returncode}; see {tmp}/up.log"
                return result
            if time.monotonic() - began > args.ready_timeout:
                result.unready = unready
                break
            time.sleep(2)
        print(
            f"  {nodes:,} nodes: {len(daemons)} daemons, "
            + (f"ready in {result.ready_s:.0f} s" if result.ready_s else f"unready {unready}"),
            flush=True,
        )
        settled_from = time.monotonic()
        last, scrapes = -1, {}
        while True:
            scrapes = _scrape(daemons)
            result.scrapes += 1
            counts = count(scrapes)
            total = counts.series()
            print(f"    scrape {result.scrapes}: {total:,} series", flush=True)
            if total == last or time.monotonic() - settled_from > args.settle:
                break
            last = total
            time.sleep(args.every)
        result.counts, result.texts = counts, scrapes
        if args.save:
            folder = Path(args.save) / str(nodes)
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in scrapes.items():
                (folder / f"{name}.txt").write_text(text)
        return result
    finally:
        _stop(proc)
        log.close()
        if result.error is None:
            shutil.rmtree(tmp, ignore_errors=True)


# -- the report ------------------------------------------------------------------------------


def _agent(component: str) -> bool:
    return component.startswith("agent-")


def _rows(measured: list[Measured]) -> dict[tuple[str, str], dict[int, Tally]]:
    rows: dict[tuple[str, str], dict[int, Tally]] = {}
    for m in measured:
        for family, by in m.counts.families.items():
            for component, tally in by.items():
                rows.setdefault((family, component), {})[m.nodes] = tally
    return dict(sorted(rows.items()))


def _node(daemon: str) -> str | None:
    """The node of an agent's daemon (`agent-<kind>-<node>`); None for a service's."""
    match = AGENT.match(daemon)
    return daemon[len(match.group(1)) + 1 :] if match else None


@dataclass(frozen=True)
class Extrapolation:
    """The agents measured for real, split into the seed's nodes and the clones beyond."""

    seed: Counts
    clones: Counts

    def total(self, family: str, component: str, nodes: int) -> tuple[float, float] | None:
        """(series, with `_created`) of an agent family at `nodes`."""
        seed = self.seed.families.get(family, {}).get(component)
        clone = self.clones.families.get(family, {}).get(component)
        seeded = self.seed.daemons.get(component, 0)
        cloned = self.clones.daemons.get(component, 0)
        if seed is None or (nodes > seeded and not cloned):
            return None
        extra = max(nodes - seeded, 0) / max(cloned, 1)
        series = seed.series + (clone.series * extra if clone else 0.0)
        created = seed.created + (clone.created * extra if clone else 0.0)
        return series, series + created


def extrapolation(measured: list[Measured]) -> Extrapolation | None:
    """From the largest size whose agents ran for real."""
    real = [m for m in measured if m.counts.daemons.get("agent-gpu") and m.texts]
    if not real:
        return None
    largest = max(real, key=lambda m: m.nodes)
    seed = {n.name for n in load_seed().nodes if n.gpu is not None and n.gpu.count > 0}
    agents = {d: t for d, t in largest.texts.items() if _node(d) is not None}
    return Extrapolation(
        seed=count({d: t for d, t in agents.items() if _node(d) in seed}),
        clones=count({d: t for d, t in agents.items() if _node(d) not in seed}),
    )


def _totals(
    rows: dict[tuple[str, str], dict[int, Tally]], sizes: list[int], ex: Extrapolation | None
) -> dict[tuple[str, str], dict[int, tuple[float, bool, float]]]:
    """(family, component) -> size -> (total, extrapolated, with `_created`)."""
    out: dict[tuple[str, str], dict[int, tuple[float, bool, float]]] = {}
    for key, by in rows.items():
        out[key] = {}
        for n in sizes:
            if n in by:
                t = by[n]
                out[key][n] = (t.series, False, t.series + t.created)
            elif _agent(key[1]) and ex is not None:
                got = ex.total(key[0], key[1], n)
                if got is not None:
                    out[key][n] = (got[0], True, got[1])
    return out


def markdown(
    totals: dict[tuple[str, str], dict[int, tuple[float, bool, float]]], sizes: list[int]
) -> str:
    """docs/cardinality.md's table: each family's budget (per node, fixed, total at each
    size) beside what was measured (the deployed components only; `~`: agents
    extrapolated), and the totals."""
    budget = load()
    deployed = {name for name, c in budget.components.items() if c.deployed}
    head = ["family", "exposed by", "per node", "fixed"]
    head += [f"budget {n:,}" for n in sizes] + [f"measured {n:,}" for n in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    sums = [0.0] * (2 + 2 * len(sizes))
    for name, family in sorted(budget.families.items()):
        limits: dict[str, Limit] = {}
        for c in sorted(deployed):
            lim = family.limit(c)
            if lim is not None and lim.at(1):
                limits[c] = lim
        node = sum(
            lim.at(1) if budget.components[c].scope == "node" else lim.per_node
            for c, lim in limits.items()
        )
        fixed = sum(lim.fixed for c, lim in limits.items() if budget.components[c].scope == "fleet")
        allowed = [sum(budget.limit(name, c, n) or 0 for c in limits) for n in sizes]
        measured: list[float] = []
        rough: list[bool] = []
        for n in sizes:
            got = [v[n] for (f, c), v in totals.items() if f == name and c in deployed and n in v]
            measured.append(sum(g[0] for g in got))
            rough.append(any(g[1] and g[0] for g in got))
        every = set(limits) == {c for c in deployed if family.limit(c) is not None}
        who = "every daemon" if EVERY in family.limits and every and len(limits) > 3 else None
        cells = [f"`{name}`", who or ", ".join(limits), f"{node:,}", f"{fixed:,}"]
        cells += [f"{a:,}" for a in allowed]
        cells += [("~" if r else "") + f"{m:,.0f}" for m, r in zip(measured, rough, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
        for i, v in enumerate([node, fixed, *allowed, *measured]):
            sums[i] += v
    lines.append("| **all** | | " + " | ".join(f"**{v:,.0f}**" for v in sums) + " |")
    return "\n".join(lines) + "\n"


def report(measured: list[Measured], columns: list[int] | None = None) -> dict[str, object]:
    sizes = [m.nodes for m in measured]
    real_sizes = [m.nodes for m in measured if m.counts.daemons.get("agent-gpu")]
    real = max(real_sizes) if real_sizes else None
    rows = _rows(measured)
    totals = _totals(rows, sizes, extrapolation(measured))
    services = [m.nodes for m in measured if m.error is None]
    low, high = (min(services), max(services)) if services else (0, 0)
    head = f"{'family':<46} {'component':<16} {'per node':>9} {'fixed':>7}"
    print("\n" + head + "".join(f" {n:>10,}" for n in sizes))
    table: list[dict[str, object]] = []
    for (family, component), by in rows.items():
        if _agent(component):
            t = by[real] if real in by else next(iter(by.values()))
            per, fixed = t.series / max(t.daemons, 1), 0.0
            per_text = f"{per:.1f}" + (f"/{t.largest}" if t.largest != round(per) else "")
        else:
            a = by.get(low)
            b = by.get(high)
            sa, sb = (a.series if a else 0), (b.series if b else 0)
            per = (sb - sa) / (high - low) if high > low else 0.0
            fixed = sa - per * low
            per_text = f"{per:.2f}" if per else "-"
        cells = []
        for n in sizes:
            got = totals[(family, component)].get(n)
            cells.append(" " * 10 if got is None else f"{('~' if got[1] else '')}{got[0]:,.0f}")
        print(
            f"{family:<46} {component:<16} {per_text:>9} {fixed:>7.0f}"
            + "".join(f" {c:>10}" for c in cells)
        )
        table.append(
            {
                "family": family,
                "component": component,
                "per_node": round(per, 3),
                "fixed": round(fixed, 1),
                "total": {str(n): v[0] for n, v in totals[(family, component)].items()},
                "extrapolated": [n for n, v in totals[(family, component)].items() if v[1]],
            }
        )
    print()
    summary: dict[str, object] = {}
    try:
        budget = load()
    except Exception as exc:  # noqa: BLE001 - the figures still count
        print(f"the budget does not load: {exc}")
        budget = None
    for m in measured:
        without = sum(v[m.nodes][0] for v in totals.values() if m.nodes in v)
        with_created = sum(v[m.nodes][2] for v in totals.values() if m.nodes in v)
        agents = sum(v[m.nodes][0] for k, v in totals.items() if m.nodes in v and _agent(k[1]))
        served = m.counts.created_served()
        print(
            f"{m.nodes:>6,} nodes: {without:>12,.0f} series ({agents:,.0f} of agents"
            + (", extrapolated" if m.nodes not in real_sizes else "")
            + f"); with `_created` {with_created:,.0f} (saved {with_created - without:,.0f},"
            f" {100 * (with_created - without) / max(with_created, 1):.0f} %);"
            f" `_created` served: {served}"
            + (f"; ready in {m.ready_s:.0f} s" if m.ready_s else f"; not ready: {m.unready}")
            + (f"; ERROR {m.error}" if m.error else "")
        )
        broken = violations(budget, m.counts, m.nodes) if budget else []
        for line in broken:
            print(f"         over budget: {line}")
        summary[str(m.nodes)] = {
            "series": without,
            "agents": agents,
            "with_created": with_created,
            "created_served": served,
            "ready_s": m.ready_s,
            "unready": m.unready,
            "error": m.error,
            "violations": broken,
            "daemons": dict(m.counts.daemons),
        }
    return {
        "sizes": sizes,
        "agents_measured_at": real,
        "rows": table,
        "summary": summary,
        "markdown": markdown(totals, [n for n in sizes if columns is None or n in columns]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="8,32,256,1000,5000", help="GPU node counts, comma-separated"
    )
    parser.add_argument("--fleet-above", type=int, default=FLEET_ABOVE)
    parser.add_argument("--ready-timeout", type=float, default=600)
    parser.add_argument("--settle", type=float, default=180, help="most seconds to settle")
    parser.add_argument("--every", type=float, default=15, help="seconds between scrapes")
    parser.add_argument("--save", help="a folder for every scrape, one per size")
    parser.add_argument("--json", help="a file for the counts and the table")
    parser.add_argument("--from", dest="saved", help="count a --save folder again, run nothing")
    parser.add_argument("--markdown", help="a file for docs/cardinality.md's table")
    parser.add_argument("--columns", help="the sizes the table shows (default: every one)")
    args = parser.parse_args()
    measured = []
    for nodes in (int(n) for n in args.sizes.split(",")):
        if args.saved:
            folder = Path(args.saved) / str(nodes)
            texts = {f.stem: f.read_text() for f in sorted(folder.glob("*.txt"))}
            measured.append(Measured(nodes, count(texts), None, texts=texts))
            continue
        print(f"up --nodes {nodes}", flush=True)
        measured.append(measure(nodes, args))
    columns = [int(n) for n in args.columns.split(",")] if args.columns else None
    out = report(measured, columns)
    if args.markdown:
        Path(args.markdown).write_text(str(out["markdown"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
