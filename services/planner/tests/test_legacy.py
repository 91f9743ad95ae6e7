"""The legacy next-step heuristic (ADR-038 §2.2) on hand-built graphs."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import networkx as nx
import pytest

from pml_planner.legacy import (
    COMMUNITY_WEIGHT,
    COOCCURRENCE_WEIGHT,
    PAGERANK_WEIGHT,
    RECENCY_WEIGHT,
    ToolGraphFeatures,
    pagerank,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

# Two dense families joined by weak edges: {a, b, c} and {d, e, f}. From `a`, b and d are
# equally frequent successors (weight 1.0), e and f equally rare ones (0.5).
EDGES = [
    ("a", "b", 1.0),
    ("b", "a", 1.0),
    ("b", "c", 1.0),
    ("c", "a", 1.0),
    ("a", "c", 0.25),
    ("d", "e", 1.0),
    ("e", "f", 1.0),
    ("f", "d", 1.0),
    ("f", "e", 1.0),
    ("c", "d", 0.1),
    ("a", "d", 1.0),
    ("a", "e", 0.5),
    ("a", "f", 0.5),
]


@pytest.fixture
def features() -> ToolGraphFeatures:
    return ToolGraphFeatures.build(EDGES, {}, version="g1")


def test_weights_are_those_of_adr_038() -> None:
    assert (COOCCURRENCE_WEIGHT, COMMUNITY_WEIGHT, RECENCY_WEIGHT, PAGERANK_WEIGHT) == (
        0.6,
        0.3,
        0.1,
        0.1,
    )


def test_hand_built_graph_has_the_two_families_as_communities(
    features: ToolGraphFeatures,
) -> None:
    c = features.communities
    assert c["a"] == c["b"] == c["c"]
    assert c["d"] == c["e"] == c["f"]
    assert c["a"] != c["d"]


def test_score_is_the_weighted_sum_of_its_four_terms(features: ToolGraphFeatures) -> None:
    with_recency = ToolGraphFeatures.build(EDGES, {"e": NOW - timedelta(hours=6)})
    for candidate in "bcdef":
        s = with_recency.explain("a", candidate, NOW)
        assert s.score == pytest.approx(
            0.6 * s.cooccurrence + 0.3 * s.community + 0.1 * s.recency + 0.1 * s.pagerank
        )
    e = with_recency.explain("a", "e", NOW)
    assert e.cooccurrence == pytest.approx(0.5)  # 0.5 / max outgoing weight of a (1.0)
    assert e.community == 0.0
    assert e.recency == pytest.approx(math.exp(-0.25))
    assert e.pagerank == pytest.approx(1.0)  # e collects most of the rank in this graph


def test_cooccurrence_dominates_recency_and_pagerank() -> None:
    # `rare` follows x seldom but was used a minute ago and is the graph's hub; `often` follows
    # x five times as often and was never used. Co-occurrence weighs 0.6: `often` wins.
    edges = [("x", "often", 1.0), ("x", "rare", 0.2)]
    edges += [(f"h{i}", "rare", 1.0) for i in range(5)] + [("often", "x", 1.0)]
    f = ToolGraphFeatures.build(edges, {"rare": NOW - timedelta(minutes=1)})
    often, rare = f.explain("x", "often", NOW), f.explain("x", "rare", NOW)
    assert rare.recency > 0.99 and rare.pagerank == 1.0 and often.pagerank < 1.0
    assert often.cooccurrence == 1.0 and rare.cooccurrence == pytest.approx(0.2)
    assert [t for t, _ in f.rank_next(["x"], ["often", "rare"], now=NOW)] == ["often", "rare"]


def test_community_bonus_breaks_a_cooccurrence_tie(features: ToolGraphFeatures) -> None:
    b, d = features.explain("a", "b", NOW), features.explain("a", "d", NOW)
    assert b.cooccurrence == d.cooccurrence == 1.0
    assert d.pagerank > b.pagerank  # d alone would win on PageRank...
    assert b.score - d.score == pytest.approx(0.3 + 0.1 * (b.pagerank - d.pagerank))
    ranked = features.rank_next(["a"], now=NOW)
    assert ranked[0][0] == "b"  # ...the Louvain bonus (0.3) decides
    assert ranked[0][1] == pytest.approx(b.score)


def test_pagerank_bonus_breaks_a_tie_when_all_else_is_equal(
    features: ToolGraphFeatures,
) -> None:
    e, f = features.explain("a", "e", NOW), features.explain("a", "f", NOW)
    assert (e.cooccurrence, e.community, e.recency) == (f.cooccurrence, f.community, f.recency)
    assert e.pagerank > f.pagerank
    assert e.score - f.score == pytest.approx(0.1 * (e.pagerank - f.pagerank))
    assert [t for t, _ in features.rank_next(["a"], ["f", "e"], now=NOW)] == ["e", "f"]


def test_recency_decays_over_one_day() -> None:
    last_used = {
        "now": NOW,
        "day": NOW - timedelta(days=1),
        "two_days": NOW - timedelta(days=2),
        "future": NOW + timedelta(minutes=5),  # clock skew between writers
        "never": None,
    }
    f = ToolGraphFeatures.build([], last_used)
    assert f.recency("now", NOW) == 1.0
    assert f.recency("day", NOW) == pytest.approx(math.exp(-1))
    assert f.recency("two_days", NOW) == pytest.approx(math.exp(-2))
    assert f.recency("future", NOW) == 1.0
    assert f.recency("never", NOW) == 0.0
    assert "never" in f.tools
    ranked = f.rank_next([], ["never", "two_days", "day", "now"], k=4, now=NOW)
    assert [t for t, _ in ranked] == ["now", "day", "two_days", "never"]
    # Without edges PageRank is uniform (1.0 after normalisation): only recency separates them.
    assert ranked[0][1] - ranked[1][1] == pytest.approx(0.1 * (1 - math.exp(-1)))


def test_recency_reads_naive_timestamps_as_utc() -> None:
    f = ToolGraphFeatures.build([], {"t": NOW.replace(tzinfo=None) - timedelta(days=1)})
    assert f.recency("t", NOW) == pytest.approx(math.exp(-1))


def test_last_context_tool_is_current(features: ToolGraphFeatures) -> None:
    assert features.rank_next(["d", "a"], now=NOW) == features.rank_next(["a"], now=NOW)
    assert features.rank_next(["a", "d"], now=NOW) == features.rank_next(["d"], now=NOW)


def test_default_candidates_are_every_tool_but_current(features: ToolGraphFeatures) -> None:
    ranked = features.rank_next(["a"], k=100, now=NOW)
    assert sorted(t for t, _ in ranked) == ["b", "c", "d", "e", "f"]
    assert len(features.rank_next(["a"], k=2, now=NOW)) == 2


def test_without_context_or_with_an_unknown_current_only_recency_and_pagerank_count(
    features: ToolGraphFeatures,
) -> None:
    for context in ([], ["unknown"]):
        for tool, score in features.rank_next(context, k=10, now=NOW):
            assert score == pytest.approx(0.1 * features.pagerank[tool])


def test_unknown_candidate_scores_zero_and_duplicates_are_merged(
    features: ToolGraphFeatures,
) -> None:
    ranked = features.rank_next(["a"], ["zzz", "b", "b"], now=NOW)
    assert [t for t, _ in ranked] == ["b", "zzz"]
    assert ranked[1][1] == 0.0


def test_parallel_edges_keep_the_heaviest_and_self_loops_are_ignored() -> None:
    f = ToolGraphFeatures.build([("a", "b", 0.5), ("a", "b", 0.8), ("a", "c", 1.0), ("a", "a", 9)])
    assert f.cooccurrence("a", "b") == pytest.approx(0.8)
    assert f.cooccurrence("a", "a") == 0.0


@pytest.mark.parametrize("weight", [-0.1, math.nan, math.inf])
def test_invalid_weights_are_rejected(weight: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        ToolGraphFeatures.build([("a", "b", weight)])


def test_k_must_be_positive(features: ToolGraphFeatures) -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        features.rank_next(["a"], k=0)


def test_features_and_ranking_are_deterministic() -> None:
    shuffled = EDGES[:]
    random.Random(7).shuffle(shuffled)
    one = ToolGraphFeatures.build(EDGES, {"c": NOW})
    two = ToolGraphFeatures.build(shuffled, {"c": NOW})
    assert one.communities == two.communities
    assert one.pagerank == pytest.approx(two.pagerank)
    for context in (["a"], ["d"], ["b", "e"], []):
        assert one.rank_next(context, k=6, now=NOW) == two.rank_next(context, k=6, now=NOW)


def test_pagerank_matches_networkx() -> None:
    from networkx.algorithms.link_analysis.pagerank_alg import _pagerank_python

    rng = random.Random(3)
    tools = [f"t{i}" for i in range(25)]
    f = ToolGraphFeatures.build(
        [(rng.choice(tools), rng.choice(tools), rng.random()) for _ in range(70)], tools=tools
    )
    graph = nx.DiGraph()
    graph.add_nodes_from(f.tools)  # includes dangling and isolated tools
    graph.add_weighted_edges_from(
        (src, dst, w) for src, out in f.successors.items() for dst, w in out.items()
    )
    expected = _pagerank_python(graph, weight="weight")
    ours = pagerank(f.tools, f.successors)
    assert sum(ours.values()) == pytest.approx(1.0)
    for tool in f.tools:
        assert ours[tool] == pytest.approx(expected[tool], abs=1e-9)
    assert max(f.pagerank.values()) == pytest.approx(1.0)


def test_empty_graph() -> None:
    f = ToolGraphFeatures.build([])
    assert f.tools == ()
    assert f.rank_next(["a"], now=NOW) == []


@pytest.mark.parametrize("seed", range(5))
def test_ranking_every_tool_at_once_matches_scoring_each_one(seed: int) -> None:
    rng = random.Random(seed)
    tools = [f"t{i:03d}" for i in range(120)]
    edges = [
        (rng.choice(tools), rng.choice(tools), rng.choice([0.25, 0.5, 1.0])) for _ in range(300)
    ]
    used = {t: NOW - timedelta(hours=rng.uniform(0, 72)) for t in rng.sample(tools, 40)}
    features = ToolGraphFeatures.build(edges, used, tools=tools)
    for context in ([], [rng.choice(tools)], ["unknown"], [tools[0], tools[1]]):
        current = context[-1] if context else None
        each = sorted(
            (features.explain(current, t, NOW) for t in features.tools if t != current),
            key=lambda s: (-s.score, s.tool),
        )
        expected = [(s.tool, s.score) for s in each[:10]]
        ranked = features.rank_next(context, k=10, now=NOW)
        assert [t for t, _ in ranked] == [t for t, _ in expected]
        assert [s for _, s in ranked] == pytest.approx([s for _, s in expected], abs=1e-12)
