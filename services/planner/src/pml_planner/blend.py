"""The blended next step: search's order, observed transitions and the forward hyperpath weighed
in one ranking, with weights each tenant's own executions choose.

Each signal ranks candidates for the next step: search's order (the request's words, without
the tools already run, the first step in the order the request states its sub-goals), the
observed successors of the tools run (the legacy heuristic's transitions) and DR-DSP's forward
hyperpath towards the target chosen from the intent and the context. The blend scores a tool

    1 / (RANK_OFFSET + its rank in search's order)
    + w_t / (RANK_OFFSET + its rank among the transitions)
    + w_h / (RANK_OFFSET + its rank on the hyperpath)

(a weighted reciprocal-rank fusion: the signals' scores are on scales of their own, their ranks
are not). Weights (0, 0) are search's order itself, the zero-shot answer.

Which weights serve is decided as the planning methods are (`prequential`): every arriving
execution is predicted by every pair of `WEIGHT_GRID`, before the planner learns from it. A
tenant's runs mostly repeat work it ran before, where the hyperpath and the transitions know the
way, and where DR-DSP itself, judged on the same runs, becomes the default method when it is
best. The blend's weights are for the rest: they are chosen on the runs of a set of tools never
run before (*new work*, counted apart under `new_work` names), and a pair replaces (0, 0) only
when its next_hit@1 there beats (0, 0) by more than `prequential.margin`. Chosen on all runs,
MetaTool's workflow split served the hyperpath at weight 1, learned on repeated pairs, and the
unseen pairs' next_hit@1 fell from 0.452 (search's order) to 0.367; with a guard that only
barred pairs below (0, 0) on new work, still to 0.439 (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pml_planner.planning import Candidate, NextPlan

BLEND = "blend"
#: Weights tried for the transitions and for the hyperpath (search's order weighs 1).
WEIGHT_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
#: Added to a 0-based rank: the first candidate of a signal scores 1, the second 1/2...
RANK_OFFSET = 1.0
#: Candidates a blended answer returns.
BLEND_CANDIDATES = 5

Weights = tuple[float, float]
SEARCH_ONLY: Weights = (0.0, 0.0)
#: Every pair of the grid, lightest first (ties keep the lighter pair).
WEIGHT_PAIRS: tuple[Weights, ...] = tuple(
    sorted(itertools.product(WEIGHT_GRID, WEIGHT_GRID), key=lambda p: (p[0] + p[1], p))
)


def variant(weights: Weights) -> str:
    """The name under which a pair's prequential figures are kept."""
    return f"{BLEND}({weights[0]:g},{weights[1]:g})"


def new_work(name: str) -> str:
    """The name under which a variant's figures on new work are kept."""
    return f"{name}/new"


VARIANTS: tuple[str, ...] = tuple(variant(p) for p in WEIGHT_PAIRS)
NEW_WORK_VARIANTS: tuple[str, ...] = tuple(new_work(v) for v in VARIANTS)


@dataclass(frozen=True)
class Signals:
    """The three rankings of one next step, best first."""

    search: tuple[Candidate, ...]
    transitions: tuple[Candidate, ...]
    hyperpath: NextPlan


def blended(signals: Signals, weights: Weights, k: int = BLEND_CANDIDATES) -> NextPlan:
    """The next step by the weighted reciprocal-rank fusion of the signals."""
    w_t, w_h = weights
    lists = [(1.0, signals.search)]
    if w_t > 0:
        lists.append((w_t, signals.transitions))
    if w_h > 0:
        lists.append((w_h, signals.hyperpath.candidates))
    scores: dict[str, float] = {}
    for weight, ranked in lists:
        for rank, candidate in enumerate(ranked):
            scores[candidate.id] = scores.get(candidate.id, 0.0) + weight / (RANK_OFFSET + rank)
    # Stable on ties: the order of first appearance (search's order first).
    picked = sorted(scores, key=lambda tool: -scores[tool])[:k]
    total = 1.0 + w_t + w_h
    candidates = tuple(Candidate(t, scores[t] / total) for t in picked)
    follows_target = w_h > 0 and bool(signals.hyperpath.target)
    return NextPlan(
        candidates,
        signals.hyperpath.target if follows_target else "",
        signals.hyperpath.path if follows_target else (),
        candidates[0].score if candidates else 0.0,
    )


def variant_hits(
    steps: Sequence[tuple[Signals, str]],
) -> dict[str, tuple[int, int]]:
    """(hits@1, hits@3) of every pair of the grid over judged steps (signals, tool run)."""
    out = {}
    for pair in WEIGHT_PAIRS:
        hits_at_1 = hits_at_3 = 0
        for signals, tool in steps:
            ranked = [c.id for c in blended(signals, pair).candidates]
            hits_at_1 += ranked[:1] == [tool]
            hits_at_3 += tool in ranked[:3]
        out[variant(pair)] = (hits_at_1, hits_at_3)
    return out


def choose_weights(
    hits_at_1: Mapping[str, int],
    predictions: int,
    min_evidence: int,
    margin: Callable[[int], float],
) -> Weights:
    """The pair of best next_hit@1 on `predictions` judged steps of new work (`hits_at_1` under
    `new_work` names) if it beats (0, 0), search's order, by more than `margin(predictions)`
    there, else (0, 0); (0, 0) before `min_evidence` steps."""
    if predictions < min_evidence:
        return SEARCH_ONLY
    hits = {pair: hits_at_1.get(new_work(variant(pair)), 0) for pair in WEIGHT_PAIRS}
    best = max(WEIGHT_PAIRS, key=lambda pair: (hits[pair], -WEIGHT_PAIRS.index(pair)))
    if (hits[best] - hits[SEARCH_ONLY]) / predictions <= margin(predictions):
        return SEARCH_ONLY
    return best
