"""The served tool score and the gate's arithmetic (pml_shgat.gating)."""

from __future__ import annotations

from collections.abc import Container

import numpy as np
import pytest

from pml_shgat.gating import (
    ADAPTER_GRID,
    FRESHER,
    MIN_NOVEL,
    MRR_TOLERANCE,
    WEIGHT_GRID,
    WITHDRAWN,
    Corrections,
    Figures,
    Judged,
    OutOfFold,
    Verdict,
    better,
    choose_weight,
    choose_weights,
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


def test_a_correction_that_must_order_its_candidates_alone_gets_a_weight_above_eight() -> None:
    # The first stage puts a distractor first by a full point; the correction prefers the
    # executed tool by 0.1 only, so it ranks first only at a weight above 10.
    judged = [Judged((1,)) for _ in range(10)]
    first = [np.array([1.0, 0.0, 0.5]) for _ in judged]
    correction = [np.array([0.85, 0.95, 0.0]) for _ in judged]
    weight, best = choose_weight(first, correction, judged)
    assert weight == 16.0
    assert best.recall_at_1 == 1.0


def test_a_correction_that_points_at_the_executed_tools_gets_a_weight_and_is_admitted() -> None:
    rng = np.random.default_rng(1)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) for _ in judged]
    knows = [np.eye(20)[j.relevant[0]] for j in judged]
    verdict = judge(first, first, Corrections(knows), judged, min_judged=3)
    assert verdict.accepted and verdict.weights.shgat in WEIGHT_GRID and verdict.weights.shgat > 0
    assert verdict.candidate.recall_at_1 == 1.0 > verdict.first_stage.recall_at_1
    # the same candidate, against a serving version that is as good: not admitted
    serving = [
        served_scores(f, k, verdict.weights.shgat) for f, k in zip(first, knows, strict=True)
    ]
    again = judge(first, serving, Corrections(knows), judged, min_judged=3)
    assert not again.accepted and "serving" in again.reason
    # too few held-back executions: not admitted, whatever the figures
    few = judge(first[:2], first[:2], Corrections(knows[:2]), judged[:2], min_judged=3)
    assert not few.accepted and few.candidate.count == 2


def test_a_tie_with_the_serving_version_is_admitted_only_when_fresher_and_better_than_first() -> (
    None
):
    rng = np.random.default_rng(4)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) for _ in judged]
    knows = [np.eye(20)[j.relevant[0]] for j in judged]
    serving = [served_scores(f, k, 8.0) for f, k in zip(first, knows, strict=True)]
    stale = judge(first, serving, Corrections(knows), judged, min_judged=3)
    assert not stale.accepted and "serving" in stale.reason
    fresher = judge(first, serving, Corrections(knows), judged, min_judged=3, fresher=True)
    assert fresher.accepted and fresher.reason == FRESHER and fresher.weights.shgat > 0.0
    # fresher, but worse than what is served: not admitted
    wrong = [np.eye(20)[(j.relevant[0] + 1) % 20] for j in judged]
    worse = judge(first, serving, Corrections(wrong), judged, min_judged=3, fresher=True)
    assert not worse.accepted and better(worse.serving, worse.candidate)
    # fresher and tied, but with nothing over the first stage (first stage served): not admitted
    useless = [np.zeros(20) for _ in judged]
    idle = judge(first, first, Corrections(useless), judged, min_judged=3, fresher=True)
    assert not idle.accepted


def test_the_grid_must_start_with_the_first_stage_alone() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        choose_weight([np.zeros(2)], [np.zeros(2)], [Judged((0,))], grid=(1.0, 2.0))


def _seen_and_novel(rng: np.random.Generator, novel: int) -> tuple[list[Judged], list, list]:
    """30 held-back executions of 20 tools, the last `novel` of a new kind that the first stage
    ranks right, and a correction that knows the seen ones' tools and points the novel ones at
    a wrong tool."""
    tools = rng.integers(0, 20, 30)
    judged = [Judged((int(i),), novel=n >= 30 - novel) for n, i in enumerate(tools)]
    first = [rng.random(20) + np.eye(20)[j.relevant[0]] * j.novel for j in judged]
    correction = [
        np.eye(20)[(j.relevant[0] + 1) % 20] if j.novel else np.eye(20)[j.relevant[0]]
        for j in judged
    ]
    return judged, first, correction


def test_a_weight_that_hurts_novel_executions_is_not_chosen() -> None:
    judged, first, correction = _seen_and_novel(np.random.default_rng(2), novel=MIN_NOVEL + 3)
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    # without the novel ones' veto, the weight that ranks all held-back executions best is larger
    unflagged = [Judged(j.relevant) for j in judged]
    unguarded, _ = choose_weight(first, correction, unflagged)
    assert unguarded > verdict.weights.shgat
    heavy = [served_scores(f, c, unguarded) for f, c in zip(first, correction, strict=True)]
    novel = [i for i, j in enumerate(judged) if j.novel]
    hurt = figures([heavy[i] for i in novel], [judged[i] for i in novel])
    assert better(verdict.novel_first_stage, hurt)
    # the weight chosen does not rank the novel executions below the first stage
    assert not better(verdict.novel_first_stage, verdict.novel_candidate)
    assert verdict.novel_candidate.count == MIN_NOVEL + 3
    assert verdict.as_metrics()["holdout_novel_size"] == MIN_NOVEL + 3


def test_too_few_novel_executions_bar_nothing() -> None:
    judged, first, correction = _seen_and_novel(np.random.default_rng(2), novel=MIN_NOVEL - 1)
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    assert verdict.weights.shgat > 0.0 and verdict.accepted
    assert verdict.novel_candidate.recall_at_1 < verdict.novel_first_stage.recall_at_1


def test_a_serving_version_the_first_stage_now_beats_is_withdrawn() -> None:
    """Admitted on an earlier held-back set, the serving correction now ranks the executed
    tools below the first stage: a candidate that adds nothing (weight 0) replaces it."""
    rng = np.random.default_rng(3)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) + np.eye(20)[j.relevant[0]] for j in judged]
    wrong = [np.eye(20)[(j.relevant[0] + 1) % 20] for j in judged]
    serving = [served_scores(f, w, 4.0) for f, w in zip(first, wrong, strict=True)]
    useless = [np.zeros(20) for _ in judged]
    verdict = judge(first, serving, Corrections(useless), judged, min_judged=3)
    assert verdict.accepted and verdict.reason == WITHDRAWN and verdict.weights.shgat == 0.0
    assert verdict.candidate == verdict.first_stage
    assert better(verdict.first_stage, verdict.serving)
    # the same candidate while the first stage itself is served: nothing to withdraw
    again = judge(first, first, Corrections(useless), judged, min_judged=3)
    assert not again.accepted and "serving" in again.reason


def test_more_of_the_executed_tools_in_the_top_five_does_not_excuse_a_first_step_pushed_down() -> (
    None
):
    # recall@5 up by 0.2, the first executed tool from rank 1 to rank 3: not better
    wider = Figures(0.3, 0.9, 1.0, 3.0, 1 / 3, 10)
    sharper = Figures(0.5, 0.7, 0.9, 1.0, 1.0, 10)
    assert not better(wider, sharper)
    # the same recall gain with the first step where it was: better
    assert better(Figures(0.5, 0.9, 1.0, 1.0, 1.0, 10), sharper)


def _ranking(order: list[int], tools: int = 10) -> np.ndarray:
    """Scores that rank the tools of `order` first, in that order, and the others below."""
    scores = np.zeros(tools)
    for place, tool in enumerate(order):
        scores[tool] = tools - place
    return scores


def _first_steps(judged: list[Judged], behind: set[int]) -> list[np.ndarray]:
    """Both executed tools (0 and 1) in the top five, the first behind the second in `behind`."""
    return [_ranking([1, 0] if i in behind else [0, 1]) for i in range(len(judged))]


def test_a_first_step_moved_within_the_noise_of_the_held_back_executions_decides_nothing() -> None:
    judged = [Judged((0, 1)) for _ in range(80)]
    # served: the first step first but for four executions, the second tool 6th (recall@5 0.5)
    served = [
        _ranking([1, 0, 2, 3, 4, 5]) if i < 4 else _ranking([0, 2, 3, 4, 5, 1]) for i in range(80)
    ]
    now = figures(served, judged)
    # both tools in the top five everywhere; the first step up in those four, down in eight
    # others: a mean reciprocal rank lower by 0.025, within two standard errors (0.043)
    wider = figures(_first_steps(judged, set(range(4, 12))), judged)
    assert wider.recall_at_5 == 1.0 and now.mrr - wider.mrr > MRR_TOLERANCE
    assert better(wider, now)
    # the first step down in 24 executions and up in none: not noise, still not excused
    pushed = figures(_first_steps(judged, set(range(4)) | set(range(10, 34))), judged)
    assert pushed.recall_at_5 == 1.0 and not better(pushed, now)


def test_a_reciprocal_rank_within_the_noise_does_not_surely_break_a_tie() -> None:
    judged = [Judged((0, 1)) for _ in range(80)]
    serving = figures(_first_steps(judged, set(range(4))), judged)
    candidate = figures(_first_steps(judged, set(range(4, 12))), judged)
    assert candidate.recall_at_5 == serving.recall_at_5
    # the reciprocal rank breaks the tie, but not surely: a fresher candidate replaces it
    assert better(serving, candidate) and not better(serving, candidate, surely=True)
    assert not better(candidate, serving)
    # the same difference over many executions is no longer noise
    many = [Judged((0, 1)) for _ in range(2000)]
    serving = figures(_first_steps(many, set(range(100))), many)
    candidate = figures(_first_steps(many, set(range(100, 300))), many)
    assert better(serving, candidate, surely=True)


def test_a_fresher_candidate_replaces_one_whose_first_steps_are_better_within_the_noise() -> None:
    judged = [Judged((0, 1)) for _ in range(80)]
    first = _first_steps(judged, set(range(40)))  # the first stage: half the first steps behind
    serving = _first_steps(judged, set(range(4)))
    # the candidate's correction puts the first step behind in eight executions, ahead elsewhere
    correction = [np.eye(10)[1 if i in range(4, 12) else 0] for i in range(80)]
    verdict = judge(first, serving, Corrections(correction), judged, min_judged=3, fresher=True)
    assert verdict.accepted and verdict.reason == FRESHER
    # not fresher: the serving version stays
    assert not judge(first, serving, Corrections(correction), judged, min_judged=3).accepted


def test_the_chosen_weights_figures_are_those_of_the_served_scores() -> None:
    rng = np.random.default_rng(6)
    judged = [Judged(tuple(int(t) for t in rng.choice(30, 2, replace=False))) for _ in range(25)]
    first = [rng.random(30) for _ in judged]
    correction = [rng.random(30) * 0.5 + np.eye(30)[j.relevant[0]] * 0.5 for j in judged]
    memory = [rng.random(30) * (rng.random(30) < 0.3) for _ in judged]
    weights, best = choose_weights(first, Corrections(correction, memory), judged)
    assert any(weights)
    served = [
        served_scores(served_scores(f, c, weights.shgat), m, weights.memory)
        for f, c, m in zip(first, correction, memory, strict=True)
    ]
    assert best == figures(served, judged)


def test_the_adapter_gets_a_share_only_where_its_first_stage_ranks_better() -> None:
    rng = np.random.default_rng(7)
    judged = [Judged((int(t),)) for t in rng.choice(30, 40)]
    first = [rng.random(30) for _ in judged]
    useless = [np.zeros(30) for _ in judged]
    # the adapted first stage puts the executed tool on top: its correction is adapted − first
    adapted = [
        np.maximum(f, 1.0 + np.eye(30)[j.relevant[0]]) - f
        for f, j in zip(first, judged, strict=True)
    ]
    weights, best = choose_weights(first, Corrections(useless, adapter=adapted), judged)
    assert weights.adapter in ADAPTER_GRID and weights.adapter > 0.0
    assert weights.shgat == weights.memory == 0.0 and best.recall_at_1 == 1.0
    verdict = judge(first, first, Corrections(useless, adapter=adapted), judged, min_judged=3)
    assert verdict.accepted and verdict.as_metrics()["adapter_weight"] == weights.adapter
    # one that pushes the executed tool down gets no share
    worse = [
        np.minimum(f, -np.eye(30)[j.relevant[0]]) - f for f, j in zip(first, judged, strict=True)
    ]
    weights, _ = choose_weights(first, Corrections(useless, adapter=worse), judged)
    assert weights == (0.0, 0.0, 0.0)


def _one_moved_in_seventeen(count: int) -> tuple[list[Judged], list[np.ndarray], list[np.ndarray]]:
    """`_moved_out` in one execution of seventeen."""
    return _moved_out(count, range(0, count, 17))


def test_a_gain_that_weights_chosen_on_other_executions_do_not_keep_is_not_admitted() -> None:
    judged, first, correction = _one_moved_in_seventeen(16)
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    # one execution more in the top five with the weights chosen on all of them: 6 points
    assert verdict.candidate.recall_at_5 - verdict.first_stage.recall_at_5 == 1 / 16
    assert better(verdict.candidate, verdict.first_stage)
    # but no half's weights do that on the other half: that gain was found in noise
    assert verdict.cross_fitted == verdict.first_stage
    assert not verdict.accepted and "first stage" in verdict.reason
    assert verdict.as_metrics()["holdout_cross_fitted_recall_at_5"] == 15 / 16
    # the same rate of gains over 400 executions shows on both halves
    judged, first, correction = _one_moved_in_seventeen(400)
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    assert verdict.accepted and verdict.weights.shgat > 0.0
    assert verdict.cross_fitted.recall_at_5 == verdict.candidate.recall_at_5 == 1.0


def test_a_serving_version_the_first_stage_beats_is_withdrawn_when_the_candidate_is_refused() -> (
    None
):
    """Admitted early on a few held-back executions, the served correction now ranks them below
    the first stage; the candidate beats it, but not the first stage cross-fitted: the
    correction is withdrawn rather than left serving."""
    judged, first, correction = _one_moved_in_seventeen(16)
    wrong = [np.eye(10)[1] for _ in judged]  # pushes the executed tool below tool 1
    serving = [served_scores(f, w, 16.0) for f, w in zip(first, wrong, strict=True)]
    verdict = judge(first, serving, Corrections(correction), judged, min_judged=3)
    assert better(verdict.first_stage, verdict.serving)
    assert not better(verdict.cross_fitted, verdict.first_stage)
    assert verdict.accepted and verdict.reason == WITHDRAWN
    assert verdict.weights == (0.0, 0.0, 0.0) and verdict.candidate == verdict.first_stage
    assert verdict.novel_candidate == verdict.novel_first_stage


def test_the_cross_fitted_figures_are_each_halfs_served_scores_under_the_others_weights() -> None:
    """Chosen once over every combination, the cross-fitted figures equal choosing weights on
    each half and ranking the other half with them, and are recorded in every branch."""
    rng = np.random.default_rng(9)
    judged = [Judged(tuple(int(t) for t in rng.choice(30, 2, replace=False))) for _ in range(21)]
    first = [rng.random(30) for _ in judged]
    correction = [rng.random(30) * 0.5 + np.eye(30)[j.relevant[0]] * 0.6 for j in judged]
    memory = [rng.random(30) * (rng.random(30) < 0.3) for _ in judged]
    each: list[np.ndarray] = [np.empty(0)] * len(judged)
    halves = (list(range(0, 21, 2)), list(range(1, 21, 2)))
    for chosen_on, scored in (halves, halves[::-1]):
        (w, m, _), _ = choose_weights(
            [first[i] for i in chosen_on],
            Corrections([correction[i] for i in chosen_on], [memory[i] for i in chosen_on]),
            [judged[i] for i in chosen_on],
        )
        for i in scored:
            each[i] = served_scores(served_scores(first[i], correction[i], w), memory[i], m)
    verdict = judge(first, first, Corrections(correction, memory), judged, min_judged=3)
    assert verdict.cross_fitted == figures(each, judged)
    assert verdict.cross_fitted.count == 21
    # a withdrawal records them too
    pushed_down = [np.eye(30)[j.relevant[0]] for j in judged]
    serving = [served_scores(f, p, -8.0) for f, p in zip(first, pushed_down, strict=True)]
    useless = [np.zeros(30) for _ in judged]
    withdrawn = judge(first, serving, Corrections(useless), judged, min_judged=3)
    assert withdrawn.reason == WITHDRAWN
    assert withdrawn.as_metrics()["holdout_cross_fitted_recall_at_5"] == (
        withdrawn.first_stage.recall_at_5
    )


def _out_of_fold(count: int, points_at: int) -> OutOfFold:
    """`count` executions the memory learned from, of tool 0 ranked as in `_one_moved_in_seventeen`,
    scored by a memory fitted without them that points at tool `points_at`."""
    judged, first, _ = _one_moved_in_seventeen(count)
    memory = [np.eye(10)[points_at] for _ in judged]
    return OutOfFold(first, Corrections(None, memory), judged)


def _memory_verdict(count: int, out_of_fold: OutOfFold | None = None) -> Verdict:
    """The verdict on a memory that moves the executed tool back in (`_one_moved_in_seventeen`)
    beside a SHGAT that adds nothing, judged on `count` held-back executions."""
    judged, first, correction = _one_moved_in_seventeen(count)
    useless = [np.zeros(10) for _ in judged]
    return judge(
        first,
        first,
        Corrections(useless, correction),
        judged,
        min_judged=3,
        out_of_fold=None if out_of_fold is None else lambda: out_of_fold,
    )


def test_out_of_fold_executions_confirm_a_memory_gain_the_held_back_halves_cannot() -> None:
    """Sixteen held-back executions cannot confirm a gain of one of them (the test above); the
    same rate of gains over the executions the memory learned from, each scored out of fold,
    does, and the weights are chosen on them all."""
    alone = _memory_verdict(16)
    assert not alone.accepted and alone.out_of_fold == 0
    verdict = _memory_verdict(16, _out_of_fold(384, points_at=0))
    assert verdict.accepted and verdict.weights.memory > 0.0 and verdict.weights.shgat == 0.0
    assert verdict.out_of_fold == 384 and verdict.cross_fitted.count == 400
    assert verdict.cross_fitted_first_stage.count == 400
    assert verdict.cross_fitted.recall_at_5 == 1.0
    assert verdict.candidate.count == 16  # the serving comparison stays on the held-back ones
    assert verdict.as_metrics()["out_of_fold_size"] == 384.0


def test_out_of_fold_executions_refuse_a_memory_gain_the_held_back_ones_alone_would_admit() -> None:
    assert _memory_verdict(400).accepted
    # on four times as many executions it did not learn from, the memory points elsewhere
    verdict = _memory_verdict(400, _out_of_fold(1600, points_at=1))
    assert not verdict.accepted and verdict.weights == (0.0, 0.0, 0.0)


def test_a_candidate_whose_shgat_gets_a_weight_is_judged_on_the_held_back_executions_alone() -> (
    None
):
    """SHGAT learned from those executions: they cannot judge it, nor a sum it is part of."""
    judged, first, correction = _one_moved_in_seventeen(400)
    asked: list[OutOfFold] = []

    def scored() -> OutOfFold:  # the fits cost several rounds' worth: only when they can count
        asked.append(_out_of_fold(1600, points_at=1))
        return asked[-1]

    verdict = judge(
        first,
        first,
        Corrections(correction, [np.zeros(10) for _ in judged]),
        judged,
        min_judged=3,
        out_of_fold=scored,
    )
    assert verdict.accepted and verdict.weights.shgat > 0.0 and not asked
    assert verdict.out_of_fold == 0 and verdict.cross_fitted.count == 400
    # out-of-fold executions must carry the corrections the candidate has, and only those
    with pytest.raises(ValueError, match="out-of-fold"):
        judge(
            first,
            first,
            Corrections([np.zeros(10) for _ in judged]),
            judged,
            out_of_fold=lambda: _out_of_fold(20, points_at=0),
        )


def _first_step_moved_up(
    count: int, moved: int
) -> tuple[list[Judged], list[np.ndarray], list[np.ndarray]]:
    """`count` executions of tool 0, which the first stage ranks second; a correction moves it
    first in the first `moved` of them (so in both alternate halves) and changes nothing in the
    others (recall@5 is the same)."""
    judged = [Judged((0,)) for _ in range(count)]
    first = [_ranking([1, 0, 2, 3]) for _ in judged]
    correction = [np.eye(10)[0] * (i < moved) for i in range(count)]
    return judged, first, correction


def test_against_the_first_stage_a_first_step_gain_within_the_noise_admits_nothing() -> None:
    """Cross-fitted, the candidate ties the first stage's recall@5 and moves the first step up in
    two executions of forty: within two standard errors of the paired difference, not a gain."""
    judged, first, correction = _first_step_moved_up(40, 2)
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    assert verdict.cross_fitted.recall_at_5 == verdict.cross_fitted_first_stage.recall_at_5
    assert verdict.cross_fitted.mrr > verdict.cross_fitted_first_stage.mrr + 0.02
    assert not verdict.accepted
    # moved up in half of them, it is one
    judged, first, correction = _first_step_moved_up(40, 20)
    assert judge(first, first, Corrections(correction), judged, min_judged=3).accepted


def test_a_recall_gain_within_the_noise_of_the_executions_is_not_sure() -> None:
    """One tool of one two-tool execution in fourteen is 3.6 points of recall@5: better, but not
    surely; the same rate over 1,400 executions is."""
    for count, sure in ((14, False), (1400, True)):
        judged = [Judged((0, 1)) for _ in range(count)]
        both = figures([_ranking([0, 1]) for _ in judged], judged)
        one_out = [_ranking([0, 2, 3, 4, 5, 6, 1] if i % 14 == 0 else [0, 1]) for i in range(count)]
        fewer = figures(one_out, judged)
        assert both.recall_at_5 - fewer.recall_at_5 == pytest.approx(1 / 28)
        assert better(both, fewer) and better(both, fewer, surely=True) is sure


def test_a_fresher_candidate_replaces_one_that_ranks_one_held_back_execution_better() -> None:
    """A small tenant's case: the serving version holds both tools of 14 held-back executions in
    the top five, a candidate fitted on more executions all but one tool of one of them, and
    the first stage half of each: nothing says the candidate is worse."""
    judged = [Judged((0, 1)) for _ in range(14)]
    first = [_ranking([0, 2, 3, 4, 5, 6, 1]) for _ in judged]
    serving = [_ranking([0, 1]) for _ in judged]
    correction = [np.eye(10)[9 if i == 0 else 1] for i in range(14)]
    verdict = judge(first, serving, Corrections(correction), judged, min_judged=3, fresher=True)
    assert verdict.serving.recall_at_5 - verdict.candidate.recall_at_5 == pytest.approx(1 / 28)
    assert verdict.accepted and verdict.reason == FRESHER and verdict.weights.shgat > 0.0


def _moved_out(
    count: int, moved: Container[int]
) -> tuple[list[Judged], list[np.ndarray], list[np.ndarray]]:
    """`count` executions of tool 0, which the first stage ranks first but in the executions
    `moved`, where it is sixth; a correction that points at tool 0 moves it back in."""
    judged = [Judged((0,)) for _ in range(count)]
    first = [_ranking([1, 2, 3, 4, 5, 0] if i in moved else [0, 1, 2]) for i in range(count)]
    return judged, first, [np.eye(10)[0] for _ in judged]


def test_against_the_first_stage_a_recall_gain_within_the_noise_admits_nothing() -> None:
    """Cross-fitted, the candidate moves the executed tool into the top five in two executions
    of forty: five points of recall@5, within two standard errors (seven) of the paired
    difference; the same rate over 200 executions is a gain."""
    judged, first, correction = _moved_out(40, range(2))  # one in each half
    verdict = judge(first, first, Corrections(correction), judged, min_judged=3)
    assert (
        verdict.cross_fitted.recall_at_5 - verdict.cross_fitted_first_stage.recall_at_5
        == pytest.approx(0.05)
    )
    assert not verdict.accepted
    judged, first, correction = _moved_out(200, range(10))
    assert judge(first, first, Corrections(correction), judged, min_judged=3).accepted
