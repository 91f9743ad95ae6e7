"""Workflows for tasks no stored capability fits: a DAG composed from the request's sub-goals.

A request that chains several steps ("scan main.py with Semgrep, then get the results and list
the supported languages") is split into its clauses as the first stage splits it
(`pml_common.first_stage.sub_goals`; a one-step request is its own single clause). Each clause
finds its tool: search's best for the clause that no earlier clause took. The composed tools run
in the order the request states them, each after the one before.

The target capability's DAG (what was learned) is kept when it holds at least half of the
composed tools: the request then reads as that workflow, and the composed tools it lacks are
added after its own, marked as composed. Otherwise the learned workflow is some other task's
and the DAG is the composed chain alone. `DagPlan.composed` lists the nodes that come from
composition rather than from a learned capability.

The stated order also chooses a task's first step (`in_stated_order`): with nothing run yet, of
the request's best tools the one that is the best of its earliest sub-goal comes first. The
request's best tool answers the request as a whole, often a later step that its words describe
at length; the first step is the one stated first.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pml_common.first_stage import sub_goals
from pml_planner.planning import Candidate, DagPlan, Target, TenantPlanner

#: Share of the composed tools the target's DAG must hold for the learned workflow to be kept.
KEEP_LEARNED_SHARE = 0.5
#: Search results fetched per clause (a clause whose best was taken by an earlier one falls
#: back on its next).
CLAUSE_TOOLS = 3
#: Edge type of the order between composed steps.
COMPOSED_EDGE = "composed"


def clauses_of(intent: str) -> list[str]:
    """The request's sub-goals in the order stated; the request itself when it has none."""
    return sub_goals(intent) or [intent]


def pick_tools(ranked: Sequence[Sequence[Candidate]]) -> list[Candidate]:
    """One tool per clause, in clause order: its best one that no earlier clause took."""
    picked: list[Candidate] = []
    for candidates in ranked:
        taken = {c.id for c in picked}
        best = next((c for c in candidates if c.id not in taken), None)
        if best is not None:
            picked.append(best)
    return picked


def in_stated_order(
    candidates: Sequence[Candidate], ranked: Sequence[Sequence[Candidate]]
) -> list[Candidate]:
    """`candidates` with those that are a clause's best tool first, in the order the request
    states those clauses; the others after them, each group in its own order."""
    best = [clause[0].id for clause in ranked if clause]
    return sorted(candidates, key=lambda c: best.index(c.id) if c.id in best else len(best))


def compose(
    planner: TenantPlanner, target: Target | None, ranked: Sequence[Sequence[Candidate]]
) -> DagPlan:
    """The learned target's DAG, the composed chain, or the first completed by the second."""
    picked = pick_tools(ranked)
    learned = planner.suggest_dag(target) if target is not None else None
    if not picked:
        return learned if learned is not None else DagPlan("", (), (), (), 0.0)
    if learned is not None:
        held = [c for c in picked if c.id in learned.nodes]
        if len(held) >= KEEP_LEARNED_SHARE * len(picked):
            missing = [c for c in picked if c.id not in learned.nodes]
            return _extended(learned, missing)
    return _chain(picked)


def _chain(picked: Sequence[Candidate]) -> DagPlan:
    tools = tuple(c.id for c in picked)
    edges = tuple((a, b, COMPOSED_EDGE) for a, b in itertools.pairwise(tools))
    return DagPlan("", tools, edges, tools, _mean_score(picked), composed=tools)


def _extended(learned: DagPlan, missing: Sequence[Candidate]) -> DagPlan:
    """The learned DAG, then the composed tools it lacks, each after the previous last step."""
    if not missing:
        return learned
    added = tuple(c.id for c in missing)
    order = (*learned.order, *added)
    edges = learned.edges + tuple(
        (a, b, COMPOSED_EDGE) for a, b in itertools.pairwise((learned.order[-1], *added))
    )
    confidence = (learned.confidence + _mean_score(missing)) / 2
    return DagPlan(learned.target, (*learned.nodes, *added), edges, order, confidence, added)


def _mean_score(picked: Sequence[Candidate]) -> float:
    return sum(c.score for c in picked) / len(picked) if picked else 0.0
