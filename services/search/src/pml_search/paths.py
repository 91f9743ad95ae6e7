"""Concept paths, their audit score and the answer mode (seed 001 §8bis and §2.2).

A path joins two seed concepts of a question through semantic relations of the knowledge graph
(Pass 3 relations, each with its evidence). Its score is the formula of §8bis, whose first
criterion is the share of edges backed by evidence:

    score = 0.4 · evidence_coverage + 0.3 · Π confidence
            + 0.2 · (1 − 0.1 · max(0, hops − 2)) + 0.1 · (1 − 0.05 · #hubs)

clamped to [0, 1], a hub being a node with more than `HUB_DEGREE` relations.

Selection: only paths with `evidence_coverage >= REASONED_MIN_COVERAGE` that hold at least one
evidenced semantic edge may make an answer REASONED (the invariant of §8bis, I2 of §9); the
best `TOP_PATHS` of them by score are kept. Without such a path the answer is ANCHORED when the
question's concepts anchor it in the graph (mentions, topics), else TEXT_ONLY.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

#: §8bis: a node with more relations than this is a generic hub.
HUB_DEGREE = 20
#: §8bis selection rule for the REASONED mode.
REASONED_MIN_COVERAGE = 0.8
#: §8bis: paths returned (k = 5 by default).
TOP_PATHS = 5
#: §5.3: paths of 1 to 3 hops.
MAX_HOPS = 3


class Mode(Enum):
    REASONED = "REASONED"
    ANCHORED = "ANCHORED"
    TEXT_ONLY = "TEXT_ONLY"


@dataclass(frozen=True)
class Evidence:
    """One quote backing a relation, found in one SectionContext."""

    context_id: str
    quote: str
    document_id: str = ""


@dataclass(frozen=True)
class Edge:
    """A semantic relation, in its stored direction."""

    source: str
    relation: str
    target: str
    confidence: float
    evidence: tuple[Evidence, ...] = ()

    @property
    def evidenced(self) -> bool:
        return bool(self.evidence) and all(e.context_id and e.quote for e in self.evidence)

    def joins(self, a: str, b: str) -> bool:
        return {self.source, self.target} == {a, b}


@dataclass(frozen=True)
class Path:
    """Concept keys in order and the edge between each consecutive two."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    degrees: dict[str, int] = field(default_factory=dict, compare=False, hash=False)

    @property
    def hops(self) -> int:
        return len(self.edges)

    @property
    def evidence_coverage(self) -> float:
        if not self.edges:
            return 0.0
        return sum(1 for e in self.edges if e.evidenced) / len(self.edges)

    @property
    def confidence(self) -> float:
        return math.prod(e.confidence for e in self.edges)

    @property
    def score(self) -> float:
        return score_path(self)

    def context_ids(self) -> list[str]:
        """The SectionContexts of the path's evidence, in edge order, without repeats."""
        return list(dict.fromkeys(ev.context_id for e in self.edges for ev in e.evidence))


def score_path(path: Path) -> float:
    """The audit score of §8bis, in [0, 1]."""
    if not path.edges:
        return 0.0
    length_penalty = max(0, path.hops - 2) * 0.1
    hub_penalty = sum(0.05 for n in path.nodes if path.degrees.get(n, 0) > HUB_DEGREE)
    score = (
        0.4 * path.evidence_coverage
        + 0.3 * path.confidence
        + 0.2 * (1 - length_penalty)
        + 0.1 * (1 - hub_penalty)
    )
    return max(0.0, min(1.0, score))


def may_reason(path: Path) -> bool:
    """The §8bis selection rule and invariant: evidence on at least `REASONED_MIN_COVERAGE` of
    the edges, and at least one evidenced semantic edge. A path of no edge (structural) or of
    unproven relations only can never qualify."""
    return (
        path.hops >= 1
        and path.evidence_coverage >= REASONED_MIN_COVERAGE
        and any(e.evidenced for e in path.edges)
    )


def select_paths(paths: Iterable[Path], top: int = TOP_PATHS) -> list[Path]:
    """The paths that may make an answer REASONED, best score first (fewer hops, then the
    node sequence, break ties so the order is stable), `top` kept, each node sequence once."""
    unique: dict[tuple[str, ...], Path] = {}
    for path in paths:
        if may_reason(path):
            kept = unique.get(path.nodes)
            if kept is None or path.score > kept.score:
                unique[path.nodes] = path
    ranked = sorted(unique.values(), key=lambda p: (-p.score, p.hops, p.nodes))
    return ranked[:top]


def answer_mode(selected: Sequence[Path], anchored: bool) -> Mode:
    """REASONED only on selected (evidenced) paths; ANCHORED on structural anchoring; else
    TEXT_ONLY."""
    if selected and all(may_reason(p) for p in selected):
        return Mode.REASONED
    return Mode.ANCHORED if anchored else Mode.TEXT_ONLY


def build_path(nodes: Sequence[str], edges_by_pair: dict[frozenset[str], Edge]) -> Path | None:
    """The path through `nodes` with the best stored relation of each consecutive pair; None
    when a pair has none (the path then does not exist in the semantic graph)."""
    edges = []
    for a, b in itertools.pairwise(nodes):
        edge = edges_by_pair.get(frozenset((a, b)))
        if edge is None or a == b:
            return None
        edges.append(edge)
    if not edges or len(edges) > MAX_HOPS or len(set(nodes)) != len(nodes):
        return None
    return Path(tuple(nodes), tuple(edges))
