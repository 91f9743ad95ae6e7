"""The hypergraph's costs and its reduced graph, checked against a brute-force reduction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pml_planner.hypergraph import (
    MIN_SUCCESS_RATE,
    ArcChange,
    Hyperedge,
    Hypergraph,
    capability_cost,
    capability_hyperedge,
    link_cost,
    link_hyperedge,
    reliability_cost,
)

# --- costs ---------------------------------------------------------------------------------


def test_capability_cost_is_inverse_success_rate_floored_and_neutral_when_unknown() -> None:
    assert capability_cost(None) == 1.0
    assert capability_cost(1.0) == 1.0
    assert capability_cost(0.5) == 2.0
    assert capability_cost(0.0) == pytest.approx(1 / MIN_SUCCESS_RATE) == 20.0
    assert capability_cost(0.01) == capability_cost(0.0)
    with pytest.raises(ValueError):
        reliability_cost(1.5)


def test_link_cost_is_inverse_type_times_source_scaled_by_destination() -> None:
    assert link_cost("dependency", "observed") == 1.0
    assert link_cost("sequence", "observed") == 2.0
    assert link_cost("contains", "inferred") == pytest.approx(1 / (0.8 * 0.7))
    assert link_cost("sequence", "template", 0.5) == pytest.approx(2 / (0.5 * 0.5))
    assert link_cost("sequence", "observed", None, factor=0.5) == 4.0
    # the cost order of ADR-038 §2.3: dependency < contains < sequence, observed < … < template
    assert link_cost("dependency", "observed") < link_cost("contains", "observed")
    assert link_cost("contains", "observed") < link_cost("sequence", "observed")
    assert link_cost("sequence", "observed") < link_cost("sequence", "inferred")
    assert link_cost("sequence", "inferred") < link_cost("sequence", "template")


def test_project_hyperedges() -> None:
    cap = capability_hyperedge("cap", ["t1", "sub", "cap"], 0.8)
    assert cap.id == "capability:cap" and cap.kind == "capability"
    assert cap.tail == {"t1", "sub"} and cap.head == {"cap"}
    assert cap.cost == pytest.approx(1.25)
    assert capability_hyperedge("cap", ["t1"], None, edge_id="cap#2").id == "cap#2"
    link = link_hyperedge("a", "b", "sequence", "inferred", success_rate_of_dst=0.5)
    assert (link.id, link.kind) == ("sequence:a->b", "sequence")
    assert link.tail == {"a"} and link.head == {"b"}
    assert link.cost == pytest.approx(2 / 0.35)
    with pytest.raises(ValueError):
        link_hyperedge("a", "b", "similar", "observed")


@pytest.mark.parametrize("cost", [0.0, -1.0, math.nan, math.inf])
def test_hyperedges_need_a_positive_finite_cost(cost: float) -> None:
    with pytest.raises(ValueError):
        Hyperedge("e", frozenset("a"), frozenset("b"), cost)


def test_hyperedges_must_provide_something() -> None:
    with pytest.raises(ValueError):
        Hyperedge("e", frozenset("a"), frozenset(), 1.0)


# --- the reduced graph, by hand --------------------------------------------------------------


def _edge(edge_id: str, tail: str, head: str, cost: float) -> Hyperedge:
    return Hyperedge(edge_id, frozenset(tail), frozenset(head), cost)


def test_arcs_follow_the_cheapest_covering_hyperedge() -> None:
    graph = Hypergraph()
    assert graph.add(_edge("e1", "ab", "c", 2.0)) == [
        ArcChange("a", "c", None, 2.0, None, "e1"),
        ArcChange("b", "c", None, 2.0, None, "e1"),
    ]
    # cheaper on (a, c) only; the tail vertex inside the head gives no self-loop
    assert graph.add(_edge("e2", "a", "ac", 1.0)) == [ArcChange("a", "c", 2.0, 1.0, "e1", "e2")]
    assert graph.arc_weight("a", "a") is None
    assert graph.reweight("e2", 3.0) == [ArcChange("a", "c", 1.0, 2.0, "e2", "e1")]
    assert graph.reweight("e2", 2.0) == []  # a tie goes to the smaller id: still e1
    assert graph.arc_edge("a", "c") == "e1"
    assert graph.remove("e1") == [
        ArcChange("a", "c", 2.0, 2.0, "e1", "e2"),
        ArcChange("b", "c", 2.0, None, "e1", None),
    ]
    assert sorted(graph.arcs()) == [("a", "c", 2.0)]
    assert sorted(graph.vertices) == ["a", "c"]
    assert graph.remove("e2") == [ArcChange("a", "c", 2.0, None, "e2", None)]
    assert list(graph.arcs()) == [] and list(graph.vertices) == []
    assert len(graph.out_arcs) == 0 and len(graph.in_arcs) == 0


def test_unknown_and_duplicate_ids_are_refused() -> None:
    graph = Hypergraph([_edge("e", "a", "b", 1.0)])
    with pytest.raises(ValueError):
        graph.add(_edge("e", "a", "b", 1.0))
    with pytest.raises(KeyError):
        graph.remove("nope")
    with pytest.raises(KeyError):
        graph.reweight("nope", 1.0)
    with pytest.raises(ValueError):
        graph.reweight("e", 0.0)
    assert graph.edge("e").cost == 1.0


def test_providers_are_cheapest_first() -> None:
    graph = Hypergraph(
        [_edge("x", "a", "t", 2.0), _edge("y", "b", "t", 1.0), _edge("z", "c", "t", 2.0)]
    )
    assert [e.id for e in graph.providers("t")] == ["y", "x", "z"]
    graph.remove("y")
    assert [e.id for e in graph.providers("t")] == ["x", "z"]
    assert graph.providers("a") == []


def test_heaps_stay_proportional_to_live_hyperedges() -> None:
    graph = Hypergraph([_edge("e1", "a", "b", 1.0), _edge("e2", "a", "b", 5.0)])
    for i in range(1000):
        graph.reweight("e2", 2.0 + i % 7)
        graph.reweight("e1", 1.0 + i % 3)
    assert len(graph._heaps["a", "b"]) <= 2 * 2 + 5
    assert graph.arc_weight("a", "b") == 1.0 + 999 % 3


# --- the reduced graph, against brute force ------------------------------------------------

VERTICES = "abcdef"
# Mostly a few round costs, so that ties between hyperedges (and the id rule) are common.
_ROUND = st.sampled_from([0.5, 1.0, 1.5, 2.0])
COSTS = st.one_of(_ROUND, _ROUND, st.floats(0.1, 10.0))
#: Adds outnumber removals so that pairs get covered by several hyperedges.
KINDS = ["add", "add", "add", "remove", "reweight", "reweight"]
Op = tuple[str, int, frozenset[str], frozenset[str], float, bool]
OPS = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 1000),  # which live (or removed) hyperedge, modulo their number
    st.frozensets(st.sampled_from(VERTICES), max_size=3),
    st.frozensets(st.sampled_from(VERTICES), min_size=1, max_size=3),
    COSTS,
    st.booleans(),  # re-use a removed id: its stale heap entries must stay dead
)


def brute_force_arcs(graph: Hypergraph) -> dict[tuple[str, str], tuple[float, str]]:
    """(weight, hyperedge) of every arc: the minimum (cost, id) over covering hyperedges."""
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for edge in graph.edges():
        for u in edge.tail:
            for v in edge.head:
                candidate = (edge.cost, edge.id)
                if u != v and ((u, v) not in best or candidate < best[u, v]):
                    best[u, v] = candidate
    return best


def reduced_arcs(graph: Hypergraph) -> dict[tuple[str, str], tuple[float, str]]:
    return {(u, v): (w, graph.arc_edge(u, v) or "") for u, v, w in graph.arcs()}


class Ops:
    """Applies random ops; hyperedges are picked among the live (or removed) ones."""

    def __init__(self, graph: Hypergraph) -> None:
        self.graph = graph
        self.live: list[str] = []
        self.removed: list[str] = []

    def apply(self, op: Op) -> list[ArcChange] | None:
        kind, index, tail, head, cost, reuse = op
        if kind == "add":
            if reuse and self.removed:
                edge_id = self.removed.pop(index % len(self.removed))
            else:
                edge_id = f"e{len(self.live) + len(self.removed)}"
            self.live.append(edge_id)
            return self.graph.add(Hyperedge(edge_id, tail, head, cost))
        if not self.live:
            return None
        if kind == "remove":
            edge_id = self.live.pop(index % len(self.live))
            self.removed.append(edge_id)
            return self.graph.remove(edge_id)
        return self.graph.reweight(self.live[index % len(self.live)], cost)


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, min_size=5, max_size=40))
def test_reduced_graph_and_reported_changes_match_brute_force(ops: list[Op]) -> None:
    graph = Hypergraph()
    runner = Ops(graph)
    before = brute_force_arcs(graph)
    for op in ops:
        changes = runner.apply(op)
        after = brute_force_arcs(graph)
        assert reduced_arcs(graph) == after
        for u, v, w in graph.arcs():
            assert graph.in_arcs[v][u] == w
        assert sum(len(a) for a in graph.in_arcs.values()) == len(after)
        if changes is None:
            assert after == before
            continue
        reported = {(c.tail, c.head): c for c in changes}
        assert len(reported) == len(changes)
        expected = {
            pair for pair in before.keys() | after.keys() if before.get(pair) != after.get(pair)
        }
        assert reported.keys() == expected
        for pair, change in reported.items():
            old, new = before.get(pair), after.get(pair)
            assert (change.old_weight, change.old_edge) == (old or (None, None))
            assert (change.new_weight, change.new_edge) == (new or (None, None))
        mentioned = {v for e in graph.edges() for v in e.tail | e.head}
        assert set(graph.vertices) == mentioned
        before = after
