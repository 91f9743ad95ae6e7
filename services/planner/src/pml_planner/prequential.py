"""Prequential figures of the planning methods, and the default method they choose per tenant.

When an execution completes, before the planner learns anything from it, every method is asked
what it would have predicted: at each of the execution's distinct tools in order (the tools
before it as context), whether its first candidate is the tool run there (next_hit@1) and
whether that tool is among its first 3 (next_hit@3); and for the whole run, the F1 of the tool
nodes of the DAG it suggests for the intent against the tools run. The intent's candidates are
fetched once per execution (one call to the scorer's capabilities, one to search's tools) and
every method and step is computed in-process, by the very functions that answer requests
(`methods`).

An execution whose set of tools the tenant never ran before is judged as new work: without the
capabilities that run exactly those tools (`hidden`), as a task never run has none. Otherwise a
capability registered ahead of its first run would let the methods that follow capabilities
recall the answer, and the figures would favour them where work is new (ETOM's workflow
split: every training run had its registered capability, and the figures chose discovery,
which was 29 points of next_hit@1 below search order on the unseen tasks).

An execution is skipped (and counted so) when it ran no tool the tenant's planner knows. The
methods are judged on the graph as the executions judged before made it (`judged_graph`), not
on the graph the planner serves: the trainer, on its own consumer group, may already have
learned from this execution and later ones. That view is made again every `VIEW_RUNS` runs.

Figures are sums in the Redis hash `pml:planner:prequential:{tenant}` (fields
`<method>:predictions`, `:hits_at_1`, `:hits_at_3`, `:dags`, `:node_f1`, and `executions`,
`skipped`, `unjudged`), each execution's added in one transaction. Redelivery is covered by
the event bus's dedupe of the planner's shared group.

An empty `method` takes, per tenant, the method of best next_hit@1 (PredictNext) or mean node F1
(SuggestDag) once every method has `MIN_EVIDENCE` judged predictions (DAGs); before that,
DR-DSP. The zero-shot choice (`ZERO_SHOT_METHODS`: the blend for the next step, which is
search's order until its figures give the other signals weight, and search's order for DAGs)
stays unless the best method beats it by more than `margin(n)` = 1/√n on n judged items (about
the 95 % half-width of a share estimated on n, so a method is not preferred on noise: on ETOM's
unseen workflows DR-DSP's DAGs were chosen on two folds of five within noise of search's, and
were 2.5 points of node F1 below them on the unseen tasks) and is not worse than it on new
work, where every method's figures are also kept apart (`<method>/new`).

The blend's variants (every pair of its weight grid, `blend.VARIANTS`) are judged on every
execution too, their next steps only, and on new work also apart; the blend's own figures are
those of the pair it served when the execution arrived (`blend_weights`: chosen on new work
alone, by the same margin).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import grpc  # type: ignore[import-untyped, unused-ignore]
import redis.asyncio as aioredis
import structlog
from opentelemetry import metrics

from pml_common import redis_keys
from pml_common.events import ExecutionCompleted
from pml_common.grpc_server import RequestError
from pml_common.tenant_cache import TenantCache
from pml_planner import blend, judged_graph, methods
from pml_planner.blend import BLEND, NEW_WORK_VARIANTS, SEARCH_ONLY, Weights
from pml_planner.graph_source import PlannerGraph
from pml_planner.methods import DEFAULT_METHOD, METHODS, Inputs, Needs
from pml_planner.planning import TenantPlanner
from pml_planner.targets import TargetSource
from pml_planner.tenants import MAX_NODES, TenantPlanners, planner_nodes

log = structlog.get_logger(__name__)
_meter = metrics.get_meter("pml.planner")
_next_hit_at_1 = _meter.create_gauge(
    "pml.planner.prequential.next_hit_at_1",
    description="Share of next steps a planning method would have predicted first, cumulated",
)
_node_f1 = _meter.create_gauge(
    "pml.planner.prequential.node_f1",
    description="Mean node F1 of the DAGs a planning method would have suggested, cumulated",
)

Kind = Literal["next", "dag"]

#: Predictions (DAGs) every method needs before the figures choose a tenant's default method.
MIN_EVIDENCE = 20
#: The method that needs nothing learned, per request; another must beat it by `margin` to
#: replace it. For the next step it is the blend, which is search's order until its own
#: figures give the other signals weight (`blend`).
ZERO_SHOT_METHODS: Mapping[Kind, str] = {"next": BLEND, "dag": "search"}
#: Distinct tools of one execution judged at most. It keeps the search call of the judgement
#: (5 tools more than the longest context) within search's default candidate pool's half
#: (`candidate_pool` 50 → 25), where a longer list does not change the order of the first ones.
MAX_JUDGED_TOOLS = 20

#: How long the judge waits for the intent's candidates (requests wait 5 s): a run not judged
#: is a run missing from the figures (ETOM: up to 40 % of a fold's training runs at 5 s,
#: search busy while a 2,375-tool graph refreshed and the trainer trained).
JUDGE_TIMEOUT_S = 30.0
#: Judged runs after which the judge's view of the graph is made again (`Judge`).
VIEW_RUNS = 10
#: The names under which every method's figures on new work are kept.
NEW_WORK_METHODS: tuple[str, ...] = tuple(blend.new_work(m) for m in METHODS)

_SUMS = ("predictions", "hits_at_1", "hits_at_3", "dags", "node_f1")


@dataclass(frozen=True)
class MethodFigures:
    """One method's sums over judged executions."""

    predictions: int = 0
    hits_at_1: int = 0
    hits_at_3: int = 0
    dags: int = 0
    node_f1: float = 0.0  # sum over the DAGs

    def __add__(self, other: MethodFigures) -> MethodFigures:
        return MethodFigures(*(getattr(self, f) + getattr(other, f) for f in _SUMS))

    @property
    def next_hit_at_1(self) -> float:
        return self.hits_at_1 / self.predictions if self.predictions else 0.0

    @property
    def next_hit_at_3(self) -> float:
        return self.hits_at_3 / self.predictions if self.predictions else 0.0

    @property
    def mean_node_f1(self) -> float:
        return self.node_f1 / self.dags if self.dags else 0.0

    def evidence(self, kind: Kind) -> int:
        return self.predictions if kind == "next" else self.dags

    def mean(self, kind: Kind) -> float:
        return self.next_hit_at_1 if kind == "next" else self.mean_node_f1


@dataclass(frozen=True)
class Choice:
    method: str
    #: "request" (named by the caller), "prequential" (chosen by the figures) or "default".
    source: Literal["request", "prequential", "default"]


@dataclass(frozen=True)
class Summary:
    """A tenant's figures as stored."""

    methods: Mapping[str, MethodFigures]
    executions: int = 0
    skipped: int = 0
    #: Executions not judged: the intent's candidates could not be fetched.
    unjudged: int = 0

    def figures(self, method: str) -> MethodFigures:
        return self.methods.get(method, MethodFigures())


# --- the arithmetic ---------------------------------------------------------------------------


def judged_tools(planner: TenantPlanner, event: ExecutionCompleted) -> list[str]:
    """The execution's distinct tools the planner knows, in the order they first ran."""
    tools = [s.node_id for s in event.steps if planner.is_tool(s.node_id)]
    return list(dict.fromkeys(tools))[:MAX_JUDGED_TOOLS]


def needs_of(tools: Sequence[str]) -> Needs:
    """What every method needs, at every step of `tools` and for its DAG: fetched once."""
    needs = Needs()
    for method in METHODS:
        needs |= methods.dag_needs(method)
        for i in range(len(tools)):
            needs |= methods.next_needs(method, tools[:i])
    return needs


def node_f1(suggested: Sequence[str], executed: Sequence[str]) -> float:
    """F1 of the suggested nodes against the executed ones, as sets (0 when either is empty)."""
    a, b = set(suggested), set(executed)
    if not a or not b:
        return 0.0
    return 2 * len(a & b) / (len(a) + len(b))


def method_figures(
    method: str,
    planner: TenantPlanner,
    inputs: Inputs,
    tools: Sequence[str],
    hidden: frozenset[str] = frozenset(),
) -> MethodFigures:
    """How `method` would have predicted the run of `tools` (distinct, in order), without the
    `hidden` capabilities."""
    hits_at_1 = hits_at_3 = 0
    for i, tool in enumerate(tools):
        plan = methods.predict_next(method, planner, inputs, tools[:i], hidden)
        ranked = [c.id for c in plan.candidates]
        hits_at_1 += ranked[:1] == [tool]
        hits_at_3 += tool in ranked[:3]
    dag = methods.suggest_dag(method, planner, inputs, hidden)
    suggested = methods.dag_tools(planner, dag)
    return MethodFigures(len(tools), hits_at_1, hits_at_3, 1, node_f1(suggested, tools))


def figures_of(
    planner: TenantPlanner,
    inputs: Inputs,
    tools: Sequence[str],
    hidden: frozenset[str] = frozenset(),
    weights: Weights = SEARCH_ONLY,
    new_work: bool = False,
) -> dict[str, MethodFigures]:
    """Every method's figures on the run of `tools`, and every blend variant's (next steps
    only; also under `blend.new_work` names when the run is `new_work`); the blend's are those
    of the variant its `weights` name (the tenant's now)."""
    out = {m: method_figures(m, planner, inputs, tools, hidden) for m in METHODS if m != BLEND}
    steps = [
        (methods.signals(planner, inputs, tools[:i], hidden), tool) for i, tool in enumerate(tools)
    ]
    for name, (hits_at_1, hits_at_3) in blend.variant_hits(steps).items():
        out[name] = MethodFigures(len(tools), hits_at_1, hits_at_3)
        if new_work:
            out[blend.new_work(name)] = out[name]
    search = out["search"]  # the blend's DAG is search's
    served = out[blend.variant(weights)]
    out[BLEND] = MethodFigures(
        served.predictions, served.hits_at_1, served.hits_at_3, search.dags, search.node_f1
    )
    if new_work:
        out |= {blend.new_work(m): out[m] for m in METHODS}
    return out


def blend_weights(summary: Summary, min_evidence: int = MIN_EVIDENCE) -> Weights:
    """The blend's weights by the tenant's figures (`blend.choose_weights`)."""
    hits = {v: summary.figures(v).hits_at_1 for v in NEW_WORK_VARIANTS}
    judged = summary.figures(blend.new_work(blend.variant(SEARCH_ONLY))).predictions
    return blend.choose_weights(hits, judged, min_evidence, margin)


def margin(evidence: int) -> float:
    """By how much a method must beat search's order on `evidence` judged items to replace it."""
    return 1.0 / math.sqrt(max(evidence, 1))


def choose(summary: Summary, kind: Kind, min_evidence: int = MIN_EVIDENCE) -> Choice:
    """The method of best mean (next_hit@1 or node F1) once every method has `min_evidence`
    judged, if it beats the zero-shot method by more than `margin` and is not worse than it on
    new work (`min_evidence` judged there too), else the zero-shot method; DR-DSP before that.
    Ties between the others keep DR-DSP, then the earlier of `METHODS`."""
    if any(summary.figures(m).evidence(kind) < min_evidence for m in METHODS):
        return Choice(DEFAULT_METHOD, "default")
    zero_shot = ZERO_SHOT_METHODS[kind]
    best = max(
        METHODS,
        key=lambda m: (summary.figures(m).mean(kind), m == DEFAULT_METHOD, -METHODS.index(m)),
    )
    replaces = _beats(summary, best, zero_shot, kind) and _holds_on_new_work(
        summary, best, zero_shot, kind, min_evidence
    )
    return Choice(best if replaces else zero_shot, "prequential")


def _beats(summary: Summary, method: str, zero_shot: str, kind: Kind) -> bool:
    mine, theirs = summary.figures(method), summary.figures(zero_shot)
    evidence = min(mine.evidence(kind), theirs.evidence(kind))
    return mine.mean(kind) > theirs.mean(kind) + margin(evidence)


def _holds_on_new_work(
    summary: Summary, method: str, zero_shot: str, kind: Kind, min_evidence: int
) -> bool:
    """Whether `method` is not worse than `zero_shot` on new work. Most of a tenant's runs
    repeat work it ran before, where the methods that recall capabilities shine; on a task
    never run they can fall below search's order (MetaTool's workflow split: DR-DSP chosen on
    all runs, 0.485 vs 0.447, then 0.390 vs 0.452 on the unseen tasks)."""
    mine = summary.figures(blend.new_work(method))
    theirs = summary.figures(blend.new_work(zero_shot))
    if min(mine.evidence(kind), theirs.evidence(kind)) < min_evidence:
        return False
    return mine.mean(kind) >= theirs.mean(kind)


# --- judging an execution ---------------------------------------------------------------------


class Judge:
    """Computes an execution's figures with the planner as the executions judged before it made
    it (`judged_graph`); nothing is written."""

    def __init__(
        self,
        planners: TenantPlanners,
        targets: TargetSource,
        store: PrequentialStore,
        max_nodes: int = MAX_NODES,
        view_runs: int = VIEW_RUNS,
    ) -> None:
        self._planners = planners
        self._view_runs = view_runs
        self._targets = targets
        self._store = store
        # The judge's own planners, one per tenant, with the judged runs they were built at:
        # brought to a newer view by `sync` (DR-DSP repairs its trees), bounded as the served
        # ones are.
        self._judged: TenantCache[str, _JudgedView] = TenantCache(
            "planner.judged", max_nodes, lambda view: planner_nodes(view.planner)
        )

    async def judge(self, event: ExecutionCompleted) -> Judgement | None:
        """Every method's figures on `event`; none when it is skipped (no tool the planner
        knows), None when the scorer or search failed (logged: nothing is measured then)."""
        planner = await self._planner_as_judged(event.tenant_id)
        tools = judged_tools(planner, event)
        if not tools:
            return Judgement({}, ())
        try:
            inputs = await methods.fetch(
                self._targets, event.tenant_id, event.intent, needs_of(tools)
            )
        except (RequestError, grpc.aio.AioRpcError) as exc:
            log.warning(
                "planner.prequential_skipped",
                tenant=event.tenant_id,
                event_id=event.event_id,
                error=f"{type(exc).__name__}: {exc}",
            )
            return None
        # New work (a set of tools the tenant never ran) is judged as the requests of a task
        # never run are answered: no capability stands for it yet, even if one is registered.
        ran = await self._store.ran_before(event.tenant_id, tools)
        hidden = frozenset() if ran else planner.capabilities_running(tools)
        weights = blend_weights(await self._store.summary(event.tenant_id))
        judged = figures_of(planner, inputs, tools, hidden, weights, new_work=not ran)
        return Judgement(judged, tuple(tools))

    def drop(self, tenant: str) -> None:
        self._judged.pop(tenant)

    async def _planner_as_judged(self, tenant: str) -> TenantPlanner:
        """The judge's planner for `tenant`, rebuilt when `view_runs` runs were judged since
        or the served graph gained or lost nodes or members (a view a few runs old leaks
        nothing: it holds only runs judged before; rebuilding it costs a pass over every link
        and, when the tool links changed, Louvain, seconds on ETOM's 2,375 tools)."""
        served = (await self._planners.get(tenant)).graph
        runs = await self._store.judged_runs(tenant)
        view = self._judged.get(tenant)
        if view is not None and view.fits(served, runs, self._view_runs):
            return view.planner
        graph = judged_graph.as_judged(served, await self._store.tally(tenant))
        if view is None:
            view = _JudgedView(TenantPlanner.build(graph), served, runs)
            if graph.nodes:
                self._judged.put(tenant, view)
        else:
            view.planner.sync(graph)
            view.served, view.runs = served, runs
        return view.planner


@dataclass
class _JudgedView:
    planner: TenantPlanner
    #: The served graph and the count of judged runs the planner's view was made from.
    served: PlannerGraph
    runs: int

    def fits(self, served: PlannerGraph, runs: int, view_runs: int) -> bool:
        if runs - self.runs >= view_runs or runs < self.runs:
            return False
        if served is self.served:
            return True
        return (
            served.nodes.keys() == self.served.nodes.keys()
            and served.members == self.served.members
        )


@dataclass(frozen=True)
class Judgement:
    """An execution's figures per method, and the tools they were judged on."""

    figures: dict[str, MethodFigures]
    tools: tuple[str, ...]


# --- the store ------------------------------------------------------------------------------


class PrequentialStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def record(
        self,
        tenant: str,
        figures: Mapping[str, MethodFigures] | None,
        tools: Sequence[str] = (),
        taught: ExecutionCompleted | None = None,
    ) -> None:
        """Add one execution's figures (empty: a skipped execution; None: one not judged), remember
        that its `tools` have run, and add what it `taught` to the judge's tally, in one
        transaction (an execution redelivered after a failure before it is judged again as
        the work it was, on the graph it was), and export the tenant's new means."""
        key = redis_keys.planner_prequential(tenant)
        fields = [f"{m}:{name}" for m in figures or {} for name in _SUMS]
        async with self._redis.pipeline(transaction=True) as pipe:
            if taught is not None:
                counts, used = judged_graph.increments(taught)
                tally = redis_keys.planner_judged(tenant)
                pipe.hincrby(tally, judged_graph.RUNS, 1)
                for name, count in counts.items():
                    pipe.hincrby(tally, name, count)
                if used:
                    pipe.hset(tally, mapping=used)  # type: ignore[arg-type]
            if tools:
                pipe.sadd(redis_keys.planner_runs(tenant), _run_digest(tools))
            counted = "unjudged" if figures is None else "executions" if figures else "skipped"
            pipe.hincrbyfloat(key, counted, 1)
            for method, one in (figures or {}).items():
                for name in _SUMS:
                    pipe.hincrbyfloat(key, f"{method}:{name}", float(getattr(one, name)))
            totals = await pipe.execute()
        # HINCRBYFLOAT answers the new sums: the tenant's figures now, without reading them.
        now = dict(zip(fields, map(float, totals[len(totals) - len(fields) :]), strict=True))
        for method in figures or {}:
            if method in METHODS:  # the blend's variants are its inner workings
                _export(tenant, method, _figures(now, method))

    async def judged_runs(self, tenant: str) -> int:
        """How many runs the judge's tally holds."""
        found = await self._redis.hget(redis_keys.planner_judged(tenant), judged_graph.RUNS)
        return int(found or 0)

    async def tally(self, tenant: str) -> judged_graph.RunTally:
        """What the executions judged so far taught (`judged_graph`)."""
        rows: dict[bytes | str, bytes | str] = await self._redis.hgetall(
            redis_keys.planner_judged(tenant)
        )
        return judged_graph.RunTally.from_fields({_text(k): _text(v) for k, v in rows.items()})

    async def summary(self, tenant: str) -> Summary:
        rows: dict[bytes | str, bytes | str] = await self._redis.hgetall(
            redis_keys.planner_prequential(tenant)
        )
        fields = {_text(k): float(v) for k, v in rows.items()}
        # The variants' figures on all runs are not read back: the blend's weights come from
        # new work alone (`blend_weights`).
        names = (*METHODS, *NEW_WORK_METHODS, *NEW_WORK_VARIANTS)
        found = {m: _figures(fields, m) for m in names}
        return Summary(
            found,
            int(fields.get("executions", 0.0)),
            int(fields.get("skipped", 0.0)),
            int(fields.get("unjudged", 0.0)),
        )

    async def ran_before(self, tenant: str, tools: Sequence[str]) -> bool:
        """Whether an execution recorded before ran this set of tools."""
        key = redis_keys.planner_runs(tenant)
        return bool(await self._redis.sismember(key, _run_digest(tools)))

    async def delete_tenant(self, tenant: str) -> None:
        await self._redis.delete(
            redis_keys.planner_prequential(tenant),
            redis_keys.planner_runs(tenant),
            redis_keys.planner_judged(tenant),
        )


def _run_digest(tools: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(set(tools))).encode()).hexdigest()


def _figures(fields: Mapping[str, float], method: str) -> MethodFigures:
    """`method`'s sums among a tenant's fields. Counts are kept as floats (HINCRBYFLOAT)."""

    def sum_of(name: str) -> float:
        return fields.get(f"{method}:{name}", 0.0)

    return MethodFigures(
        predictions=round(sum_of("predictions")),
        hits_at_1=round(sum_of("hits_at_1")),
        hits_at_3=round(sum_of("hits_at_3")),
        dags=round(sum_of("dags")),
        node_f1=sum_of("node_f1"),
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _export(tenant: str, method: str, totals: MethodFigures) -> None:
    attributes = {"pml.tenant_id": tenant, "method": method}
    _next_hit_at_1.set(totals.next_hit_at_1, attributes)
    _node_f1.set(totals.mean_node_f1, attributes)
