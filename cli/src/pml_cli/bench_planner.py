"""`pml bench planner`: DR-DSP query latency and incremental-update cost, in-process.

A synthetic hypergraph of N hyperedges with the shape of a real catalog: N/5 tools (grouped by
server), 40 % capability hyperedges of 2–5 members (one in seven a meta-capability over earlier
capabilities and tools), 60 % learned links between nearby tools (sequence and dependency,
observed / inferred / template), success rates for three nodes in four.

- `forward_*`: `forward(current_tool, target_capability)` from one of the `kept` sources, to a
  random capability; `dag_*`: `dependency_dag(target)` for one of `kept` random capabilities.
  All after warm-up: the trees of the kept sources are built.
- `cold_tree_ms`: building one tree from scratch (the first query from a new source).
- `update_*`: one random change (reweight 60 %, remove 20 %, re-add 20 %) through the planner,
  repairing all `kept` trees; `recompute_p50_ms`: rebuilding the same trees from scratch;
  `update_speedup` = recompute_p50 / update_p50 (and `update_speedup_mean` on means, which the
  rare large repairs weigh on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console

from pml_cli.phases import phase
from pml_planner.drdsp import DRDSP
from pml_planner.hypergraph import (
    Hyperedge,
    Hypergraph,
    capability_cost,
    capability_hyperedge,
    link_hyperedge,
)

#: Tools per server: capabilities and links mostly stay within a few neighbouring servers.
SERVER_SIZE = 8
#: How far (in tool index) a capability's members and a link's ends usually lie apart.
LOCALITY = 24


def bench_planner(
    hyperedges: int,
    queries: int,
    console: Console,
    *,
    kept: int = 8,
    recompute_rounds: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    with phase(console, f"building a hypergraph of {hyperedges} hyperedges"):
        edges, tools, capabilities = synthetic_hyperedges(hyperedges, rng)
        started = time.perf_counter()
        graph = Hypergraph(edges)
        build_s = time.perf_counter() - started
    planner = DRDSP(graph, max_sources=kept)
    sources = [tools[i] for i in rng.choice(len(tools), kept, replace=False)]
    targets = [capabilities[i] for i in rng.choice(len(capabilities), kept, replace=False)]
    with phase(console, f"warm-up: building the {kept} kept trees"):
        cold = [_time(planner.forward_tree, s) for s in sources]

    with phase(console, f"measured: {queries} forward and DAG queries each"):
        # the random picks are drawn beforehand, so that the timings hold the queries alone
        froms = [sources[i] for i in rng.integers(kept, size=queries)]
        intos = [targets[i] for i in rng.integers(kept, size=queries)]
        caps = [capabilities[i] for i in rng.integers(len(capabilities), size=queries)]
        forward = [_time(planner.forward, s, c) for s, c in zip(froms, caps, strict=True)]
        dag = [_time(planner.dependency_dag, t) for t in intos]

    update_rounds = max(50, queries)
    with phase(console, f"measured: {update_rounds} incremental updates"):
        updates = _updates(planner, rng, update_rounds)
    with phase(console, f"measured: {recompute_rounds} full recomputes of {kept} trees"):
        recompute = [_time(planner.recompute_all) for _ in range(recompute_rounds)]

    update_p50 = float(np.median(updates))
    recompute_p50 = float(np.median(recompute))
    return {
        "hyperedges": len(edges),
        "tools": len(tools),
        "capabilities": len(capabilities),
        "vertices": sum(1 for _ in graph.vertices),
        "arcs": sum(len(a) for a in graph.out_arcs.values()),
        "kept_trees": kept,
        "build_s": round(build_s, 2),
        "cold_tree_ms": _ms(float(np.median(cold))),
        "forward_p50_ms": _ms(float(np.median(forward))),
        "forward_p99_ms": _ms(float(np.percentile(forward, 99))),
        "dag_p50_ms": _ms(float(np.median(dag))),
        "dag_p99_ms": _ms(float(np.percentile(dag, 99))),
        "update_p50_ms": _ms(update_p50),
        "update_p99_ms": _ms(float(np.percentile(updates, 99))),
        "update_mean_ms": _ms(float(np.mean(updates))),
        "recompute_p50_ms": _ms(recompute_p50),
        "update_speedup": round(recompute_p50 / max(update_p50, 1e-9), 1),
        "update_speedup_mean": round(recompute_p50 / max(float(np.mean(updates)), 1e-9), 1),
    }


def synthetic_hyperedges(
    count: int, rng: np.random.Generator
) -> tuple[list[Hyperedge], list[str], list[str]]:
    """(hyperedges, tool ids, capability ids): a catalog-shaped hypergraph of `count` edges."""
    n_tools = max(SERVER_SIZE, count // 5)
    tools = [f"srv{i // SERVER_SIZE}:tool{i}" for i in range(n_tools)]
    tool_rates = _success_rates(n_tools, rng)
    n_caps = max(1, count * 2 // 5)
    n_meta = n_caps // 7
    capabilities = [f"cap{c}" for c in range(n_caps)]
    cap_rates = _success_rates(n_caps, rng)
    edges: list[Hyperedge] = []
    for c in range(n_caps):
        size = int(rng.integers(2, 6))
        if c >= n_caps - n_meta and c > 0:
            # a meta-capability: 1–2 earlier capabilities (so nesting stays acyclic) + tools
            subs = min(int(rng.integers(1, 3)), c)
            members = [capabilities[int(i)] for i in rng.choice(c, subs, replace=False)]
            size = max(size - subs, 1)
        else:
            members = []
        base = int(rng.integers(n_tools))
        offsets = rng.choice(LOCALITY, min(size, LOCALITY), replace=False)
        members += [tools[(base + int(o)) % n_tools] for o in offsets]
        edges.append(capability_hyperedge(capabilities[c], members, cap_rates[c]))
    seen: set[tuple[int, int]] = set()
    while len(edges) < count:
        src = int(rng.integers(n_tools))
        if rng.random() < 0.1:  # now and then a link across the catalog
            dst = int(rng.integers(n_tools))
        else:
            dst = (src + int(rng.integers(1, LOCALITY))) % n_tools
        if src == dst or (src, dst) in seen:
            continue
        seen.add((src, dst))
        kind = "sequence" if rng.random() < 0.8 else "dependency"
        source = str(rng.choice(["observed", "inferred", "template"], p=[0.5, 0.35, 0.15]))
        edges.append(link_hyperedge(tools[src], tools[dst], kind, source, tool_rates[dst]))
    return edges, tools, capabilities


def _success_rates(n: int, rng: np.random.Generator) -> list[float | None]:
    rates = rng.beta(8.0, 2.0, size=n)
    executed = rng.random(n) < 0.75
    return [float(r) if e else None for r, e in zip(rates, executed, strict=True)]


def _updates(planner: DRDSP, rng: np.random.Generator, rounds: int) -> list[float]:
    """Time `rounds` random changes, keeping the graph's size steady."""
    live = [e.id for e in planner.graph.edges()]
    removed: list[Hyperedge] = []
    timings: list[float] = []
    for _ in range(rounds):
        roll = rng.random()
        if roll < 0.2 and removed:
            edge = removed.pop(int(rng.integers(len(removed))))
            live.append(edge.id)
            timings.append(_time(planner.add, edge))
        elif roll < 0.4:
            slot = int(rng.integers(len(live)))
            live[slot], live[-1] = live[-1], live[slot]
            edge = planner.graph.edge(live.pop())
            removed.append(edge)
            timings.append(_time(planner.remove, edge.id))
        else:
            edge = planner.graph.edge(live[int(rng.integers(len(live)))])
            # a new success rate: what an execution report does to a node
            cost = edge.cost * capability_cost(float(rng.beta(8.0, 2.0))) / capability_cost(0.8)
            timings.append(_time(planner.reweight, edge.id, cost))
    return timings


def _time(call: Callable[..., object], *args: Any) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
