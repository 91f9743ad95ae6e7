"""DR-DSP: shortest hyperpaths kept current as hyperedges change (seed 000 PREDICTION, SUGGESTION).

Searches run on the hypergraph's underlying graph (`pml_planner.hypergraph`: one arc per
tail × head pair, weighted by the cheapest covering hyperedge), as DR-DSP prescribes
(Gao et al., arXiv:1202.0082).

- PREDICTION, `forward(current_tool, target)`: the cheapest path to the target capability; its
  second vertex is the next step. Served from a single-source tree of `current_tool`.
- SUGGESTION, `dependency_dag(target)`: the target's cheapest capability hyperedge expanded
  B-hyperpath style (every member is needed, member capabilities recursively), ordered. It
  reads the hyperedges, not a tree: no tree into a target is kept, since no request read one.

The trees of recently queried sources are kept (a bounded LRU) and repaired after each change
from the arcs it changed, never rebuilt: a cheaper arc propagates Dijkstra-style from the
vertex it improves; a dearer or removed tree arc invalidates the subtree hanging from it,
which is re-seeded from its intact in-neighbours and settled by a Dijkstra over that subtree
alone (Ramalingam & Reps, "An incremental algorithm for a generalization of the shortest-path
problem", 1996). Vertices outside those regions are not looked at.

Determinism: among equally short ways into a vertex, its parent is the smallest vertex id
(`parent[v] = min{u : d[u] + w(u, v) = d[v]}`). That rule depends on the current graph only,
so an incrementally repaired tree equals, float for float, the tree a from-scratch Dijkstra
builds (`shortest_path_tree`), which is what the property tests check.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from types import MappingProxyType
from typing import Literal

from pml_planner.hypergraph import ArcChange, Hyperedge, Hypergraph, Vertex

_Adjacency = Mapping[Vertex, Mapping[Vertex, float]]
_NO_ARCS: Mapping[Vertex, float] = MappingProxyType({})

#: Trees kept by default: one per live session's current tool is the expected use, and a tree
#: costs O(reachable vertices) of memory and of repair work.
DEFAULT_KEPT_TREES = 16


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HyperPath:
    """A forward path: `vertices[0]` is the source, `vertices[-1]` the target."""

    vertices: tuple[Vertex, ...]
    #: The cheapest hyperedge covering each step (len(vertices) - 1 of them).
    hyperedges: tuple[str, ...]
    cost: float
    #: Vertices the chosen hyperedges also need but the path does not visit (sorted): what a
    #: plain graph path misses, e.g. the other members of a capability it goes through.
    requires: tuple[Vertex, ...]

    @property
    def next_step(self) -> Vertex | None:
        return self.vertices[1] if len(self.vertices) > 1 else None


@dataclass(frozen=True)
class DagEdge:
    """`src` must come before `dst`: a member of the capability `dst` ("member"), or a member
    of the same capability that the cheapest arc between them puts first ("order")."""

    src: Vertex
    dst: Vertex
    kind: Literal["member", "order"]


@dataclass(frozen=True)
class DependencyDag:
    target: Vertex
    nodes: tuple[Vertex, ...]  # sorted
    edges: tuple[DagEdge, ...]
    #: Topological order, dependencies first; the target is last. Ties: vertex id.
    order: tuple[Vertex, ...]
    #: The capability hyperedge each expanded capability was expanded with.
    hyperedges: Mapping[Vertex, str]
    #: Sum of those hyperedges' costs (the additive cost of the B-hyperpath).
    cost: float
    #: Member edges left out because they closed a cycle of capabilities.
    dropped: tuple[DagEdge, ...]


class _Tree:
    """Distances and parents of one single-source shortest-path tree."""

    __slots__ = ("dist", "evicted", "parent", "root")

    def __init__(self, root: Vertex) -> None:
        self.root = root
        self.dist: dict[Vertex, float] = {}
        self.parent: dict[Vertex, Vertex] = {}
        self.evicted = False


class ShortestPathTree:
    """Read-only view of a kept tree; it follows later changes until the planner evicts it.

    `distance[v]` from the root to v, `parent[v]` the vertex before v.
    """

    def __init__(self, tree: _Tree) -> None:
        self._tree = tree
        self.root = tree.root
        self.distance: Mapping[Vertex, float] = MappingProxyType(tree.dist)
        self.parent: Mapping[Vertex, Vertex] = MappingProxyType(tree.parent)

    @property
    def live(self) -> bool:
        """False once evicted: the view then no longer follows changes."""
        return not self._tree.evicted

    def path(self, vertex: Vertex) -> tuple[Vertex, ...] | None:
        """The tree path from the root to `vertex` (None when out of reach)."""
        if vertex not in self.distance:
            return None
        return _path(self._tree, vertex)


def _path(tree: _Tree, vertex: Vertex) -> tuple[Vertex, ...]:
    """The tree path of a reached `vertex`, root first."""
    chain = [vertex]
    parent = tree.parent
    while chain[-1] != tree.root:
        chain.append(parent[chain[-1]])
    return tuple(reversed(chain))


# --- single-source shortest paths, from scratch and incremental ----------------------------


def shortest_path_tree(
    graph: Hypergraph, root: Vertex
) -> tuple[dict[Vertex, float], dict[Vertex, Vertex]]:
    """(distance, parent) of every vertex reachable from `root`."""
    dist = {root: 0.0}
    parent: dict[Vertex, Vertex] = {}
    _settle(graph.out_arcs, dist, parent, [(0.0, root)])
    return dist, parent


def _settle(
    relax: _Adjacency,
    dist: dict[Vertex, float],
    parent: dict[Vertex, Vertex],
    heap: list[tuple[float, Vertex]],
) -> None:
    """Dijkstra from the labels in `heap`: every label is an upper bound reached by a real path.

    Used from scratch (the root alone) and for repairs (improved and re-seeded vertices); in
    both cases a vertex is settled once, since labels only decrease and pop in order.
    """
    heapq.heapify(heap)
    pop, push, get = heapq.heappop, heapq.heappush, dist.get
    while heap:
        d, x = pop(heap)
        if d != get(x):
            continue  # superseded by a smaller label
        for y, w in relax.get(x, _NO_ARCS).items():
            nd = d + w
            dy = get(y)
            if dy is None or nd < dy:
                dist[y] = nd
                parent[y] = x
                push(heap, (nd, y))
            elif nd == dy and x < parent[y]:  # the root never ties: nd > 0 = d[root]
                parent[y] = x


def _repair(tree: _Tree, graph: Hypergraph, changes: Sequence[ArcChange]) -> None:
    """Bring `tree` in line with the graph after `changes` (already applied to the graph)."""
    dist, parent = tree.dist, tree.parent
    relax, seed_from = graph.out_arcs, graph.in_arcs
    cut: list[Vertex] = []  # heads of tree arcs that got dearer or vanished
    cheaper: list[tuple[Vertex, Vertex, float]] = []
    for change in changes:
        old, new = change.old_weight, change.new_weight
        if old == new:
            continue  # only the cheapest hyperedge's id changed
        a, b = change.tail, change.head
        if new is None or (old is not None and new > old):
            # A dearer arc matters only if the tree uses it; off-tree, nobody's label rests on it.
            if parent.get(b) == a:
                cut.append(b)
        else:
            cheaper.append((a, b, new))
    heap: list[tuple[float, Vertex]] = []
    if cut:
        heap.extend(_invalidate(cut, dist, parent, relax, seed_from))
    for a, b, w in cheaper:
        da = dist.get(a)
        if da is None:
            continue  # a is unreached or invalidated: its own settling will relax this arc
        nd = da + w
        db = dist.get(b)
        if db is None or nd < db:
            dist[b] = nd
            parent[b] = a
            heap.append((nd, b))
        elif nd == db and a < parent[b]:
            parent[b] = a
    if heap:
        _settle(relax, dist, parent, heap)


def _invalidate(
    cut: Iterable[Vertex],
    dist: dict[Vertex, float],
    parent: dict[Vertex, Vertex],
    relax: _Adjacency,
    seed_from: _Adjacency,
) -> list[tuple[float, Vertex]]:
    """Drop the subtrees under `cut`; return each dropped vertex's best label from outside.

    Only the subtree's labels rested on the dearer arcs: every other label still measures a
    real path that avoids them, and the subtree's new labels come from its frontier (intact
    in-neighbours) plus paths inside it.
    """
    affected = set(cut)
    stack = list(affected)
    while stack:
        x = stack.pop()
        for y in relax.get(x, _NO_ARCS):
            if y not in affected and parent.get(y) == x:
                affected.add(y)
                stack.append(y)
    for x in affected:
        del dist[x]
        parent.pop(x, None)
    seeds: list[tuple[float, Vertex, Vertex]] = []
    get = dist.get
    for x in affected:
        best: float | None = None
        via = ""
        for u, w in seed_from.get(x, _NO_ARCS).items():
            du = get(u)
            if du is None:
                continue
            nd = du + w
            if best is None or nd < best or (nd == best and u < via):
                best, via = nd, u
        if best is not None:
            seeds.append((best, x, via))
    for d, x, via in seeds:
        dist[x] = d
        parent[x] = via
    return [(d, x) for d, x, _ in seeds]


# --- the planner ---------------------------------------------------------------------------


class DRDSP:
    """A hypergraph with the shortest-path trees of recent queries kept current.

    Change the hypergraph through `add` / `remove` / `reweight` here (each returns the arcs it
    changed); a change made on `graph` directly is detected at the next query, which then
    refuses to answer until `recompute_all()`. Not thread-safe: one planner per tenant, driven
    from one thread or event loop.
    """

    def __init__(
        self,
        graph: Hypergraph | None = None,
        *,
        max_sources: int = DEFAULT_KEPT_TREES,
    ) -> None:
        if max_sources < 1:
            raise ValueError("keep at least one tree")
        self.graph = graph if graph is not None else Hypergraph()
        self.max_sources = max_sources
        self._sources: OrderedDict[Vertex, _Tree] = OrderedDict()
        self._synced = self.graph.version

    # changes

    def add(self, edge: Hyperedge) -> list[ArcChange]:
        self._check_synced()
        return self._apply(self.graph.add(edge))

    def remove(self, edge_id: str) -> list[ArcChange]:
        self._check_synced()
        return self._apply(self.graph.remove(edge_id))

    def reweight(self, edge_id: str, cost: float) -> list[ArcChange]:
        self._check_synced()
        return self._apply(self.graph.reweight(edge_id, cost))

    def _apply(self, changes: list[ArcChange]) -> list[ArcChange]:
        if changes:
            for tree in self._sources.values():
                _repair(tree, self.graph, changes)
        self._synced = self.graph.version
        return changes

    def recompute_all(self) -> None:
        """Rebuild every kept tree from scratch (the reference the repairs are measured against)."""
        for tree in self._sources.values():
            self._build(tree)
        self._synced = self.graph.version

    # queries

    def forward(self, source: Vertex, target: Vertex) -> HyperPath | None:
        """The cheapest path source → target (None when target is out of reach)."""
        tree = self._tree(source)
        cost = tree.dist.get(target)
        if cost is None:
            return None
        chain = _path(tree, target)
        graph = self.graph
        edges = tuple(graph.arc_edge(u, v) or "" for u, v in pairwise(chain))
        needed: set[Vertex] = set()
        for edge_id in dict.fromkeys(edges):
            needed.update(graph.edge(edge_id).tail)
        needed.difference_update(chain)
        return HyperPath(chain, edges, cost, tuple(sorted(needed)))

    def forward_tree(self, source: Vertex) -> ShortestPathTree:
        return ShortestPathTree(self._tree(source))

    def dependency_dag(self, target: Vertex) -> DependencyDag:
        self._check_synced()
        return dependency_dag(self.graph, target)

    @property
    def kept_sources(self) -> tuple[Vertex, ...]:
        """Roots of the kept forward trees, least recently used first."""
        return tuple(self._sources)

    def peek(self, source: Vertex) -> ShortestPathTree | None:
        """A kept tree, without building one or touching the LRU order."""
        tree = self._sources.get(source)
        return ShortestPathTree(tree) if tree is not None else None

    # trees

    def _tree(self, source: Vertex) -> _Tree:
        self._check_synced()
        kept = self._sources
        tree = kept.get(source)
        if tree is not None:
            kept.move_to_end(source)
            return tree
        tree = _Tree(source)
        self._build(tree)
        kept[source] = tree
        while len(kept) > self.max_sources:
            _, evicted = kept.popitem(last=False)
            evicted.evicted = True
        return tree

    def _build(self, tree: _Tree) -> None:
        # in place, so that views handed out earlier keep reading the live tree
        dist, parent = shortest_path_tree(self.graph, tree.root)
        tree.dist.clear()
        tree.dist.update(dist)
        tree.parent.clear()
        tree.parent.update(parent)

    def _check_synced(self) -> None:
        if self._synced != self.graph.version:
            raise RuntimeError(
                "the hypergraph changed outside the planner; call recompute_all() first"
            )


# --- dependency DAG ------------------------------------------------------------------------


def dependency_dag(graph: Hypergraph, target: Vertex) -> DependencyDag:
    """The target's cheapest capability hyperedge, expanded B-hyperpath style.

    All members of a capability are needed (a hyperedge fires only with its whole tail), so
    each becomes a dependency of the capability, and member capabilities are expanded in turn
    (breadth first, each once: a cycle of capabilities cannot loop; the edge closing it is
    reported in `dropped`). Members of one capability are then ordered by the arcs between
    them, cheapest first, each kept only if it leaves the graph acyclic.
    """
    chosen: dict[Vertex, Hyperedge] = {}
    succ: dict[Vertex, set[Vertex]] = {target: set()}
    edges: list[DagEdge] = []
    dropped: list[DagEdge] = []
    queue = deque([target])
    while queue:
        vertex = queue.popleft()
        expansion = next((e for e in graph.providers(vertex) if e.kind == "capability"), None)
        if expansion is None:
            continue  # a tool, or a capability with no known members: a leaf
        chosen[vertex] = expansion
        for member in sorted(expansion.tail):
            if member not in succ:
                succ[member] = set()
                queue.append(member)
            edge = DagEdge(member, vertex, "member")
            if _reaches(succ, vertex, member):
                dropped.append(edge)
            else:
                succ[member].add(vertex)
                edges.append(edge)
    for expansion in chosen.values():
        members = sorted(expansion.tail)
        arcs = sorted(
            (w, a, b)
            for a in members
            for b in members
            if a != b and (w := graph.arc_weight(a, b)) is not None
        )
        for _, a, b in arcs:
            if b not in succ[a] and not _reaches(succ, b, a):
                succ[a].add(b)
                edges.append(DagEdge(a, b, "order"))
    return DependencyDag(
        target=target,
        nodes=tuple(sorted(succ)),
        edges=tuple(edges),
        order=_topological(succ),
        hyperedges=MappingProxyType({v: e.id for v, e in chosen.items()}),
        cost=sum(e.cost for e in chosen.values()),
        dropped=tuple(dropped),
    )


def _reaches(succ: Mapping[Vertex, set[Vertex]], start: Vertex, goal: Vertex) -> bool:
    seen = {start}
    stack = [start]
    while stack:
        x = stack.pop()
        if x == goal:
            return True
        for y in succ.get(x, ()):
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return False


def _topological(succ: Mapping[Vertex, set[Vertex]]) -> tuple[Vertex, ...]:
    indegree = dict.fromkeys(succ, 0)
    for targets in succ.values():
        for y in targets:
            indegree[y] += 1
    ready = [v for v, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    order: list[Vertex] = []
    while ready:
        x = heapq.heappop(ready)
        order.append(x)
        for y in succ[x]:
            indegree[y] -= 1
            if indegree[y] == 0:
                heapq.heappush(ready, y)
    return tuple(order)
