"""The blended next step (pml_planner.blend): a weighted reciprocal-rank fusion of search's
order, observed transitions and the hyperpath, and the rule that picks its weights."""

from __future__ import annotations

from pml_planner.blend import (
    SEARCH_ONLY,
    WEIGHT_PAIRS,
    Signals,
    blended,
    choose_weights,
    new_work,
    variant,
    variant_hits,
)
from pml_planner.planning import Candidate, NextPlan


def _ranked(*tools: str) -> tuple[Candidate, ...]:
    return tuple(Candidate(t, 1.0 - i / 10) for i, t in enumerate(tools))


SIGNALS = Signals(
    search=_ranked("s:b", "s:c", "s:d"),
    transitions=_ranked("s:c", "s:e"),
    hyperpath=NextPlan(_ranked("s:d", "s:c"), "A", ("s:a", "s:d"), 0.9),
)


def _ids(plan: NextPlan) -> list[str]:
    return [c.id for c in plan.candidates]


def test_weights_zero_are_search_order_itself() -> None:
    plan = blended(SIGNALS, SEARCH_ONLY)
    assert _ids(plan) == ["s:b", "s:c", "s:d"]
    assert (plan.target, plan.path) == ("", ())
    assert WEIGHT_PAIRS[0] == SEARCH_ONLY


def test_weighed_signals_move_their_candidates_up() -> None:
    # s:c: 1/2 from search + 1 from the transitions beats s:b's 1.
    assert _ids(blended(SIGNALS, (1.0, 0.0)))[:2] == ["s:c", "s:b"]
    # The hyperpath at 2 puts its first step first and says which target it follows.
    plan = blended(SIGNALS, (0.0, 2.0))
    assert _ids(plan)[0] == "s:d" and (plan.target, plan.path) == ("A", ("s:a", "s:d"))
    # A tool only a signal knows can still be answered.
    assert "s:e" in _ids(blended(SIGNALS, (1.0, 0.0)))


def test_every_pair_is_judged_on_the_steps() -> None:
    hits = variant_hits([(SIGNALS, "s:c"), (SIGNALS, "s:b")])
    assert hits[variant(SEARCH_ONLY)] == (1, 2)
    assert hits[variant((1.0, 0.0))] == (1, 2)  # s:c first now, s:b second
    assert hits[variant((0.0, 2.0))] == (0, 2)
    assert len(hits) == len(WEIGHT_PAIRS)


def test_a_pair_must_beat_search_order_beyond_the_margin() -> None:
    def margin(n: int) -> float:
        return 0.1

    hits = {variant(SEARCH_ONLY): 50, variant((0.5, 0.0)): 59, variant((1.0, 1.0)): 61}
    assert choose_weights(hits, 100, 20, margin) == (1.0, 1.0)
    assert choose_weights(hits, 10, 20, margin) == SEARCH_ONLY  # too little evidence
    hits[variant((1.0, 1.0))] = 60
    assert choose_weights(hits, 100, 20, margin) == SEARCH_ONLY  # +10 points: not beyond 0.1


def test_a_pair_that_predicts_less_new_work_than_search_order_is_not_eligible() -> None:
    def margin(n: int) -> float:
        return 0.1

    # On all 100 steps the hyperpath at 1 is far ahead; on the 30 steps of new work it is
    # behind search's order, and the transitions at 0.5 tie it there.
    hits = {variant(SEARCH_ONLY): 40, variant((0.0, 1.0)): 80, variant((0.5, 0.0)): 60}
    hits |= {
        new_work(variant(SEARCH_ONLY)): 15,
        new_work(variant((0.0, 1.0))): 10,
        new_work(variant((0.5, 0.0))): 15,
    }
    assert choose_weights(hits, 100, 20, margin, new_predictions=30) == (0.5, 0.0)
    # Too few steps of new work to say: the overall figures decide.
    assert choose_weights(hits, 100, 20, margin, new_predictions=19) == (0.0, 1.0)
