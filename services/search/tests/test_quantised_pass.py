"""The 8-bit dense pass: its integer product is exact, its bounds hold, and the first stage it
serves is the float32 first stage, row for row and score for score."""

from __future__ import annotations

import numpy as np
import pytest

from pml_common.first_stage import (
    DENSE,
    HYBRID,
    LEXICAL,
    part_cosines,
    part_spans,
    relevance_error,
    relevance_of,
)
from pml_search.quantised_pass import (
    QUERY_LEVELS,
    ZERO_POINT,
    IntegerProduct,
    Rows,
    approximate,
    exact_top,
    quantise_rows,
)
from pml_search.ranking import top_k_indices

PRODUCT = IntegerProduct()
PARTS = (48, 32, 32)


def _ensemble(rng: np.random.Generator, n: int) -> np.ndarray:
    """n ensemble vectors: each model's unit vector scaled by 1/√k, side by side."""
    models = []
    for width in PARTS:
        unit = rng.normal(size=(n, width)).astype(np.float32)
        models.append(unit / np.linalg.norm(unit, axis=1, keepdims=True) / np.sqrt(len(PARTS)))
    return np.hstack(models).astype(np.float32)


def _rows(vectors: np.ndarray) -> Rows:
    floats = [
        np.ascontiguousarray(vectors[:, start : start + width])
        for start, width in part_spans(PARTS)
    ]
    return Rows(floats, [quantise_rows(f) for f in floats])


def _catalog(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random rows, with exact duplicates and rows a hair apart (closer than the 8-bit error),
    which only the float32 re-scoring tells apart."""
    vectors = _ensemble(rng, n)
    vectors[n // 2 : n // 2 + 20] = vectors[:20]
    vectors[n // 2 + 20 : n // 2 + 40] = vectors[20:40] * np.float32(1 - 1e-4)
    return vectors


def test_the_integer_product_is_exact_at_the_extreme_codes() -> None:
    # the largest codes on both sides: a 16-bit pairwise sum of 255 × 127 would saturate
    rows = np.array([[255] * 64, [1] * 64, [ZERO_POINT] * 64], dtype=np.uint8)
    queries = np.array([[QUERY_LEVELS] * 64, [-QUERY_LEVELS] * 64], dtype=np.int8)
    want = (rows.astype(np.int64) - ZERO_POINT) @ queries.astype(np.int64).T
    assert np.array_equal(PRODUCT(rows, queries), want)
    rng = np.random.default_rng(1)
    rows = rng.integers(1, 256, size=(300, 96), dtype=np.uint8)
    queries = rng.integers(-QUERY_LEVELS, QUERY_LEVELS + 1, size=(5, 96), dtype=np.int8)
    want = (rows.astype(np.int64) - ZERO_POINT) @ queries.astype(np.int64).T
    assert np.array_equal(PRODUCT(rows, queries), want)


def test_every_approximate_cosine_lies_within_its_bound() -> None:
    rng = np.random.default_rng(2)
    vectors = _catalog(rng, 2000)
    vectors[0] = 0.0  # a zero row, and one all on a single coordinate
    vectors[1] = 0.0
    vectors[1, 0] = 1.0 / np.sqrt(len(PARTS))
    rows = _rows(vectors)
    queries = _ensemble(rng, 4)
    approx = approximate(rows, queries, PRODUCT)
    exact = part_cosines(rows.floats, queries)
    error = np.abs(approx.cosines.astype(np.float64) - exact)
    assert np.all(error <= approx.bounds)
    # the bounds are what decides how many rows are scored again: they stay small
    assert float(approx.bounds.mean()) < 0.05
    assert float(error.max()) > 0  # the codes are not the floats


@pytest.mark.parametrize("retriever", [HYBRID, DENSE, LEXICAL])
@pytest.mark.parametrize("k", [1, 10, 60, 5000])
def test_the_top_rows_and_scores_are_those_of_the_float32_first_stage(
    retriever: str, k: int
) -> None:
    rng = np.random.default_rng(3)
    vectors = _catalog(rng, 3000)
    rows = _rows(vectors)
    texts = 3 if retriever == HYBRID else 1  # a request and two sub-goals
    queries = _ensemble(rng, texts)
    queries[0] = vectors[5] * 0.6 + queries[0] * 0.4  # a request near a row and its twin
    lexical = [np.where(rng.random(3000) < 0.05, rng.random(3000) * 9, 0.0) for _ in range(texts)]
    lexical = [scores.astype(np.float32) for scores in lexical]

    top = exact_top(
        approximate(rows, queries, PRODUCT),
        lexical,
        k,
        lambda cosines, scores: relevance_of(retriever, cosines, scores),
        lambda bounds, spans: relevance_error(retriever, bounds, spans),
    )

    cosines = part_cosines(rows.floats, queries)
    want = relevance_of(retriever, cosines, lexical)
    order = top_k_indices(want, k)
    # the same scores in the same order; rows may trade places only with an equal twin (a
    # product of two identical rows may differ in the last bit with the row's position)
    assert top.relevance == pytest.approx(want[order], abs=1e-6)
    assert top.relevance == pytest.approx(want[top.rows], abs=1e-6)
    assert top.cosines == pytest.approx(cosines[..., top.rows], abs=1e-6)
    traded = top.rows != order
    assert np.all(np.abs(want[top.rows[traded]] - want[order[traded]]) <= 1e-6)


def test_few_rows_are_scored_again() -> None:
    """The float32 re-scoring reads the rows that can reach the top and the extremes, not the
    catalog (counted through the rows `exact` is asked for)."""
    rng = np.random.default_rng(4)
    rows = _rows(_catalog(rng, 5000))
    queries = _ensemble(rng, 1)
    approx = approximate(rows, queries, PRODUCT)
    asked: list[int] = []

    class Counted(type(approx)):  # type: ignore[misc]
        def exact(self, which: np.ndarray) -> np.ndarray:
            asked.append(len(which))
            return super().exact(which)

    counted = Counted(approx.rows, approx.queries, approx.cosines, approx.bounds)
    lexical = [np.zeros(5000, dtype=np.float32)]
    exact_top(
        counted,
        lexical,
        10,
        lambda cosines, scores: relevance_of(HYBRID, cosines, scores),
        lambda bounds, spans: relevance_error(HYBRID, bounds, spans),
    )
    assert sum(asked) < 5000 // 2
