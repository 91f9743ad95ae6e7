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


def test_a_pair_must_beat_search_order_on_new_work_beyond_the_margin() -> None:
    def margin(n: int) -> float:
        return 0.1

    new = {variant(SEARCH_ONLY): 50, variant((0.5, 0.0)): 59, variant((1.0, 1.0)): 61}
    hits = {new_work(name): count for name, count in new.items()}
    assert choose_weights(hits, 100, 20, margin) == (1.0, 1.0)
    assert choose_weights(hits, 10, 20, margin) == SEARCH_ONLY  # too little evidence
    hits[new_work(variant((1.0, 1.0)))] = 60
    assert choose_weights(hits, 100, 20, margin) == SEARCH_ONLY  # +10 points: not beyond 0.1


def test_what_a_pair_did_on_repeated_work_does_not_give_it_weight() -> None:
    def margin(n: int) -> float:
        return 0.1

    # Over all runs the hyperpath at 1 is far ahead; on new work it ties search's order.
    hits = {variant(SEARCH_ONLY): 40, variant((0.0, 1.0)): 80}
    hits |= {new_work(variant(SEARCH_ONLY)): 15, new_work(variant((0.0, 1.0))): 15}
    assert choose_weights(hits, 30, 20, margin) == SEARCH_ONLY
