"""Planning metrics (TaskBench-style): next-step hits and DAG node/edge F1 against a sequence.

A test query has an intent and a ground-truth `sequence` s1..sn of tool ids (what was used, in
order). The metrics, exactly:

- `next_hit@k` — for every i in 0..n-1 the planner is asked for the next step given the intent
  and the first i steps s1..si as context (i = 0: no context). That prediction is a hit@k when
  s(i+1) is among the first k of its ranked candidates (as returned, next tool first). The
  figure is the mean over all (query, i) predictions, so a query of n steps weighs n — a
  micro-average; `predictions` counts them. An empty candidate list is a miss.
- `node_f1` — F1 between P, the set of *tool* nodes of the suggested DAG (its `nodes` that are
  tool ids of the catalog; capability nodes are left out), and G, the set of sequence tools:
  F1 = 2·|P ∩ G| / (|P| + |G|), i.e. the harmonic mean of precision and recall, 0 when
  either set is empty and the other is not, 1 when both are empty. Mean over queries.
- `edge_f1` — the same F1 between directed edge sets. Ground truth: the chain edges
  (s_i, s_i+1) for i = 1..n-1. Prediction: the DAG's `edges` (any type) whose source and target
  are both tool nodes and differ, as given — no transitive closure or reduction. When the DAG
  has no such tool→tool edge, the prediction is instead the consecutive pairs of its
  topological `order` after keeping only its tool nodes (o_1, o_2), (o_2, o_3), ….
  Mean over queries.
- `next_hit@1_first` / `next_hit@1_later` — next_hit@1 split by context: the i = 0 predictions
  (from the intent alone) and the i ≥ 1 ones (with the steps already run); `first_predictions`
  counts the former. Methods that read the context (legacy, discovery) differ most in the latter.
- `queries` — how many queries contributed a DAG (each contributes one node_f1 and one
  edge_f1 value).

Tool nodes are decided by membership in the catalog's tool ids when these are given, otherwise
every node counts as a tool. Sequences are used as given; callers deduplicate them first.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

HIT_KS = (1, 3)
#: The figures a method is compared on (counts left out).
PLAN_METRICS = (
    "next_hit@1",
    "next_hit@3",
    "next_hit@1_first",
    "next_hit@1_later",
    "node_f1",
    "edge_f1",
)


def next_step_cases(sequence: Sequence[str]) -> list[tuple[list[str], str]]:
    """(context, expected next tool) for i = 0..n-1: the first i steps, then s(i+1)."""
    return [(list(sequence[:i]), sequence[i]) for i in range(len(sequence))]


def hit_at(candidates: Sequence[str], expected: str, k: int) -> float:
    """1.0 when `expected` is among the first k candidates, else 0.0."""
    return 1.0 if expected in candidates[:k] else 0.0


def f1(predicted: Collection[object], truth: Collection[object]) -> float:
    """2·|P ∩ G| / (|P| + |G|); 1.0 when both sets are empty."""
    p, g = set(predicted), set(truth)
    if not p and not g:
        return 1.0
    return 2 * len(p & g) / (len(p) + len(g))


def _is_tool(node: str, tool_ids: Collection[str] | None) -> bool:
    return tool_ids is None or node in tool_ids


def dag_tool_nodes(nodes: Iterable[str], tool_ids: Collection[str] | None = None) -> set[str]:
    return {n for n in nodes if _is_tool(n, tool_ids)}


def chain_edges(sequence: Sequence[str]) -> set[tuple[str, str]]:
    """(s_i, s_i+1) for consecutive steps."""
    return {(a, b) for a, b in pairwise(sequence) if a != b}


def dag_tool_edges(
    edges: Iterable[tuple[str, str]],
    order: Sequence[str],
    tool_ids: Collection[str] | None = None,
) -> set[tuple[str, str]]:
    """The DAG's tool→tool edges, or when it has none the consecutive tool pairs of `order`."""
    given = {(s, t) for s, t in edges if s != t and _is_tool(s, tool_ids) and _is_tool(t, tool_ids)}
    if given:
        return given
    return chain_edges([n for n in order if _is_tool(n, tool_ids)])


def node_f1(
    nodes: Iterable[str], sequence: Sequence[str], tool_ids: Collection[str] | None = None
) -> float:
    return f1(dag_tool_nodes(nodes, tool_ids), set(sequence))


def edge_f1(
    edges: Iterable[tuple[str, str]],
    order: Sequence[str],
    sequence: Sequence[str],
    tool_ids: Collection[str] | None = None,
) -> float:
    return f1(dag_tool_edges(edges, order, tool_ids), chain_edges(sequence))


@dataclass
class PlanMetrics:
    """Running means: next_hit@k over predictions, node/edge F1 over queries."""

    tool_ids: Collection[str] | None = None
    hits: dict[int, float] = field(default_factory=lambda: dict.fromkeys(HIT_KS, 0.0))
    predictions: int = 0
    first_hits: float = 0.0
    first_predictions: int = 0
    node_sum: float = 0.0
    edge_sum: float = 0.0
    queries: int = 0

    def add_next(
        self, candidates: Sequence[str], expected: str, context_size: int
    ) -> dict[str, float]:
        """Add one next-step prediction; its `next_hit@k` values."""
        values = {f"next_hit@{k}": hit_at(candidates, expected, k) for k in self.hits}
        for k in self.hits:
            self.hits[k] += values[f"next_hit@{k}"]
        self.predictions += 1
        if context_size == 0:
            self.first_hits += values["next_hit@1"]
            self.first_predictions += 1
        return values

    def add_dag(
        self,
        nodes: Iterable[str],
        edges: Iterable[tuple[str, str]],
        order: Sequence[str],
        sequence: Sequence[str],
    ) -> dict[str, float]:
        """Add one suggested DAG; its `node_f1` and `edge_f1`."""
        values = {
            "node_f1": node_f1(nodes, sequence, self.tool_ids),
            "edge_f1": edge_f1(edges, order, sequence, self.tool_ids),
        }
        self.node_sum += values["node_f1"]
        self.edge_sum += values["edge_f1"]
        self.queries += 1
        return values

    def result(self) -> dict[str, float | int]:
        def mean(total: float, count: int) -> float:
            return round(total / count, 4) if count else 0.0

        out: dict[str, float | int] = {
            f"next_hit@{k}": mean(total, self.predictions) for k, total in self.hits.items()
        }
        later = self.predictions - self.first_predictions
        out["next_hit@1_first"] = mean(self.first_hits, self.first_predictions)
        out["next_hit@1_later"] = mean(self.hits[1] - self.first_hits, later)
        out["first_predictions"] = self.first_predictions
        out["node_f1"] = mean(self.node_sum, self.queries)
        out["edge_f1"] = mean(self.edge_sum, self.queries)
        out["queries"] = self.queries
        out["predictions"] = self.predictions
        return out
