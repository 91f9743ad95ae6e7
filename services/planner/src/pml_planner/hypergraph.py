"""The planner's directed hypergraph of tools and capabilities, and its dimension reduction.

A hyperedge `e` needs every vertex of its tail and provides every vertex of its head, at a
positive cost. A capability is one hyperedge: its members (tools and sub-capabilities) → the
capability. A learned link (ADR-038 §2.3: sequence, dependency, contains) is a 1 → 1 hyperedge.

DR-DSP (Gao, Zhao, Ren, Swami, Ramanathan, Bar-Noy, "Dynamic Shortest Path Algorithms for
Hypergraphs", arXiv:1202.0082) searches the *underlying* directed graph instead of the
hypergraph: one arc u → v for every u ∈ tail(e), v ∈ head(e), u ≠ v, weighted by the cheapest
hyperedge covering the pair. Each pair keeps a heap of the hyperedges covering it, so a change
to one hyperedge touches only its |tail|·|head| pairs, each in O(log k), and reports exactly
the arcs whose weight (or cheapest hyperedge) changed; the shortest-path trees built on top
(`pml_planner.drdsp`) repair themselves from that report alone.

Costs live in this module only (`capability_cost`, `link_cost`, `reliability_cost`): a
cost is `1 / weight`, so reliable, well-evidenced relations are cheap and preferred.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from pml_common.edge_weights import TYPE_WEIGHT, edge_weight

Vertex = str
HyperedgeKind = Literal["capability", "dependency", "contains", "sequence"]

# --- costs (ADR-038 §2.3, seed 000) --------------------------------------------------------

#: Success rate below which a node counts as this unreliable and no less: a node that always
#: failed stays plannable as a last resort (cost 20, not infinite), and costs stay bounded so
#: path sums remain well conditioned.
MIN_SUCCESS_RATE = 0.05
#: Success rate assumed for a node never executed: no evidence, no penalty (the convention of
#: unified search, ADR-051, where reliability is 1.0 before any execution).
NEUTRAL_SUCCESS_RATE = 1.0


def reliability_cost(success_rate: float | None) -> float:
    """1 / success rate, the rate floored at MIN_SUCCESS_RATE; neutral (1.0) when unknown."""
    rate = NEUTRAL_SUCCESS_RATE if success_rate is None else success_rate
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"success rate must be in [0, 1], got {rate}")
    return 1.0 / max(rate, MIN_SUCCESS_RATE)


def capability_cost(success_rate: float | None) -> float:
    """Cost of achieving a capability from its members: its own unreliability."""
    return reliability_cost(success_rate)


def link_cost(
    edge_type: str,
    source: str,
    success_rate_of_dst: float | None = None,
    factor: float = 1.0,
) -> float:
    """`1 / (TYPE_WEIGHT × SOURCE_MULTIPLIER × factor)`, times the destination's unreliability.

    `factor` is the trainer's extra scale of cold-start guesses (1.0 for evidence). Scaling by
    the destination keeps a well-trodden link into a node that usually fails from looking
    cheap: the step is only worth what its landing point delivers.
    """
    weight = edge_weight(edge_type, source, factor)
    if weight <= 0.0:
        raise ValueError(f"link weight must be positive, got {weight}")
    return reliability_cost(success_rate_of_dst) / weight


# --- hyperedges ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hyperedge:
    """Needs all of `tail`, provides all of `head`, at `cost` (> 0)."""

    id: str
    tail: frozenset[Vertex]
    head: frozenset[Vertex]
    cost: float
    kind: HyperedgeKind = "capability"

    def __post_init__(self) -> None:
        if not (self.cost > 0.0 and math.isfinite(self.cost)):
            raise ValueError(f"hyperedge {self.id!r}: cost must be positive, got {self.cost}")
        if not self.head:
            raise ValueError(f"hyperedge {self.id!r} provides nothing")


def capability_hyperedge(
    cap_id: Vertex,
    members: Iterable[Vertex],
    success_rate: float | None,
    edge_id: str | None = None,
) -> Hyperedge:
    """members (tools and sub-capabilities) → cap_id, at `capability_cost(success_rate)`.

    `edge_id` tells apart several ways of providing the same capability (default
    `capability:<cap_id>`).
    """
    return Hyperedge(
        id=edge_id or f"capability:{cap_id}",
        tail=frozenset(members) - {cap_id},  # a capability never needs itself
        head=frozenset((cap_id,)),
        cost=capability_cost(success_rate),
        kind="capability",
    )


def link_hyperedge(
    src: Vertex,
    dst: Vertex,
    type: str,
    source: str,
    success_rate_of_dst: float | None = None,
    factor: float = 1.0,
) -> Hyperedge:
    """src → dst, one learned link, at `link_cost(type, source, success_rate_of_dst, factor)`."""
    if type not in TYPE_WEIGHT:
        raise ValueError(f"unknown link type {type!r}")
    return Hyperedge(
        id=f"{type}:{src}->{dst}",
        tail=frozenset((src,)),
        head=frozenset((dst,)),
        cost=link_cost(type, source, success_rate_of_dst, factor),
        kind=type,  # type: ignore[arg-type]  # checked against TYPE_WEIGHT above
    )


# --- the hypergraph and its underlying graph -----------------------------------------------


@dataclass(frozen=True)
class ArcChange:
    """One arc of the underlying graph after a hyperedge change.

    `old_weight` None: the arc is new; `new_weight` None: it is gone. The weight may also stay
    the same while the cheapest hyperedge changes (a tie with a smaller id).
    """

    tail: Vertex
    head: Vertex
    old_weight: float | None
    new_weight: float | None
    old_edge: str | None
    new_edge: str | None


# A heap entry: (cost, hyperedge id, version). Entries are deleted lazily: one is live iff its
# hyperedge still exists at that version (a reweight or a re-add gives a new version).
_Entry = tuple[float, str, int]


class Hypergraph:
    """Hyperedges, and the underlying graph weighted by the cheapest covering hyperedge."""

    def __init__(self, edges: Iterable[Hyperedge] = ()) -> None:
        self._edges: dict[str, Hyperedge] = {}
        self._versions: dict[str, int] = {}
        self._next_version = 0
        self._heaps: dict[tuple[Vertex, Vertex], list[_Entry]] = {}
        self._live: dict[tuple[Vertex, Vertex], int] = {}  # hyperedges covering each pair
        self._best: dict[tuple[Vertex, Vertex], str] = {}  # cheapest hyperedge of each arc
        # weights of the underlying graph, both ways, for searches from either end
        self._out: dict[Vertex, dict[Vertex, float]] = {}
        self._in: dict[Vertex, dict[Vertex, float]] = {}
        self._providers: dict[Vertex, set[str]] = {}  # hyperedges whose head holds a vertex
        self._refs: dict[Vertex, int] = {}  # hyperedges mentioning a vertex
        #: Incremented by every change; lets a planner notice changes it was not told about.
        self.version = 0
        for edge in edges:
            self.add(edge)

    # reads

    def __len__(self) -> int:
        return len(self._edges)

    def __contains__(self, edge_id: object) -> bool:
        return edge_id in self._edges

    def edge(self, edge_id: str) -> Hyperedge:
        return self._edges[edge_id]

    def edges(self) -> Iterator[Hyperedge]:
        return iter(self._edges.values())

    @property
    def vertices(self) -> Iterable[Vertex]:
        """Vertices of the current hyperedges."""
        return self._refs.keys()

    def has_vertex(self, vertex: Vertex) -> bool:
        return vertex in self._refs

    def arc_weight(self, u: Vertex, v: Vertex) -> float | None:
        return self._out.get(u, {}).get(v)

    def arc_edge(self, u: Vertex, v: Vertex) -> str | None:
        """Id of the cheapest hyperedge covering u → v (ties: smallest id)."""
        return self._best.get((u, v))

    def arcs(self) -> Iterator[tuple[Vertex, Vertex, float]]:
        for u, targets in self._out.items():
            for v, w in targets.items():
                yield u, v, w

    @property
    def out_arcs(self) -> Mapping[Vertex, Mapping[Vertex, float]]:
        """u → {v: weight}; read-only by contract (the searches read it in their inner loop)."""
        return self._out

    @property
    def in_arcs(self) -> Mapping[Vertex, Mapping[Vertex, float]]:
        """v → {u: weight}, the same arcs seen from their heads."""
        return self._in

    def providers(self, vertex: Vertex) -> list[Hyperedge]:
        """Hyperedges whose head holds `vertex`, cheapest first (ties: id)."""
        edges = [self._edges[i] for i in self._providers.get(vertex, ())]
        return sorted(edges, key=lambda e: (e.cost, e.id))

    # changes

    def add(self, edge: Hyperedge) -> list[ArcChange]:
        if edge.id in self._edges:
            raise ValueError(f"hyperedge {edge.id!r} already exists")
        self._edges[edge.id] = edge
        version = self._bump(edge.id)
        for v in edge.tail | edge.head:
            self._refs[v] = self._refs.get(v, 0) + 1
        for v in edge.head:
            self._providers.setdefault(v, set()).add(edge.id)
        changes: list[ArcChange] = []
        entry = (edge.cost, edge.id, version)
        for pair in _pairs(edge):
            heap = self._heaps.setdefault(pair, [])
            heapq.heappush(heap, entry)
            self._live[pair] = self._live.get(pair, 0) + 1
            self._settle(pair, changes)
        return changes

    def remove(self, edge_id: str) -> list[ArcChange]:
        edge = self._edges.pop(edge_id)  # KeyError for an unknown id
        del self._versions[edge_id]
        self.version += 1
        for v in edge.tail | edge.head:
            left = self._refs[v] - 1
            if left:
                self._refs[v] = left
            else:
                del self._refs[v]
        for v in edge.head:
            providers = self._providers[v]
            providers.discard(edge_id)
            if not providers:
                del self._providers[v]
        changes: list[ArcChange] = []
        for pair in _pairs(edge):
            self._live[pair] -= 1
            self._settle(pair, changes)
        return changes

    def reweight(self, edge_id: str, cost: float) -> list[ArcChange]:
        old = self._edges[edge_id]
        edge = Hyperedge(old.id, old.tail, old.head, cost, old.kind)
        self._edges[edge_id] = edge
        entry = (cost, edge_id, self._bump(edge_id))
        changes: list[ArcChange] = []
        for pair in _pairs(edge):
            heapq.heappush(self._heaps[pair], entry)
            self._settle(pair, changes)
        return changes

    def _bump(self, edge_id: str) -> int:
        self._next_version += 1
        self._versions[edge_id] = self._next_version
        self.version += 1
        return self._next_version

    def _settle(self, pair: tuple[Vertex, Vertex], changes: list[ArcChange]) -> None:
        """Bring the arc of `pair` in line with its heap; record it if it changed."""
        heap = self._heaps[pair]
        live = self._live[pair]
        u, v = pair
        old_edge = self._best.get(pair)
        old_weight = self._out[u][v] if old_edge is not None else None
        if live == 0:
            del self._heaps[pair], self._live[pair]
            if old_edge is not None:
                del self._best[pair]
                _drop(self._out, u, v)
                _drop(self._in, v, u)
                changes.append(ArcChange(u, v, old_weight, None, old_edge, None))
            return
        versions = self._versions
        if len(heap) > 2 * live + 4:
            # Stale entries outnumber live ones: rebuild, so a pair reweighted many times keeps
            # a heap proportional to the hyperedges covering it.
            heap[:] = [e for e in heap if versions.get(e[1]) == e[2]]
            heapq.heapify(heap)
        while versions.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)
        weight, best, _ = heap[0]
        if best == old_edge and weight == old_weight:
            return
        self._best[pair] = best
        self._out.setdefault(u, {})[v] = weight
        self._in.setdefault(v, {})[u] = weight
        changes.append(ArcChange(u, v, old_weight, weight, old_edge, best))


def _pairs(edge: Hyperedge) -> Iterator[tuple[Vertex, Vertex]]:
    # sorted: the order of reported changes must not depend on set iteration order
    for u in sorted(edge.tail):
        for v in sorted(edge.head):
            if u != v:
                yield u, v


def _drop(adjacency: dict[Vertex, dict[Vertex, float]], a: Vertex, b: Vertex) -> None:
    inner = adjacency[a]
    del inner[b]
    if not inner:
        del adjacency[a]
