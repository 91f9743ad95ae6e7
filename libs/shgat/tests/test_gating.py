"""The served tool score and the gate's arithmetic (pml_shgat.gating)."""

from __future__ import annotations

import numpy as np
import pytest

from pml_shgat.gating import (
    WEIGHT_GRID,
    Judged,
    choose_weight,
    figures,
    judge,
    one_figures,
    served_scores,
)


def test_weight_zero_is_the_first_stage_itself() -> None:
    first = np.array([0.9, 0.1, 0.5])
    correction = np.array([0.0, 1.0, 0.2])
    assert np.array_equal(served_scores(first, correction, 0.0), first)
    assert np.allclose(served_scores(first, correction, 2.0), first + 2.0 * correction)


def test_figures_of_one_execution_count_ties_against_the_executed_tool() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.1])
    # tools 0 and 2 tie at rank 2-3: pessimistically both are ranked 3
    assert one_figures(scores, (0, 3)) == (0.0, 1.0, 1.0, 3.0)
    assert one_figures(scores, (1,)) == (1.0, 1.0, 1.0, 1.0)


def test_the_chosen_weight_never_ranks_below_the_first_stage() -> None:
    rng = np.random.default_rng(0)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) for _ in judged]
    harmful = [-f for f in first]  # a correction that reverses the first stage
    weight, best = choose_weight(first, harmful, judged)
    assert weight == 0.0
    assert best == figures(first, judged)


def test_a_correction_that_points_at_the_executed_tools_gets_a_weight_and_is_admitted() -> None:
    rng = np.random.default_rng(1)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) for _ in judged]
    knows = [np.eye(20)[j.relevant[0]] for j in judged]
    verdict = judge(first, first, knows, judged, min_judged=3)
    assert verdict.accepted and verdict.weight in WEIGHT_GRID and verdict.weight > 0
    assert verdict.candidate.recall_at_1 == 1.0 > verdict.first_stage.recall_at_1
    # the same candidate, against a serving version that is as good: not admitted
    serving = [served_scores(f, k, verdict.weight) for f, k in zip(first, knows, strict=True)]
    again = judge(first, serving, knows, judged, min_judged=3)
    assert not again.accepted and "serving" in again.reason
    # too few held-back executions: not admitted, whatever the figures
    few = judge(first[:2], first[:2], knows[:2], judged[:2], min_judged=3)
    assert not few.accepted and few.candidate.count == 2


def test_the_grid_must_start_with_the_first_stage_alone() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        choose_weight([np.zeros(2)], [np.zeros(2)], [Judged((0,))], grid=(1.0, 2.0))
