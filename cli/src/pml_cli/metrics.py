"""Retrieval metrics, computed exactly as the evaluation data's README defines them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def recall_at(ranked: Sequence[str], relevant: Sequence[str], k: int) -> float:
    """|relevant ∩ top-k| / |relevant|."""
    wanted = set(relevant)
    if not wanted:
        return 0.0
    return len(wanted.intersection(ranked[:k])) / len(wanted)


def reciprocal_rank(ranked: Sequence[str], relevant: Sequence[str]) -> float:
    """1 / rank of the first relevant item, 0 when none is ranked."""
    wanted = set(relevant)
    for rank, item in enumerate(ranked, start=1):
        if item in wanted:
            return 1.0 / rank
    return 0.0


def ndcg_at(ranked: Sequence[str], relevant: Sequence[str], k: int) -> float:
    """NDCG@k with binary relevance."""
    wanted = set(relevant)
    dcg = sum(1.0 / math.log2(i + 2) for i, item in enumerate(ranked[:k]) if item in wanted)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(wanted), k)))
    return dcg / ideal if ideal else 0.0


def all_in_top(ranked: Sequence[str], relevant: Sequence[str], k: int) -> float:
    """1.0 when every relevant item is in the top k, else 0.0."""
    return 1.0 if set(relevant) <= set(ranked[:k]) else 0.0


#: The per-query tool-retrieval figures, in the order results list them.
TOOL_METRICS = ("recall@1", "recall@5", "recall@10", "ndcg@5", "mrr", "hit@1")


def tool_query_metrics(ranked: Sequence[str], relevant: Sequence[str]) -> dict[str, float]:
    """The figures of `TOOL_METRICS` for one query."""
    return {
        "recall@1": recall_at(ranked, relevant, 1),
        "recall@5": recall_at(ranked, relevant, 5),
        "recall@10": recall_at(ranked, relevant, 10),
        "ndcg@5": ndcg_at(ranked, relevant, 5),
        "mrr": reciprocal_rank(ranked, relevant),
        "hit@1": 1.0 if ranked[:1] and ranked[0] in set(relevant) else 0.0,
    }


@dataclass
class ToolMetrics:
    """Running means of the tool-retrieval metrics over queries."""

    sums: dict[str, float] = field(default_factory=dict)
    queries: int = 0

    def add(self, ranked: Sequence[str], relevant: Sequence[str]) -> dict[str, float]:
        """Add one query; its own figures."""
        values = tool_query_metrics(ranked, relevant)
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.queries += 1
        return values

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            name: round(self.sums.get(name, 0.0) / self.queries, 4) if self.queries else 0.0
            for name in TOOL_METRICS
        }
        out["queries"] = self.queries
        return out


@dataclass
class KnowledgeMetrics:
    """Running means of the knowledge-retrieval metrics over questions: recall@2, recall@5
    (|supporting ∩ top-k documents| / |supporting|) and all_evidence@8 (every supporting
    document in the top 8)."""

    sums: dict[str, float] = field(default_factory=dict)
    questions: int = 0

    def add(self, ranked: Sequence[str], supporting: Sequence[str]) -> None:
        values = {
            "recall@2": recall_at(ranked, supporting, 2),
            "recall@5": recall_at(ranked, supporting, 5),
            "all_evidence@8": all_in_top(ranked, supporting, 8),
        }
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.questions += 1

    def result(self) -> dict[str, float | int]:
        names = ("recall@2", "recall@5", "all_evidence@8")
        out: dict[str, float | int] = {
            name: round(self.sums.get(name, 0.0) / self.questions, 4) if self.questions else 0.0
            for name in names
        }
        out["questions"] = self.questions
        return out
