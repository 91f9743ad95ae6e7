"""The tenant's graph as the executions judged so far made it: what the prequential judge plans
with.

The trainer learns from an execution on its own consumer group, often before the planner judges
it, and in an evaluation that publishes hundreds of runs at once, long before: the graph the
planner holds then has the links and statistics of that run and of later ones, and the methods
that follow them are judged on runs they have already learned (ETOM's workflow split: the blend
took the transitions' weight on figures 4.8 points above search's order on new work, then lost
8.6 on the unseen tasks). So the judge plans with a view of the graph in which what executions
teach (node statistics, and the counts, sources and weights of LINKs) comes from the executions
it has judged, in the order it judged them (`RunTally`, kept in Redis beside the figures and
added in the same transaction), and what they do not teach (nodes, capabilities and their
members, cold-start guesses) from the graph as it stands. The rules of what an execution changes
are the trainer's own (`pml_common.graph_statistics`).

Two approximations: a cold-start guess that a run not yet judged has observed comes back at its
source's nominal weight (the trainer drops the guess's factor on the first observation); the
SHGAT scores of the scorer's capabilities are those of the model served when the run is judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import cast, get_args

from pml_common.edge_weights import edge_weight
from pml_common.events import ExecutionCompleted
from pml_common.graph_statistics import (
    EdgeKey,
    EdgeOrigin,
    EdgeSource,
    EdgeState,
    EdgeType,
    execution_effect,
    observe,
    success_rate,
)
from pml_planner.graph_source import LinkInfo, NodeInfo, PlannerGraph

#: Separates the parts of a tally's field names: a control character, which ids never hold.
_SEP = "\x1f"
#: The tally's field counting the runs it holds.
RUNS = "runs"


@dataclass(frozen=True)
class NodeTally:
    executions: int = 0
    successes: int = 0
    last_used_at: datetime | None = None


@dataclass(frozen=True)
class RunTally:
    """What a tenant's judged executions taught: runs observing each edge, node outcomes."""

    edges: Mapping[EdgeKey, int] = field(default_factory=dict)
    nodes: Mapping[str, NodeTally] = field(default_factory=dict)

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> RunTally:
        """The tally stored as the Redis hash `increments` builds."""
        edges: dict[EdgeKey, int] = {}
        nodes: dict[str, dict[str, float]] = {}
        for name, value in fields.items():
            kind, *parts = name.split(_SEP)
            if kind == "e" and len(parts) == 3 and parts[2] in get_args(EdgeType):
                edge = EdgeKey(parts[0], parts[1], cast(EdgeType, parts[2]))
                edges[edge] = round(float(value))
            elif kind == "n" and len(parts) == 2:
                nodes.setdefault(parts[0], {})[parts[1]] = float(value)
        return cls(edges, {n: _node_tally(v) for n, v in nodes.items()})


def increments(event: ExecutionCompleted) -> tuple[dict[str, int], dict[str, float]]:
    """What `event` adds to its tenant's stored tally: (HINCRBY counts, HSET last-used times)."""
    effect = execution_effect(event)
    counts = {_SEP.join(("e", e.src, e.dst, e.type)): 1 for e in effect.edges}
    used: dict[str, float] = {}
    updates = [*effect.step_updates]
    if effect.capability_update is not None:
        updates.append(effect.capability_update)
    for update in updates:
        counts[_SEP.join(("n", update.node_id, "executions"))] = update.executions
        counts[_SEP.join(("n", update.node_id, "successes"))] = update.successes
        used[_SEP.join(("n", update.node_id, "last_used"))] = event.occurred_at.timestamp()
    return counts, used


def as_judged(graph: PlannerGraph, tally: RunTally) -> PlannerGraph:
    """`graph` with what executions teach taken from `tally` instead."""
    nodes = {node: _judged_node(info, tally.nodes.get(node)) for node, info in graph.nodes.items()}
    links: list[LinkInfo] = []
    known: set[EdgeKey] = set()
    for link in graph.links:
        known.add(key := _key(link))
        if (judged := _judged_link(link, tally.edges.get(key, 0))) is not None:
            links.append(judged)
    links += [
        _link(key, EdgeState("inferred", "execution", 0), count)
        for key, count in tally.edges.items()
        if key not in known and key.src in nodes and key.dst in nodes
    ]
    return replace(graph, nodes=nodes, links=tuple(links))


def _judged_node(info: NodeInfo, tally: NodeTally | None) -> NodeInfo:
    tally = tally or NodeTally()
    return replace(
        info,
        executions=tally.executions,
        success_rate=success_rate(tally.successes, tally.executions),
        last_used_at=tally.last_used_at,
    )


def _judged_link(link: LinkInfo, count: int) -> LinkInfo | None:
    """The link after the `count` judged runs that observed it; None when only runs not yet
    judged created it."""
    if link.origin == "execution":
        return _link(_key(link), EdgeState("inferred", "execution", 0), count) if count else None
    if link.count == 0 and count == 0:
        return link  # a guess nothing has observed: as stored (most links of a large catalog)
    if link.count == 0:
        guess = EdgeState(_source(link.source), _origin(link.origin), 0, link.factor)
    else:  # observed since: the guess's source is known, its factor is not
        source: EdgeSource = "template" if link.origin == "template" else "inferred"
        guess = EdgeState(source, _origin(link.origin), 0)
    return _link(_key(link), guess, count)


def _link(key: EdgeKey, guess: EdgeState, count: int) -> LinkInfo:
    state = guess
    for _ in range(count):
        state = observe(state)
    weight = edge_weight(key.type, state.source, state.factor)
    return LinkInfo(
        key.src, key.dst, key.type, state.source, count, weight, state.origin, state.factor
    )


def _key(link: LinkInfo) -> EdgeKey:
    return EdgeKey(link.src, link.dst, cast(EdgeType, link.type))


def _source(source: str) -> EdgeSource:
    return cast(EdgeSource, source) if source in get_args(EdgeSource) else "inferred"


def _origin(origin: str) -> EdgeOrigin:
    return cast(EdgeOrigin, origin) if origin in get_args(EdgeOrigin) else "execution"


def _node_tally(values: Mapping[str, float]) -> NodeTally:
    used = values.get("last_used")
    return NodeTally(
        executions=round(values.get("executions", 0.0)),
        successes=round(values.get("successes", 0.0)),
        last_used_at=datetime.fromtimestamp(used, UTC) if used is not None else None,
    )
