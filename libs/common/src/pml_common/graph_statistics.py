"""Pure statistics of the tool graph: what one execution changes, and how edges evolve.

No I/O here. The trainer's graph store reads the current state of the edges it is about to
change (under a write lock), asks this module for their next state, and writes that back; the
planner's prequential judge replays the same rules on the runs it has judged
(`pml_planner.judged_graph`). So the rules of ADR-038 §2.3 (edge weights, promotion) live in
exactly one place.

Edge model. An edge is keyed by (src, dst, type) and carries:
- `source` ∈ {observed, inferred, template}: how much we trust it;
- `origin` ∈ {execution, template, similarity, same_server}: who created it (kept for audit);
- `count`: how many executions observed it (at most one observation per execution);
- `factor`: an extra scale of cold-start guesses (the cosine for similarity edges, 0.5 for
  same-server edges, 1.0 otherwise); an execution that observes the edge resets it to 1.0,
  because from then on the edge stands on evidence rather than on the guess;
- `weight = TYPE_WEIGHT[type] × SOURCE_MULTIPLIER[source] × factor`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Literal, TypeVar

from pml_common.edge_weights import SOURCE_MULTIPLIER, edge_weight
from pml_common.events import ExecutionCompleted

_T = TypeVar("_T")

EdgeType = Literal["dependency", "contains", "sequence"]
EdgeSource = Literal["observed", "inferred", "template"]
EdgeOrigin = Literal["execution", "template", "similarity", "same_server"]

#: ADR-038 §4.2: observations after which an edge is promoted to `observed`.
PROMOTION_THRESHOLD = 3


def success_rate(successes: int, executions: int) -> float | None:
    """successes / executions; None for a node never executed (no evidence either way)."""
    return successes / executions if executions > 0 else None


@dataclass(frozen=True)
class EdgeKey:
    src: str
    dst: str
    type: EdgeType


@dataclass(frozen=True)
class EdgeState:
    source: EdgeSource
    origin: EdgeOrigin
    count: int
    factor: float = 1.0

    def weight(self, edge_type: str) -> float:
        return edge_weight(edge_type, self.source, self.factor)


@dataclass(frozen=True)
class NodeUpdate:
    """Increments one execution brings to a Tool or Capability node."""

    node_id: str
    executions: int
    successes: int


@dataclass(frozen=True)
class ExecutionEffect:
    """Everything an `ExecutionCompleted` changes in the graph."""

    step_updates: tuple[NodeUpdate, ...]
    capability_update: NodeUpdate | None
    edges: tuple[EdgeKey, ...]

    @property
    def node_ids(self) -> list[str]:
        ids = [u.node_id for u in self.step_updates]
        if self.capability_update is not None:
            ids.append(self.capability_update.node_id)
        return list(dict.fromkeys(ids))


# --- edge state transitions ----------------------------------------------------------------


def observe(current: EdgeState | None) -> EdgeState:
    """The state of an edge after one more execution observed it.

    A new edge is `inferred` (one run proves little); any edge reaching PROMOTION_THRESHOLD
    observations becomes `observed`, whatever created it. An `observed` edge stays observed.
    """
    if current is None:
        current = EdgeState(source="inferred", origin="execution", count=0)
    count = current.count + 1
    source: EdgeSource = "observed" if count >= PROMOTION_THRESHOLD else current.source
    return replace(current, source=source, count=count, factor=1.0)


def merge_cold_start(current: EdgeState | None, candidate: EdgeState) -> EdgeState | None:
    """The state after a cold-start guess, or None when the edge must stay as it is.

    Cold start never overrides evidence: an edge any execution observed is left alone (so an
    `observed` edge is never downgraded). Between guesses the heavier one wins, so re-running
    cold start with the same inputs changes nothing.
    """
    if current is None:
        return candidate
    if current.count > 0 or current.source == "observed":
        return None
    if _guess_weight(candidate) > _guess_weight(current):
        return candidate
    return None


def _guess_weight(state: EdgeState) -> float:
    # The type is the same on both sides of a merge, so comparing without it is enough.
    return SOURCE_MULTIPLIER[state.source] * state.factor


# --- executions ----------------------------------------------------------------------------


def execution_effect(event: ExecutionCompleted) -> ExecutionEffect:
    """Node increments and the edges observed by one execution."""
    capability_update = None
    if event.capability_id:
        capability_update = NodeUpdate(
            event.capability_id, executions=1, successes=int(event.outcome == "success")
        )
    return ExecutionEffect(
        step_updates=tuple(_step_updates(event)),
        capability_update=capability_update,
        edges=tuple(_observed_edges(event)),
    )


def _step_updates(event: ExecutionCompleted) -> list[NodeUpdate]:
    # A node called several times in one run counts each call: each call can fail on its own.
    totals: dict[str, list[int]] = {}
    for step in event.steps:
        tally = totals.setdefault(step.node_id, [0, 0])
        tally[0] += 1
        tally[1] += int(step.success)
    return [NodeUpdate(node, e, s) for node, (e, s) in totals.items()]


def _observed_edges(event: ExecutionCompleted) -> list[EdgeKey]:
    """Sequence, dependency and contains edges, each at most once per execution.

    Counting an edge once per run (not per occurrence) makes promotion mean "seen in 3 runs",
    so one run looping over A→B cannot promote A→B on its own. Self-loops carry no ordering
    information and are dropped.
    """
    steps = event.steps
    edges: list[EdgeKey] = [
        EdgeKey(a.node_id, b.node_id, "sequence")
        for a, b in pairwise(steps)
        if a.node_id != b.node_id
    ]
    seen: set[str] = set()
    for step in steps:
        # Only earlier steps can be depended on; anything else is not a fact of this run.
        edges.extend(
            EdgeKey(dep, step.node_id, "dependency")
            for dep in step.depends_on
            if dep in seen and dep != step.node_id
        )
        seen.add(step.node_id)
    if event.capability_id:
        edges.extend(
            EdgeKey(event.capability_id, node, "contains")
            for node in _unique(s.node_id for s in steps)
            if node != event.capability_id
        )
    return _unique(edges)


def _unique(items: Iterable[_T]) -> list[_T]:
    return list(dict.fromkeys(items))
