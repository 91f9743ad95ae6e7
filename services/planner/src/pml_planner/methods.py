"""The four planning methods on inputs fetched beforehand: one code path for the gRPC handlers
(`service`) and for the prequential figures (`prequential`), so what is measured is exactly what
is served.

What a method needs from outside the planner (the intent's capability candidates, from the
scorer or search, and search's order of tools) is declared by `next_needs` / `dag_needs`,
fetched by `fetch` and handed in as `Inputs`; the methods themselves only compute, so the
prequential evaluation fetches once per execution and runs every method at every step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pml_common.first_stage import MAX_SUB_GOALS
from pml_planner.blend import BLEND, SEARCH_ONLY, Signals, Weights, blended
from pml_planner.composition import CLAUSE_TOOLS, clauses_of, compose, in_stated_order
from pml_planner.planning import Candidate, DagPlan, NextPlan, TenantPlanner, chain_plan
from pml_planner.targets import Targets, TargetSource

METHODS = ("drdsp", "legacy", "discovery", "search", BLEND)
#: The method of an empty request while the evidence is short, and of ties.
DEFAULT_METHOD = "drdsp"
#: Runners-up returned with a next step (for next_hit@k and for the caller's own choice).
NEXT_CANDIDATES = 5
#: Search's first tools the search method chains into a DAG for a request stating no sub-goals
#: (one that states several gets one tool per sub-goal).
SEARCH_DAG_TOOLS = 3

NO_TARGETS = Targets((), "")
NO_NEXT = NextPlan((), "", (), 0.0)


@dataclass(frozen=True)
class Needs:
    """What a method needs fetched: the intent's capabilities, and how many of search's tools."""

    capabilities: bool = False
    tools: int = 0
    #: Search's tools for each of the request's sub-goals (`composition`).
    clauses: bool = False

    def __or__(self, other: Needs) -> Needs:
        return Needs(
            self.capabilities or other.capabilities,
            max(self.tools, other.tools),
            self.clauses or other.clauses,
        )


@dataclass(frozen=True)
class Inputs:
    """The intent's candidates as fetched; a longer tool list than needed gives the same answers
    (every method takes search's order from the top)."""

    targets: Targets = NO_TARGETS
    tools: tuple[Candidate, ...] = ()
    #: Per sub-goal of the request (or the request itself), search's first tools.
    clause_tools: tuple[tuple[Candidate, ...], ...] = ()

    def intent_scores(self) -> dict[str, float]:
        return {c.id: c.score for c in self.targets.candidates}


def next_needs(method: str, context: Sequence[str]) -> Needs:
    if method == BLEND:
        return (
            next_needs("drdsp", context)
            | next_needs("legacy", context)
            | next_needs("search", context)
        )
    if method == "drdsp":
        return Needs(capabilities=True)
    if method in ("legacy", "discovery") and not context:
        return Needs(tools=NEXT_CANDIDATES, clauses=True)  # they start where search would
    if method == "legacy":
        return Needs()
    if method == "discovery":
        return Needs(capabilities=True)
    # Search's order without the tools already run (ask for that many more); the first step
    # follows the order the request states its sub-goals in.
    return Needs(tools=NEXT_CANDIDATES + len(set(context)), clauses=not context)


def dag_needs(method: str) -> Needs:
    if method == BLEND:
        return dag_needs("search")
    if method == "drdsp":
        return Needs(capabilities=True, clauses=True)
    if method == "legacy":
        return Needs(tools=1)
    if method == "discovery":
        return Needs(capabilities=True, tools=1)
    return Needs(tools=max(SEARCH_DAG_TOOLS, MAX_SUB_GOALS), clauses=True)


async def fetch(source: TargetSource, tenant: str, intent: str, needs: Needs) -> Inputs:
    targets = await source.capabilities(tenant, intent) if needs.capabilities else NO_TARGETS
    tools = await source.tools(tenant, intent, needs.tools) if needs.tools else []
    clause_tools: tuple[tuple[Candidate, ...], ...] = ()
    if needs.clauses:
        clause_tools = await _clause_tools(source, tenant, intent, tools)
    return Inputs(targets, tuple(tools), clause_tools)


async def _clause_tools(
    source: TargetSource, tenant: str, intent: str, fetched: Sequence[Candidate]
) -> tuple[tuple[Candidate, ...], ...]:
    """Search's first tools per sub-goal, all asked at once; a request with no sub-goals is its
    own clause, whose tools may have been fetched already."""
    clauses = clauses_of(intent)
    if clauses == [intent] and len(fetched) >= CLAUSE_TOOLS:
        return (tuple(fetched[:CLAUSE_TOOLS]),)
    found = await asyncio.gather(*(source.tools(tenant, c, CLAUSE_TOOLS) for c in clauses))
    return tuple(tuple(ranked) for ranked in found)


def predict_next(
    method: str,
    planner: TenantPlanner,
    inputs: Inputs,
    context: Sequence[str],
    hidden: frozenset[str] = frozenset(),
    weights: Weights = SEARCH_ONLY,
) -> NextPlan:
    """The next step after `context` (tools already run, in order) by `method`, as if the
    `hidden` capabilities were not registered (`prequential`: new work); the blend weighs its
    signals by `weights`."""
    if method == BLEND:
        return blended(signals(planner, inputs, context, hidden), weights)
    if method == "drdsp":
        target = planner.choose_target(inputs.targets.candidates, context, hidden)
        return NO_NEXT if target is None else planner.predict_next(target, context, NEXT_CANDIDATES)
    if method in ("legacy", "discovery") and not context:
        # The heuristic needs a current tool and discovery is passive: with nothing run yet,
        # both start where search would.
        return _search_next(inputs, context)
    if method == "legacy":
        ranked = planner.legacy_next(context, NEXT_CANDIDATES)
        return NextPlan(tuple(ranked), "", (), ranked[0].score if ranked else 0.0)
    if method == "discovery":
        return planner.discovery_next(context, inputs.intent_scores(), NEXT_CANDIDATES, hidden)
    return _search_next(inputs, context)


def signals(
    planner: TenantPlanner,
    inputs: Inputs,
    context: Sequence[str],
    hidden: frozenset[str] = frozenset(),
) -> Signals:
    """What the blend weighs at one step: search's order, the observed transitions and the
    forward hyperpath, each as its method answers."""
    transitions = planner.legacy_next(context, NEXT_CANDIDATES) if context else []
    return Signals(
        _search_next(inputs, context).candidates,
        tuple(transitions),
        predict_next("drdsp", planner, inputs, context, hidden),
    )


def suggest_dag(
    method: str, planner: TenantPlanner, inputs: Inputs, hidden: frozenset[str] = frozenset()
) -> DagPlan:
    """The whole DAG `method` suggests for the intent `inputs` were fetched for (without the
    `hidden` capabilities, as `predict_next`). The blend predicts next steps: its DAG is
    search's."""
    if method == BLEND:
        method = "search"
    first = inputs.tools[0] if inputs.tools else None
    if method == "drdsp":
        target = planner.choose_target(inputs.targets.candidates, hidden=hidden)
        return compose(planner, target, inputs.clause_tools)
    if method == "legacy":
        chain = planner.legacy_chain(first.id) if first else []
        return chain_plan(chain, first.score if first else 0.0)
    if method == "discovery":
        # The DAG of the capability discovered from the intent's first search tool.
        found = planner.discover([first.id], inputs.intent_scores(), 1, hidden) if first else []
        if not found:
            return chain_plan([first.id] if first else [], first.score if first else 0.0)
        return planner.suggest_dag(planner.target(found[0]))
    # As many of search's tools as the request states sub-goals, chained in the stated order.
    stated = len(inputs.clause_tools)
    ranked = in_stated_order(
        inputs.tools[: stated if stated > 1 else SEARCH_DAG_TOOLS], inputs.clause_tools
    )
    return chain_plan([t.id for t in ranked], max((t.score for t in ranked), default=0.0))


def dag_tools(planner: TenantPlanner, plan: DagPlan) -> list[str]:
    """The plan's tools in execution order: every node but capabilities (a tool search found
    and the graph does not hold yet is a tool all the same)."""
    return [n for n in plan.order if not planner.is_capability(n)]


def _search_next(inputs: Inputs, context: Sequence[str]) -> NextPlan:
    """Search's tools without those already run; the first step in the request's stated order."""
    done = set(context)
    picked = [Candidate(t.id, t.score) for t in inputs.tools if t.id not in done]
    picked = picked[:NEXT_CANDIDATES]
    if not done:
        picked = in_stated_order(picked, inputs.clause_tools)
    return NextPlan(tuple(picked), "", (), picked[0].score if picked else 0.0)
