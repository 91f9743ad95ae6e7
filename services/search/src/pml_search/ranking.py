"""Pure ranking functions of the search service (no I/O).

Formulas and where they come from:

- Reliability (ADR-051, ADR-038 §3.1): success rate < 0.5 → 0.1, > 0.9 → 1.2, else 1.0.
  A node that was never executed (no observations) has no success rate and is neutral (1.0):
  absence of evidence is neither a penalty nor a bonus, so a fresh catalog ranks by semantics.
- Unified search (ADR-051): ``final = min(semantic × reliability, 0.95)``.
- Hybrid tool search (seeds 003, 004): ``hybrid = α·semantic + (1−α)·graph``, then reliability as
  above: ``final = min(hybrid × reliability, 0.95)``; α = 1 without context tools.
- Weighted Adamic-Adar (ADR-038 §2.1):
  ``AA(u,v) = Σ_{w ∈ N(u)∩N(v), |N(w)|>1} q(u,w,v) / log|N(w)|``
  over the undirected view of the LINK graph, where ``q`` is the edge quality (``weight`` =
  type × source) of the weaker of the two edges u–w and w–v (a two-hop path is only as
  trustworthy as its weakest edge; this keeps AA symmetric). Common neighbours of degree ≤ 1 are
  skipped (log 1 = 0).
- Graph relatedness: max over context tools of 1.0 for a direct neighbour (an edge in either
  direction), else ``min(AA / 2, 1)`` — the normalisation of the reference implementation, which
  keeps the graph score in [0, 1] like the semantic score.
- Adaptive α (seed 004, with the density rule of seed 003 for rich graphs): no context → 1.0;
  fewer than 10 edges → 0.8; more than 50 edges → ``clamp(1 − 2·density, 0.5, 0.6)``; in between,
  linear from 0.8 (10 edges) to 0.6 (50 edges).
- Related tools (seed 004): ``often_before`` = in-neighbours, ``often_after`` = out-neighbours,
  each scored and ordered by edge weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

MAX_FINAL_SCORE = 0.95
LOW_SUCCESS = 0.5
HIGH_SUCCESS = 0.9
PENALTY = 0.1
BOOST = 1.2
NEUTRAL = 1.0

SPARSE_EDGES = 10
RICH_EDGES = 50
ALPHA_SPARSE = 0.8
ALPHA_RICH_MAX = 0.6
ALPHA_RICH_MIN = 0.5

OFTEN_BEFORE = "often_before"
OFTEN_AFTER = "often_after"


def reliability_factor(success_rate: float | None) -> float:
    """ADR-051 reliability factor; ``None`` (never executed) is neutral."""
    if success_rate is None:
        return NEUTRAL
    if success_rate < LOW_SUCCESS:
        return PENALTY
    if success_rate > HIGH_SUCCESS:
        return BOOST
    return NEUTRAL


def unified_score(semantic: float, reliability: float) -> float:
    """ADR-051: ``min(semantic × reliability, 0.95)``."""
    return min(semantic * reliability, MAX_FINAL_SCORE)


def hybrid_score(semantic: float, graph: float, alpha: float) -> float:
    """Seeds 003/004: ``α·semantic + (1−α)·graph``."""
    return alpha * semantic + (1.0 - alpha) * graph


@dataclass
class LinkGraph:
    """Directed, weighted tool→tool LINK edges of one tenant (weight = best edge per pair)."""

    out: dict[str, dict[str, float]] = field(default_factory=dict)
    inc: dict[str, dict[str, float]] = field(default_factory=dict)
    # (edge count, node count), computed on demand and dropped by every change
    _sizes: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_edges(cls, edges: Iterable[tuple[str, str, float]]) -> LinkGraph:
        graph = cls()
        for src, dst, weight in edges:
            graph.add_edge(src, dst, weight)
        return graph

    def add_edge(self, src: str, dst: str, weight: float) -> None:
        if src == dst:
            return
        self._sizes = None
        best = max(weight, self.out.get(src, {}).get(dst, weight))
        self.out.setdefault(src, {})[dst] = best
        self.inc.setdefault(dst, {})[src] = best

    def remove_edges_touching(self, node_ids: Iterable[str]) -> None:
        self._sizes = None
        for node in node_ids:
            for dst in self.out.pop(node, {}):
                self.inc.get(dst, {}).pop(node, None)
            for src in self.inc.pop(node, {}):
                self.out.get(src, {}).pop(node, None)

    def edge_count(self) -> int:
        return self._counts()[0]

    def node_count(self) -> int:
        return self._counts()[1]

    def _counts(self) -> tuple[int, int]:
        if self._sizes is None:
            nodes = {n for n, d in self.out.items() if d} | {n for n, d in self.inc.items() if d}
            self._sizes = (sum(len(d) for d in self.out.values()), len(nodes))
        return self._sizes

    def has_edge_either_way(self, a: str, b: str) -> bool:
        return b in self.out.get(a, {}) or a in self.out.get(b, {})

    def neighbours(self, node: str) -> dict[str, float]:
        """Undirected neighbours of ``node`` with the best weight of the two directions."""
        merged = dict(self.out.get(node, {}))
        for src, weight in self.inc.get(node, {}).items():
            merged[src] = max(weight, merged.get(src, 0.0))
        return merged

    def degree(self, node: str) -> int:
        return len(set(self.out.get(node, {})) | set(self.inc.get(node, {})))


def adamic_adar(graph: LinkGraph, u: str, v: str) -> float:
    """Weighted Adamic-Adar between ``u`` and ``v`` (see module docstring)."""
    nu, nv = graph.neighbours(u), graph.neighbours(v)
    if len(nu) > len(nv):
        nu, nv = nv, nu
    score = 0.0
    for w, weight_a in nu.items():
        weight_b = nv.get(w)
        if weight_b is None or w in (u, v):
            continue
        degree = graph.degree(w)
        if degree <= 1:
            continue
        score += min(weight_a, weight_b) / math.log(degree)
    return score


def graph_relatedness(graph: LinkGraph, tool: str, context: Sequence[str]) -> float:
    """Max over context tools: 1.0 for a direct neighbour, else ``min(AA/2, 1)``; 0 without
    context."""
    best = 0.0
    for ctx in context:
        if ctx == tool:
            continue
        if graph.has_edge_either_way(ctx, tool):
            return 1.0
        best = max(best, min(adamic_adar(graph, tool, ctx) / 2.0, 1.0))
    return best


def graph_density(edge_count: int, node_count: int) -> float:
    possible = node_count * (node_count - 1)
    return edge_count / possible if possible > 0 else 0.0


def adaptive_alpha(has_context: bool, edge_count: int, node_count: int) -> float:
    """α from graph size and density (see module docstring)."""
    if not has_context:
        return 1.0
    if edge_count < SPARSE_EDGES:
        return ALPHA_SPARSE
    if edge_count > RICH_EDGES:
        density = graph_density(edge_count, node_count)
        return min(ALPHA_RICH_MAX, max(ALPHA_RICH_MIN, 1.0 - 2.0 * density))
    span = (edge_count - SPARSE_EDGES) / (RICH_EDGES - SPARSE_EDGES)
    return ALPHA_SPARSE - span * (ALPHA_SPARSE - ALPHA_RICH_MAX)


@dataclass(frozen=True)
class Related:
    tool_id: str
    relation: str
    score: float


def related_tools(graph: LinkGraph, tool: str, per_relation: int = 5) -> list[Related]:
    """In-neighbours as ``often_before`` and out-neighbours as ``often_after``, by weight."""
    result: list[Related] = []
    for relation, edges in (
        (OFTEN_BEFORE, graph.inc.get(tool, {})),
        (OFTEN_AFTER, graph.out.get(tool, {})),
    ):
        ranked = sorted(edges.items(), key=lambda kv: (-kv[1], kv[0]))[:per_relation]
        result.extend(Related(tool_id=t, relation=relation, score=w) for t, w in ranked)
    return result


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties broken by index)."""
    n = scores.shape[0]
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return np.argsort(-scores, kind="stable")
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def rank_by(items: Iterable[tuple[str, float]], limit: int) -> list[tuple[str, float]]:
    """Sort (id, score) pairs best first, ties by id, and keep ``limit``."""
    return sorted(items, key=lambda kv: (-kv[1], kv[0]))[:limit]


def success_rate_of(stats: Mapping[str, float | int | None]) -> float | None:
    """Success rate of a node's stats, ``None`` when it has no executions."""
    executions = int(stats.get("executions") or 0)
    if executions <= 0:
        return None
    rate = stats.get("success_rate")
    if rate is None:
        rate = float(stats.get("successes") or 0) / executions
    return float(rate)
