"""The legacy next-step heuristic of ADR-038 §2.2: the baseline DR-DSP is compared against.

    score(c) = 0.6·cooccurrence(current→c) + 0.3·community(current, c)
             + 0.1·recency(c) + 0.1·pagerank(c)

- cooccurrence: weight of the edge current→c divided by the heaviest edge leaving `current`
  (so the best-known successor of `current` gets 1.0). Weights are whatever the caller passes,
  typically the LINK `weight` (type × source, ADR-038 §2.3); when several edges join the same
  ordered pair (one per LINK type), the heaviest counts, as in the search service's graph.
- community: 1.0 when `current` and c are in the same Louvain community of the undirected tool
  graph (the weight of a pair is the sum of both directions: Louvain wants an undirected
  graph, and traffic either way is evidence the tools work together), else 0.0.
- recency: exp(−age / 1 day) from the tool's `last_used_at`; 0.0 for a tool never used. An
  age below zero (clock skew between writers) counts as zero.
- pagerank: weighted PageRank of the directed graph, divided by the largest value.

The weights sum to 1.1, as ADR-038 wrote them (§4.2 inventories 0.6 and 0.3 as validated); a
score is a ranking value, not a probability.

Context. With several context tools (oldest first), the last one is `current`: the heuristic
predicts the step after the one just executed, and earlier steps only matter through the edges
that led there. Without context, or with a `current` the graph does not know, co-occurrence and
community are 0 and candidates rank by recency and PageRank alone.

Cost. Louvain and PageRank are global and the costly part, so `ToolGraphFeatures` computes them
once per graph version; recency depends on the time of the request and is computed per call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

import networkx as nx
import numpy as np

COOCCURRENCE_WEIGHT = 0.6
COMMUNITY_WEIGHT = 0.3
RECENCY_WEIGHT = 0.1
PAGERANK_WEIGHT = 0.1
#: Time constant of the recency decay ("used in the last 24 h of the project", ADR-038 §2.2).
RECENCY_SCALE = timedelta(days=1)
RECENCY_SCALE_S = RECENCY_SCALE.total_seconds()

#: Louvain is randomised (node visiting order); a fixed seed makes communities reproducible.
LOUVAIN_SEED = 38
LOUVAIN_RESOLUTION = 1.0

# PageRank as networkx defines it (damping 0.85, dangling mass spread uniformly, stop when the
# L1 change is below N·tol). networkx's own `pagerank` needs scipy, which the planner does not
# ship, so the same power iteration is done here with numpy over the edge list.
PAGERANK_DAMPING = 0.85
PAGERANK_TOL = 1e-6
PAGERANK_MAX_ITER = 100

Edge = tuple[str, str, float]


@dataclass(frozen=True)
class NextStepScore:
    """One candidate's score and the four terms it is made of (each in [0, 1])."""

    tool: str
    score: float
    cooccurrence: float
    community: float
    recency: float
    pagerank: float


@dataclass(frozen=True)
class ToolGraphFeatures:
    """Graph features of one version of a tenant's tool graph; immutable, build once per version.

    `version` is the caller's label of the graph it was built from, so a holder can tell when to
    rebuild.
    """

    tools: tuple[str, ...]
    #: Best weight of every directed pair, by source then destination.
    successors: Mapping[str, Mapping[str, float]]
    #: Heaviest outgoing weight of every source: co-occurrence's denominator, computed once
    #: here rather than for every candidate of every ranking.
    heaviest: Mapping[str, float]
    #: Louvain community label of every tool (labels are 0.. in order of each community's
    #: smallest tool id, so they do not depend on set iteration order).
    communities: Mapping[str, int]
    #: PageRank divided by its maximum, in [0, 1].
    pagerank: Mapping[str, float]
    last_used: Mapping[str, datetime]
    version: str = ""

    @classmethod
    def build(
        cls,
        edges: Iterable[Edge],
        last_used: Mapping[str, datetime | None] | None = None,
        *,
        tools: Iterable[str] = (),
        version: str = "",
    ) -> ToolGraphFeatures:
        """Features from plain inputs.

        `edges` are directed (src, dst, weight); self-loops and zero weights carry no signal
        and are skipped, a negative or non-finite weight is an error. The tools are those named
        by `tools`, `edges` and `last_used`.
        """
        successors = _best_edges(edges)
        used = {tool: as_utc(at) for tool, at in (last_used or {}).items() if at is not None}
        names: set[str] = set(tools) | set(successors) | set(last_used or {})
        for targets in successors.values():
            names.update(targets)
        ordered = tuple(sorted(names))
        return cls(
            tools=ordered,
            successors=successors,
            heaviest={src: max(out.values()) for src, out in successors.items()},
            communities=_louvain(ordered, successors),
            pagerank=_normalised_pagerank(ordered, successors),
            last_used=used,
            version=version,
        )

    # --- the four terms ------------------------------------------------------------------

    def cooccurrence(self, current: str, candidate: str) -> float:
        out = self.successors.get(current)
        if not out:
            return 0.0
        return out.get(candidate, 0.0) / self.heaviest[current]

    def community(self, current: str, candidate: str) -> float:
        a, b = self.communities.get(current), self.communities.get(candidate)
        return 1.0 if a is not None and a == b else 0.0

    def recency(self, candidate: str, now: datetime) -> float:
        at = self.last_used.get(candidate)
        if at is None:
            return 0.0
        age = max((as_utc(now) - at) / RECENCY_SCALE, 0.0)
        return math.exp(-age)

    # --- scoring -------------------------------------------------------------------------

    @cached_property
    def _columns(self) -> _Columns:
        """The terms that do not depend on the current tool, one entry per tool in `tools`
        order (ids sorted)."""
        used = [self.last_used.get(t) for t in self.tools]
        return _Columns(
            index={t: i for i, t in enumerate(self.tools)},
            pagerank=np.array([self.pagerank.get(t, 0.0) for t in self.tools]),
            community=np.array([self.communities.get(t, -1) for t in self.tools]),
            used_s=np.array([at.timestamp() if at else np.nan for at in used]),
        )

    def _rank_all(self, current: str | None, k: int, now: datetime) -> list[tuple[str, float]]:
        """`rank_next` over every known tool, the four terms computed as columns: a tenant of
        thousands of tools is ranked many times per judged run (`prequential`)."""
        cols = self._columns
        age = np.maximum((as_utc(now).timestamp() - cols.used_s) / RECENCY_SCALE_S, 0.0)
        recency = np.where(np.isnan(cols.used_s), 0.0, np.exp(-np.nan_to_num(age)))
        co = np.zeros(len(self.tools))
        community = np.zeros(len(self.tools))
        if current is not None:
            for dst, weight in self.successors.get(current, {}).items():
                co[cols.index[dst]] = weight / self.heaviest[current]
            group = self.communities.get(current)
            if group is not None:
                community = (cols.community == group).astype(float)
        score = (
            COOCCURRENCE_WEIGHT * co
            + COMMUNITY_WEIGHT * community
            + RECENCY_WEIGHT * recency
            + PAGERANK_WEIGHT * cols.pagerank
        )
        # A stable sort of the negated scores keeps ties in id order, as `explain`'s ranking.
        order = np.argsort(-score, kind="stable")
        ranked = [(self.tools[i], float(score[i])) for i in order[: k + 1]]
        return [r for r in ranked if r[0] != current][:k]

    def explain(
        self, current: str | None, candidate: str, now: datetime | None = None
    ) -> NextStepScore:
        """The score of `candidate` after `current` (None: no context) with its terms."""
        now = now or datetime.now(UTC)
        co = self.cooccurrence(current, candidate) if current is not None else 0.0
        comm = self.community(current, candidate) if current is not None else 0.0
        rec = self.recency(candidate, now)
        pr = self.pagerank.get(candidate, 0.0)
        score = (
            COOCCURRENCE_WEIGHT * co
            + COMMUNITY_WEIGHT * comm
            + RECENCY_WEIGHT * rec
            + PAGERANK_WEIGHT * pr
        )
        return NextStepScore(candidate, score, co, comm, rec, pr)

    def rank_next(
        self,
        context_tools: Sequence[str],
        candidates: Iterable[str] | None = None,
        k: int = 10,
        *,
        now: datetime | None = None,
    ) -> list[tuple[str, float]]:
        """The k best next tools after `context_tools` (oldest first; the last is `current`).

        `candidates` defaults to every known tool except `current`; unknown candidates are
        scored too (recency and PageRank 0). Ties are broken by tool id so the order is
        reproducible. `explain` gives the terms of one score.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        current = context_tools[-1] if context_tools else None
        now = now or datetime.now(UTC)
        if candidates is None:
            return self._rank_all(current, k, now)
        scored = [self.explain(current, c, now) for c in dict.fromkeys(candidates)]
        scored.sort(key=lambda s: (-s.score, s.tool))
        return [(s.tool, s.score) for s in scored[:k]]


@dataclass(frozen=True)
class _Columns:
    index: Mapping[str, int]
    pagerank: np.ndarray
    community: np.ndarray
    used_s: np.ndarray  # seconds since the epoch; NaN for a tool never used


# --- construction helpers -----------------------------------------------------------------


def _best_edges(edges: Iterable[Edge]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for src, dst, weight in edges:
        w = float(weight)
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"edge {src}→{dst} has weight {weight}; weights must be finite, ≥ 0")
        if src == dst or w == 0.0:
            continue
        targets = out.setdefault(src, {})
        targets[dst] = max(w, targets.get(dst, 0.0))
    return out


def as_utc(at: datetime) -> datetime:
    # Neo4j and the events store UTC; a naive timestamp is read as UTC rather than local time.
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _louvain(tools: Sequence[str], successors: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    graph = nx.Graph()
    # Insertion order influences Louvain's result even with a seed: build in sorted order.
    graph.add_nodes_from(tools)
    pairs: dict[tuple[str, str], float] = {}
    for src in sorted(successors):
        for dst, weight in sorted(successors[src].items()):
            a, b = (src, dst) if src < dst else (dst, src)
            pairs[(a, b)] = pairs.get((a, b), 0.0) + weight
    graph.add_weighted_edges_from((a, b, w) for (a, b), w in sorted(pairs.items()))
    if graph.number_of_edges() == 0:
        return {tool: i for i, tool in enumerate(tools)}
    found = nx.community.louvain_communities(
        graph, weight="weight", resolution=LOUVAIN_RESOLUTION, seed=LOUVAIN_SEED
    )
    ordered = sorted((sorted(c) for c in found), key=lambda members: members[0])
    return {tool: label for label, members in enumerate(ordered) for tool in members}


def _normalised_pagerank(
    tools: Sequence[str], successors: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    ranks = pagerank(tools, successors)
    top = max(ranks.values(), default=0.0)
    return {tool: (r / top if top > 0 else 0.0) for tool, r in ranks.items()}


def pagerank(
    tools: Sequence[str], successors: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """Weighted PageRank (sums to 1), the same fixed point as `networkx.pagerank`.

    A node sends its rank to its successors in proportion to edge weight; a node without
    outgoing weight (dangling) spreads its rank uniformly, and the teleport is uniform.
    """
    n = len(tools)
    if n == 0:
        return {}
    index = {tool: i for i, tool in enumerate(tools)}
    rows = [
        (index[src], index[dst], w) for src, out in successors.items() for dst, w in out.items()
    ]
    src = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    dst = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    weight = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
    out_weight = np.bincount(src, weights=weight, minlength=n)
    share = weight / out_weight[src] if len(rows) else weight
    dangling = out_weight == 0
    x = np.full(n, 1.0 / n)
    for _ in range(PAGERANK_MAX_ITER):
        previous = x
        spread = PAGERANK_DAMPING * x[dangling].sum() + (1.0 - PAGERANK_DAMPING)
        x = PAGERANK_DAMPING * np.bincount(dst, weights=x[src] * share, minlength=n) + spread / n
        if np.abs(x - previous).sum() < n * PAGERANK_TOL:
            break
    return {tool: float(x[i]) for tool, i in index.items()}
