"""Unit tests of the pure ranking functions, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pml_search.ranking import (
    LinkGraph,
    Related,
    adamic_adar,
    adaptive_alpha,
    graph_relatedness,
    hybrid_score,
    rank_by,
    related_tools,
    reliability_factor,
    success_rate_of,
    top_k_indices,
    unified_score,
)


@pytest.mark.parametrize(
    ("rate", "factor"),
    [(None, 1.0), (0.0, 0.1), (0.49, 0.1), (0.5, 1.0), (0.75, 1.0), (0.9, 1.0), (0.91, 1.2)],
)
def test_reliability_factor_thresholds(rate: float | None, factor: float) -> None:
    assert reliability_factor(rate) == factor


def test_unified_score_caps_at_095_and_penalises() -> None:
    assert unified_score(0.85, 1.2) == 0.95  # 1.02 capped
    assert unified_score(0.7, 1.2) == pytest.approx(0.84)
    assert unified_score(0.7, 0.1) == pytest.approx(0.07)
    assert unified_score(0.6, 1.0) == pytest.approx(0.6)


def test_hybrid_score() -> None:
    assert hybrid_score(0.6, 1.0, 0.8) == pytest.approx(0.68)
    assert hybrid_score(0.6, 1.0, 1.0) == pytest.approx(0.6)


def _graph() -> LinkGraph:
    #   a --1.0--> b <--0.5-- c        b --0.8--> d
    #   a --0.7--> e --1.0--> d
    return LinkGraph.from_edges(
        [("a", "b", 1.0), ("c", "b", 0.5), ("b", "d", 0.8), ("a", "e", 0.7), ("e", "d", 1.0)]
    )


def test_link_graph_keeps_best_weight_per_pair_and_ignores_self_loops() -> None:
    g = LinkGraph.from_edges([("a", "b", 0.35), ("a", "b", 1.0), ("a", "b", 0.5), ("a", "a", 1)])
    assert g.out == {"a": {"b": 1.0}}
    assert g.inc == {"b": {"a": 1.0}}
    assert g.edge_count() == 1


def test_adamic_adar_weighted_by_weaker_edge() -> None:
    g = _graph()
    # common neighbours of a and d: b (degree 3: a, c, d) and e (degree 2: a, d)
    # b: min(1.0, 0.8) / ln 3 = 0.728191...; e: min(0.7, 1.0) / ln 2 = 1.009886...
    assert adamic_adar(g, "a", "d") == pytest.approx(1.7380779, rel=1e-6)
    assert adamic_adar(g, "d", "a") == pytest.approx(1.7380779, rel=1e-6)
    # c and d share only b: min(0.5, 0.8) / ln 3
    assert adamic_adar(g, "c", "d") == pytest.approx(0.4551196, rel=1e-6)
    # a and b are direct neighbours with no common neighbour
    assert adamic_adar(g, "a", "b") == 0.0
    assert adamic_adar(g, "a", "unknown") == 0.0


def test_graph_relatedness_direct_neighbour_is_one_either_direction() -> None:
    g = _graph()
    assert graph_relatedness(g, "b", ["a"]) == 1.0  # a -> b
    assert graph_relatedness(g, "a", ["b"]) == 1.0  # reverse direction counts too
    assert graph_relatedness(g, "b", []) == 0.0


def test_graph_relatedness_is_normalised_adamic_adar_max_over_context() -> None:
    g = _graph()
    # a–d: AA 1.73808 / 2 = 0.869039; c–d: 0.45512 / 2 = 0.227560 → max is 0.869039
    assert graph_relatedness(g, "d", ["c"]) == pytest.approx(0.2275598, rel=1e-6)
    assert graph_relatedness(g, "d", ["c", "a"]) == pytest.approx(0.8690390, rel=1e-6)
    # a direct neighbour anywhere in the context wins
    assert graph_relatedness(g, "d", ["c", "a", "e"]) == 1.0
    # capped at 1: x and y share four degree-2 neighbours of weight 1 → AA = 4/ln2 = 5.77
    h = LinkGraph.from_edges([(f"m{i}", t, 1.0) for i in range(4) for t in ("x", "y")])
    assert graph_relatedness(h, "x", ["y"]) == 1.0


def test_adaptive_alpha() -> None:
    assert adaptive_alpha(False, 500, 100) == 1.0
    assert adaptive_alpha(True, 0, 0) == 0.8
    assert adaptive_alpha(True, 9, 20) == 0.8
    assert adaptive_alpha(True, 10, 20) == pytest.approx(0.8)
    assert adaptive_alpha(True, 30, 20) == pytest.approx(0.7)  # halfway between 0.8 and 0.6
    assert adaptive_alpha(True, 50, 20) == pytest.approx(0.6)
    # rich and sparse: 60 edges over 100 nodes, density 0.006 → 1 − 2d > 0.6 → 0.6
    assert adaptive_alpha(True, 60, 100) == pytest.approx(0.6)
    # rich and denser: 54 edges over 16 nodes, density 54/240 = 0.225 → 1 − 0.45 = 0.55
    assert adaptive_alpha(True, 54, 16) == pytest.approx(0.55)
    # very dense: floor 0.5
    assert adaptive_alpha(True, 60, 10) == 0.5


def test_related_tools_in_and_out_neighbours_by_weight() -> None:
    g = _graph()
    assert related_tools(g, "b") == [
        Related("a", "often_before", 1.0),
        Related("c", "often_before", 0.5),
        Related("d", "often_after", 0.8),
    ]
    assert related_tools(g, "b", per_relation=1) == [
        Related("a", "often_before", 1.0),
        Related("d", "often_after", 0.8),
    ]
    assert related_tools(g, "zzz") == []


def test_remove_edges_touching() -> None:
    g = _graph()
    g.remove_edges_touching(["b"])
    assert g.edge_count() == 2
    assert "b" not in g.neighbours("a")
    assert g.neighbours("d") == {"e": 1.0}


def test_top_k_indices_and_rank_by() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.9, 0.3], dtype=np.float32)
    assert top_k_indices(scores, 2).tolist() == [1, 3]
    assert top_k_indices(scores, 10).tolist() == [1, 3, 2, 4, 0]
    assert top_k_indices(scores, 0).tolist() == []
    assert rank_by([("b", 0.5), ("a", 0.5), ("c", 0.7)], 2) == [("c", 0.7), ("a", 0.5)]


def test_success_rate_of() -> None:
    assert success_rate_of({"executions": 0, "successes": 0, "success_rate": None}) is None
    assert success_rate_of({}) is None
    assert success_rate_of({"executions": 4, "successes": 1, "success_rate": None}) == 0.25
    assert success_rate_of({"executions": 4, "successes": 1, "success_rate": 0.3}) == 0.3
