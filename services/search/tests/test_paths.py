"""The §8bis path score, the selection rule and the REASONED invariant, on hand-made paths."""

from __future__ import annotations

import itertools

import pytest

from pml_search.paths import (
    Edge,
    Evidence,
    Mode,
    Path,
    answer_mode,
    build_path,
    may_reason,
    score_path,
    select_paths,
)

QUOTE = Evidence("sec:d1:aaaaaaaaaaaa", "A requires B.", "d1")


def edge(a: str, b: str, confidence: float = 0.8, evidenced: bool = True) -> Edge:
    return Edge(a, "REQUIRES", b, confidence, (QUOTE,) if evidenced else ())


def path(*nodes: str, evidenced: bool = True, confidence: float = 0.8, **degrees: int) -> Path:
    edges = tuple(edge(a, b, confidence, evidenced) for a, b in itertools.pairwise(nodes))
    return Path(tuple(nodes), edges, dict(degrees))


def test_score_follows_the_formula_of_8bis() -> None:
    # two evidenced hops at 0.8: 0.4·1 + 0.3·0.64 + 0.2·1 + 0.1·1
    assert score_path(path("a", "b", "c")) == pytest.approx(0.4 + 0.3 * 0.64 + 0.2 + 0.1)
    # three hops: length penalty 0.1; one hub (degree 21): hub penalty 0.05
    three = path("a", "b", "c", "d", b=21)
    expected = 0.4 + 0.3 * 0.8**3 + 0.2 * (1 - 0.1) + 0.1 * (1 - 0.05)
    assert score_path(three) == pytest.approx(expected)
    # a degree of exactly 20 is no hub
    assert score_path(path("a", "b", "c", b=20)) == score_path(path("a", "b", "c"))


def test_evidence_coverage_weighs_most() -> None:
    proven = path("a", "b", "c", confidence=0.6)
    unproven = path("a", "b", "c", confidence=0.95, evidenced=False)
    assert proven.evidence_coverage == 1.0 and unproven.evidence_coverage == 0.0
    assert score_path(proven) > score_path(unproven)


def test_only_evidenced_paths_may_make_an_answer_reasoned() -> None:
    proven = path("a", "b")
    half = Path(("a", "b", "c"), (edge("a", "b"), edge("b", "c", evidenced=False)))
    structural = Path(("a",), ())
    quote_without_section = Path(
        ("a", "b"), (Edge("a", "REQUIRES", "b", 0.9, (Evidence("", "A requires B."),)),)
    )
    assert may_reason(proven)
    assert not may_reason(half)  # coverage 0.5 < 0.8
    assert not may_reason(structural)
    assert not may_reason(quote_without_section)
    assert select_paths([half, structural, quote_without_section]) == []
    assert answer_mode([], anchored=True) is Mode.ANCHORED
    assert answer_mode([], anchored=False) is Mode.TEXT_ONLY
    assert answer_mode(select_paths([proven, half]), anchored=True) is Mode.REASONED
    # even if a caller hands unproven paths over, the mode is not REASONED
    assert answer_mode([half], anchored=True) is Mode.ANCHORED


def test_selection_keeps_the_best_five_each_once() -> None:
    candidates = [path("a", f"x{i}", "b", confidence=0.5 + i / 20) for i in range(8)]
    candidates.append(path("a", "x7", "b", confidence=0.1))  # same nodes, worse: dropped
    selected = select_paths(candidates)
    assert [p.nodes[1] for p in selected] == ["x7", "x6", "x5", "x4", "x3"]
    assert selected[0].confidence == pytest.approx(0.85**2)  # the better of the two x7 paths


def test_build_path_needs_a_relation_for_every_hop() -> None:
    relations = {frozenset(("a", "b")): edge("a", "b"), frozenset(("c", "b")): edge("c", "b")}
    built = build_path(["a", "b", "c"], relations)
    assert built is not None and [e.source for e in built.edges] == ["a", "c"]
    assert build_path(["a", "c"], relations) is None
    assert build_path(["a", "b", "a"], relations) is None  # no loop
    assert build_path(["a"], relations) is None
