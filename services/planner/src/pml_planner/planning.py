"""One tenant's planning state: its hypergraph under DR-DSP, and the planning methods.

The hypergraph is built from the trainer's graph: every capability is a hyperedge from its
members (tools and sub-capabilities) to itself, at the cost of its unreliability; every learned
`sequence` / `dependency` LINK is a 1→1 hyperedge at `1 / weight` times the unreliability of its
destination (ADR-038 §2.3), with the weight the trainer stored: type weight × source multiplier
× the cold-start factor of a guessed link (a similarity guess costs more than an observation).
`contains` LINKs are not used: the declared membership already is the capability's hyperedge.
`sync` brings it to a newer read of the graph by adding, removing and reweighting only the
hyperedges that changed, so DR-DSP repairs its kept trees instead of recomputing them.

Methods:
- `drdsp`: the target capability is chosen from the intent's candidates (SHGAT, or search
  before a model is trained) and the capabilities holding a tool already run, by intent score ×
  reliability and, with context, the share of the context it holds (`target_fit`); the DAG is
  DR-DSP's dependency expansion of the target; the next step is the first tool of the forward
  hyperpath from the current tool, then the DAG's remaining tools in order, then the legacy
  heuristic's successors of the current tool.
- `legacy`: ADR-038 §2.2 (co-occurrence 0.6, Louvain 0.3, recency 0.1, PageRank 0.1) from the
  current tool; the DAG is a greedy chain of such steps from the first tool.
- `discovery`: strategic discovery (ADR-038 §3.2) from the context tools: the capability of
  best overlap × (1 + spectral boost), the intent's target score breaking ties; the next step is
  its first member tool not yet run, its DAG the capability's dependency DAG. Without context it
  starts from the intent's first search tool.
- `search`: the intent's unified-search order of tools, as a chain.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pml_common.edge_weights import edge_weight
from pml_planner.discovery import StrategicDiscovery
from pml_planner.drdsp import DRDSP, DependencyDag
from pml_planner.graph_source import LinkInfo, PlannerGraph
from pml_planner.hypergraph import Hyperedge, capability_hyperedge, link_hyperedge
from pml_planner.legacy import ToolGraphFeatures, as_utc

#: LINK types that become hyperedges (see module docstring for `contains`).
PLANNING_LINKS = ("sequence", "dependency")
#: Longest chain the legacy and search methods suggest as a DAG.
MAX_CHAIN = 6
#: Share of a target's fit that comes from the tools already run (the rest: the intent).
CONTEXT_WEIGHT = 0.5


@dataclass(frozen=True)
class Candidate:
    id: str
    score: float


@dataclass(frozen=True)
class Target:
    """A target capability with its dependency DAG, computed once and used for the answer."""

    id: str
    score: float  # how well it fits the intent (SHGAT, or search)
    dag: DependencyDag
    reliability: float

    @property
    def confidence(self) -> float:
        return self.score * self.reliability


@dataclass(frozen=True)
class NextPlan:
    candidates: tuple[Candidate, ...]
    target: str
    path: tuple[str, ...]
    confidence: float


@dataclass(frozen=True)
class DagPlan:
    target: str
    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str, str], ...]  # (source, target, type)
    order: tuple[str, ...]
    confidence: float
    #: Nodes composed from the request's sub-goals rather than taken from a learned capability.
    composed: tuple[str, ...] = ()


def hyperedges_of(graph: PlannerGraph) -> dict[str, Hyperedge]:
    edges: dict[str, Hyperedge] = {}
    for cap, members in graph.members.items():
        if members:
            rate = graph.nodes[cap].success_rate if cap in graph.nodes else None
            edge = capability_hyperedge(cap, members, rate)
            edges[edge.id] = edge
        # The declared member order ("the order it usually runs them") counts as a template
        # sequence until executions teach otherwise: a learned link of the same pair replaces it.
        for a, b in itertools.pairwise(members):
            if a != b:
                declared = link_hyperedge(a, b, "sequence", "template")
                edges[declared.id] = declared
    for link in graph.links:
        if link.type not in PLANNING_LINKS or link.src == link.dst:
            continue
        dst = graph.nodes.get(link.dst)
        rate = dst.success_rate if dst else None
        edge = link_hyperedge(
            link.src, link.dst, link.type, link.source, rate, _cold_start_factor(link)
        )
        edges[edge.id] = edge
    return edges


def _cold_start_factor(link: LinkInfo) -> float:
    """The factor the trainer folded into the stored weight (1.0 when none is stored)."""
    nominal = edge_weight(link.type, link.source)
    if link.weight <= 0 or nominal <= 0:
        return 1.0
    return min(1.0, link.weight / nominal)


@dataclass
class TenantPlanner:
    graph: PlannerGraph
    drdsp: DRDSP = field(default_factory=DRDSP)
    _edges: dict[str, Hyperedge] = field(default_factory=dict)
    _legacy: ToolGraphFeatures | None = None
    _legacy_links: list[tuple[str, str, float]] = field(default_factory=list)
    _discovery: StrategicDiscovery | None = None
    #: member -> the capabilities that hold it directly (built on first use, per graph version)
    _holders: dict[str, list[str]] | None = None

    @classmethod
    def build(cls, graph: PlannerGraph) -> TenantPlanner:
        planner = cls(graph=graph)
        planner.sync(graph)
        return planner

    def sync(self, graph: PlannerGraph) -> int:
        """Apply a newer read of the graph; returns how many hyperedges changed."""
        wanted = hyperedges_of(graph)
        changed = 0
        for edge_id in [e for e in self._edges if e not in wanted]:
            self.drdsp.remove(edge_id)
            del self._edges[edge_id]
            changed += 1
        for edge_id, edge in wanted.items():
            old = self._edges.get(edge_id)
            if old == edge:
                continue
            if old is not None and (old.tail, old.head) == (edge.tail, edge.head):
                self.drdsp.reweight(edge_id, edge.cost)
            else:
                if old is not None:
                    self.drdsp.remove(edge_id)
                self.drdsp.add(edge)
            self._edges[edge_id] = edge
            changed += 1
        # Each derived structure is rebuilt only when what it is made of changed: the judge
        # syncs its planner at every execution, and spectral clusters of thousands of
        # capabilities or Louvain over their links cost seconds (ETOM, 2,375 tools).
        if graph.members != self.graph.members or graph.nodes.keys() != self.graph.nodes.keys():
            self._discovery = None
            self._holders = None
        self.graph = graph
        if self._legacy is not None:
            links, used = self._legacy_inputs()
            if links != self._legacy_links:
                self._legacy = None
            elif used != self._legacy.last_used:
                self._legacy = replace(self._legacy, last_used=used)
        return changed

    # --- drdsp ------------------------------------------------------------------------------

    def target(self, candidate: Candidate) -> Target:
        """The candidate with its dependency DAG and the DAG's reliability: the product of
        1/cost of the capability hyperedges it was expanded with (1.0 without members)."""
        dag = self.drdsp.dependency_dag(candidate.id)
        costs = [self._edges[e].cost for e in dag.hyperedges.values() if e in self._edges]
        return Target(candidate.id, candidate.score, dag, math.prod(1.0 / c for c in costs))

    def choose_target(
        self,
        candidates: Sequence[Candidate],
        context: Sequence[str] = (),
        hidden: frozenset[str] = frozenset(),
    ) -> Target | None:
        """The target that fits the intent and the tools already run (`target_fit`); ties: the
        larger id. The capabilities holding a context tool join the intent's candidates (at
        intent score 0): the work under way may belong to one the intent ranked lower.
        `hidden` capabilities are never chosen (see `prequential`)."""
        pool = {c.id: c for c in candidates if c.id in self.graph.nodes and c.id not in hidden}
        for cap in self.capabilities_holding(context):
            if cap not in hidden:
                pool.setdefault(cap, Candidate(cap, 0.0))
        targets = [self.target(c) for c in pool.values()]
        return max(targets, key=lambda t: (self.target_fit(t, context), t.id), default=None)

    def target_fit(self, target: Target, context: Sequence[str]) -> float:
        """How well `target` fits: its confidence (intent score × reliability) without context;
        with context, half that and half the share of the context tools its DAG holds, and 0
        when its DAG has no tool left to run (nothing to predict from it)."""
        if not context:
            return target.confidence
        tools = {v for v in target.dag.nodes if self.is_tool(v)}
        done = set(context)
        if not tools - done:
            return 0.0
        overlap = len(tools & done) / len(done)
        return (1.0 - CONTEXT_WEIGHT) * target.confidence + CONTEXT_WEIGHT * overlap

    def capabilities_running(self, tools: Sequence[str]) -> frozenset[str]:
        """Capabilities whose member tools are exactly `tools` (as a set)."""
        wanted = frozenset(tools)
        return frozenset(
            cap
            for cap in self.capabilities_holding(tools)
            if frozenset(m for m in self.graph.members[cap] if self.is_tool(m)) == wanted
        )

    def capabilities_holding(self, tools: Sequence[str]) -> list[str]:
        """Capabilities with one of `tools` among their direct members, in id order."""
        if self._holders is None:
            holders: dict[str, list[str]] = {}
            for cap, members in sorted(self.graph.members.items()):
                for member in dict.fromkeys(members):
                    holders.setdefault(member, []).append(cap)
            self._holders = holders
        found = {cap for tool in tools for cap in self._holders.get(tool, ())}
        return sorted(found)

    def suggest_dag(self, target: Target) -> DagPlan:
        dag = target.dag
        edges = tuple((e.src, e.dst, e.kind) for e in dag.edges)
        return DagPlan(target.id, dag.nodes, edges, dag.order, target.confidence)

    def predict_next(self, target: Target, context: Sequence[str], k: int) -> NextPlan:
        done = set(context)
        ordered: list[str] = []
        path: tuple[str, ...] = ()
        current = context[-1] if context else None
        if current is not None and self.drdsp.graph.has_vertex(current):
            hyperpath = self.drdsp.forward(current, target.id)
            if hyperpath is not None:
                path = hyperpath.vertices
                ordered += [v for v in path[1:] if self.is_tool(v)]
                # `requires` is sorted by id: the target's DAG says in which order they run.
                position = {v: i for i, v in enumerate(target.dag.order)}
                required = sorted(hyperpath.requires, key=lambda v: position.get(v, len(position)))
                ordered += [v for v in required if self.is_tool(v)]
        ordered += [v for v in target.dag.order if self.is_tool(v)]
        if context:
            # Past the target's plan, what followed the current tool in other executions.
            ordered += [c.id for c in self.legacy_next(context, k)]
        picked = [v for v in dict.fromkeys(ordered) if v not in done][:k]
        # Later candidates are less certain: each step down the list halves the score.
        base = target.confidence
        candidates = tuple(Candidate(v, base / (2**i)) for i, v in enumerate(picked))
        return NextPlan(candidates, target.id, path, base if picked else 0.0)

    def is_tool(self, node: str) -> bool:
        info = self.graph.nodes.get(node)
        return info is not None and info.kind == "tool"

    def is_capability(self, node: str) -> bool:
        info = self.graph.nodes.get(node)
        return info is not None and info.kind == "capability"

    # --- legacy -----------------------------------------------------------------------------

    def legacy(self) -> ToolGraphFeatures:
        if self._legacy is None:
            self._legacy_links, used = self._legacy_inputs()
            self._legacy = ToolGraphFeatures.build(self._legacy_links, used, tools=self.graph.tools)
        return self._legacy

    def _legacy_inputs(self) -> tuple[list[tuple[str, str, float]], dict[str, datetime]]:
        """The weighted tool → tool links (Louvain and PageRank are made of them) and when
        each tool was last used (the recency term, read at ranking time)."""
        links = [
            (link.src, link.dst, link.weight)
            for link in self.graph.links
            if self.is_tool(link.src) and self.is_tool(link.dst) and link.weight > 0
        ]
        used = {
            n.id: as_utc(n.last_used_at)
            for n in self.graph.nodes.values()
            if n.kind == "tool" and n.last_used_at is not None
        }
        return links, used

    def legacy_next(self, context: Sequence[str], k: int) -> list[Candidate]:
        done = set(context)
        ranked = self.legacy().rank_next(list(context), None, k + len(done), now=_now())
        return [Candidate(t, s) for t, s in ranked if t not in done][:k]

    def legacy_chain(self, first: str) -> list[str]:
        chain = [first]
        while len(chain) < MAX_CHAIN:
            step = self.legacy_next(chain, 1)
            if not step or step[0].score <= 0:
                break
            chain.append(step[0].id)
        return chain

    # --- discovery --------------------------------------------------------------------------

    def discovery(self) -> StrategicDiscovery:
        if self._discovery is None:
            tools = {
                cap: [m for m in members if self.is_tool(m)]
                for cap, members in self.graph.members.items()
            }
            self._discovery = StrategicDiscovery.build(tools)
        return self._discovery

    def discover(
        self,
        context: Sequence[str],
        intent_scores: dict[str, float],
        k: int,
        hidden: frozenset[str] = frozenset(),
    ) -> list[Candidate]:
        """Capabilities by discovery score, best first; among equal scores the one that fits
        the intent better (its target score), then the smaller id. Never a `hidden` one."""
        found = self.discovery().rank_capabilities(context, len(self.graph.members) or 1)
        found = [c for c in found if c[0] not in hidden]
        found.sort(key=lambda c: (-c[1], -intent_scores.get(c[0], 0.0), c[0]))
        return [Candidate(cap, score) for cap, score in found[:k]]

    def discovery_next(
        self,
        context: Sequence[str],
        intent_scores: dict[str, float],
        k: int,
        hidden: frozenset[str] = frozenset(),
    ) -> NextPlan:
        """The member tools not yet run of the discovered capabilities, in capability order
        then member order; each step down the list halves the score, as in `predict_next`."""
        done = set(context)
        ordered: list[str] = []
        best: Candidate | None = None
        for found in self.discover(context, intent_scores, k, hidden):
            tools = [t for t in self.target(found).dag.order if self.is_tool(t) and t not in done]
            if tools and best is None:
                best = found
            ordered += tools
        if best is None:
            return NextPlan((), "", (), 0.0)
        picked = list(dict.fromkeys(ordered))[:k]
        candidates = tuple(Candidate(v, best.score / (2**i)) for i, v in enumerate(picked))
        return NextPlan(candidates, best.id, (), best.score)


def chain_plan(tools: Sequence[str], confidence: float) -> DagPlan:
    """A DAG that is a simple chain of tools (legacy and search suggestions)."""
    nodes = tuple(dict.fromkeys(tools))
    edges = tuple((a, b, "order") for a, b in itertools.pairwise(nodes))
    return DagPlan(nodes[-1] if nodes else "", nodes, edges, nodes, confidence)


def _now() -> datetime:
    return datetime.now(UTC)
