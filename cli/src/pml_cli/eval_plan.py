"""`pml eval plan`: next-step and workflow suggestion, K-fold, through the running system.

The data set is in the exchange format; each query's ground truth is its `sequence` (tools in
the order used, repeats dropped after the first). A set without `sequence` falls back to
`relevant` in file order, and the result says so (`"sequence_from": "relevant"`; "mixed" when
only some queries have one): such a set has no real order, so next-step figures on it measure
co-usage rather than order. Queries with fewer than `--min-steps` steps are left out.

Each fold learns as `pml eval tools --folds` does (see `eval_folds`): a tenant of its own gets
the catalog, every set of tools used together by a training query becomes a capability whose
`tools` are listed in the order the queries ran them, every training query is published as an
`ExecutionCompleted` whose steps run in sequence order with each step `depends_on` the one
before, and the evaluation waits until the trainer has judged a model trained on all of them
(`models` lists, per fold, the version served and whether the trainer's gate admitted it). Then
every test query of n steps is asked n times for the next step (PredictNext with the first
i = 0..n-1 steps as context) and once for a whole workflow (SuggestDag), with the chosen method;
the metrics are those of `plan_metrics`. The tenant is deleted afterwards.

Folds are split by query or by workflow (`--split`, see `eval_split`: with `workflow` no test
query's tool set was run in training). Capabilities, executions and the `knn` baseline come
from the training folds only. `knn` (`eval_baselines`) answers in this process from the
nearest training intent's sequence, and marks every answer accepted.

`default` asks naming no method, as most callers do: the planner answers with the method its
prequential figures on the fold's training executions favour (`models` lists, per fold, the
methods it chose).

Several methods (`--method drdsp,legacy,knn`) are asked in turn on the same learned folds, so
they are compared on one and the same learning; the result has one block per method, and
every planner method its difference to `knn` per metric (`vs_best_baseline`). A query whose
call fails is reported and scored as an empty answer; `--per-query FILE` keeps every answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np
from rich.console import Console
from rich.progress import Progress

from pml.v1 import planner_pb2
from pml_cli import client
from pml_cli.eval_baselines import PlanKnn, next_candidates
from pml_cli.eval_data import EvalError, ToolQuery, load_queries, load_tool_catalog
from pml_cli.eval_folds import intent_vectors, learn_from, seeded_trainer
from pml_cli.eval_runs import (
    Failures,
    Grouped,
    PerQueryLog,
    check_unique_ids,
    compare_to_baselines,
    describe,
    fit_queries,
    per_query_log,
    retry_unavailable,
)
from pml_cli.eval_runs import methods_of as _methods_of
from pml_cli.eval_split import SPLIT_SEED, gold_seen, steps_of, train_test_folds
from pml_cli.eval_tools import eval_tenant
from pml_cli.local_stack import running_system
from pml_cli.phases import phase
from pml_cli.plan_metrics import PLAN_METRICS, PlanMetrics, chain_edges, next_step_cases
from pml_common.settings import Settings

PLAN_SERVICES = ("search", "trainer", "scorer", "planner")
PLAN_BASELINES = ("knn",)
#: What a request naming no method gets: the planner's choice by its prequential figures.
DEFAULT_METHOD = "default"
EVAL_PLAN_METHODS = (*client.PLAN_METHODS, DEFAULT_METHOD, *PLAN_BASELINES)
#: How long the planner may go without judging another training execution before the fold's
#: default method is read as it stands.
JUDGEMENT_STALL_S = 120.0
RPC_TIMEOUT_S = 60.0
IN_FLIGHT = 4
#: How many next-step candidates the per-query log keeps.
LOGGED_CANDIDATES = 3


class PlannerStub(Protocol):
    def PredictNext(
        self, request: planner_pb2.PredictNextRequest, timeout: float
    ) -> planner_pb2.PredictNextResponse: ...

    def SuggestDag(
        self, request: planner_pb2.SuggestDagRequest, timeout: float
    ) -> planner_pb2.SuggestDagResponse: ...


@dataclass
class NextAnswer:
    context_size: int
    expected: str
    candidates: list[str]
    accepted: bool


@dataclass
class Plan:
    """A method's answers for one query: every next step, and one DAG."""

    nexts: list[NextAnswer]
    nodes: list[str]
    edges: list[tuple[str, str]]
    order: list[str]
    accepted: bool


Asker = Callable[[ToolQuery], Plan]


def sequence_source(queries: Sequence[ToolQuery]) -> str:
    """ "sequence" when every query has one, "relevant" when none has, else "mixed"."""
    having = sum(1 for q in queries if q.sequence)
    if having == len(queries):
        return "sequence"
    return "relevant" if having == 0 else "mixed"


def plan_queries(
    queries: Sequence[ToolQuery], min_steps: int, id_prefixes: tuple[str, ...] = ()
) -> list[ToolQuery]:
    """Queries with at least `min_steps` distinct steps (and an id starting with one of
    `id_prefixes`, when any)."""
    return [
        q
        for q in queries
        if len(steps_of(q)) >= min_steps and (not id_prefixes or q.id.startswith(id_prefixes))
    ]


def candidates_of(reply: planner_pb2.PredictNextResponse) -> list[str]:
    """The ranked candidates; just the next tool when a reply lists none."""
    ranked = [c.tool for c in reply.candidates]
    if not ranked and reply.next_tool:
        ranked = [reply.next_tool]
    return ranked


def methods_of(spec: str) -> list[str]:
    """`drdsp` or `drdsp,legacy,knn,...`: known methods, in the given order, without repeats."""
    return _methods_of(spec, EVAL_PLAN_METHODS)


def evaluate_plan(
    settings: Settings,
    data: Path,
    method: str,
    folds: int,
    min_steps: int,
    max_queries: int | None,
    console: Console,
    split: str = "query",
    seed: int = SPLIT_SEED,
    per_query: Path | None = None,
    id_prefixes: tuple[str, ...] = (),
) -> dict[str, Any]:
    methods = methods_of(method)
    if min_steps < 1:
        raise EvalError("--min-steps must be at least 1")
    tools = load_tool_catalog(data)
    loaded = load_queries(data / "queries.jsonl")
    queries = plan_queries(loaded, min_steps, id_prefixes)[:max_queries]
    if not queries:
        named = f" and an id starting with {' or '.join(id_prefixes)}" if id_prefixes else ""
        raise EvalError(f"{data / 'queries.jsonl'}: no query with {min_steps}+ steps{named}")
    check_unique_ids(queries)
    queries, truncated = fit_queries(queries, settings.max_query_chars)
    source = sequence_source(queries)
    if source != "sequence":
        console.log(f"queries without `sequence`: using `relevant` in file order ({source})")
    parts = train_test_folds(queries, folds, split, seed)
    started = time.perf_counter()
    vectors = intent_vectors(settings, queries, console) if "knn" in methods else {}
    tool_ids = {t.id for t in tools}
    runs = {m: PlanRun(tool_ids) for m in methods}
    served = [m for m in methods if m not in PLAN_BASELINES]
    seen = 0
    models: list[dict[str, Any]] = []
    with per_query_log(per_query) as log, _planner_system(settings, console, served) as live:
        trainer_seed = live.train_seed if live is not None else None
        for number, (train, test) in enumerate(parts):
            seen += gold_seen(train, test)
            if "knn" in methods:
                knn = PlanKnn(train, np.stack([vectors[q.id] for q in train]))
                ask = knn_asker(knn, vectors)
                run_plans(ask, test, runs["knn"], console, "knn", log, number)
            if live is None:
                continue
            label = f"fold {number + 1}/{folds}"
            with eval_tenant(live, tools, console, label) as tenant:
                model = learn_from(live, tenant, train, console, label, ordered=True)
                models.append({"fold": number, **asdict(model)})
                if DEFAULT_METHOD in served:
                    models[-1].update(chosen_methods(live, tenant, len(train), console, label))
                stub = client.planner_stub(live)
                for m in served:
                    ask = planner_asker(stub, tenant, m)
                    run_plans(ask, test, runs[m], console, m, log, number)
    results = {m: runs[m].result() for m in methods}
    compare_to_baselines(results, PLAN_BASELINES, PLAN_METRICS)
    return {
        "data": data.name,
        "split": split,
        "seed": seed,
        "folds": folds,
        "min_steps": min_steps,
        "id_prefixes": list(id_prefixes),
        "sequence_from": source,
        "queries": len(queries),
        "truncated": truncated,
        "test_gold_seen": seen,
        "trainer_seed": trainer_seed,
        "models": models,
        "methods": results,
        "seconds": round(time.perf_counter() - started, 1),
    }


@contextmanager
def _planner_system(
    settings: Settings, console: Console, served: Sequence[str]
) -> Iterator[Settings | None]:
    """The running system the planner methods need; None (nothing started) without any."""
    if not served:
        yield None
        return
    with running_system(settings, console, PLAN_SERVICES, seeded_trainer(settings)) as live:
        yield live


@dataclass
class PlanRun:
    """One method's plan figures (overall and per group), acceptances and failures."""

    tool_ids: set[str]
    metrics: Grouped[PlanMetrics] = field(init=False)
    failures: Failures = field(default_factory=Failures)
    next_accepted: int = 0
    dag_accepted: int = 0

    def __post_init__(self) -> None:
        self.metrics = Grouped(lambda: PlanMetrics(tool_ids=self.tool_ids))

    def add(self, query: ToolQuery, plan: Plan | None, error: str | None) -> dict[str, float]:
        """Add one query's answers (None: the call failed, scored as empty); its figures."""
        if error is not None:
            self.failures.add(query.id, error)
        steps = steps_of(query)
        plan = plan or _empty_plan(steps)
        hits: list[dict[str, float]] = []
        dag: dict[str, float] = {}
        for metrics in self.metrics.of(query.id):
            hits = [metrics.add_next(n.candidates, n.expected, n.context_size) for n in plan.nexts]
            dag = metrics.add_dag(plan.nodes, plan.edges, plan.order, steps)
        self.next_accepted += sum(1 for n in plan.nexts if n.accepted)
        self.dag_accepted += int(plan.accepted)
        means = {k: sum(h[k] for h in hits) / len(hits) for k in hits[0]} if hits else {}
        return {**means, **dag}

    def result(self) -> dict[str, Any]:
        figures = self.metrics.result()
        return {
            **figures,
            "next_accepted": _share(self.next_accepted, int(figures["predictions"])),
            "dag_accepted": _share(self.dag_accepted, int(figures["queries"])),
            **self.failures.result(),
        }


def _empty_plan(steps: Sequence[str]) -> Plan:
    nexts = [NextAnswer(len(ctx), want, [], False) for ctx, want in next_step_cases(steps)]
    return Plan(nexts, [], [], [], False)


def _share(count: int, total: int) -> float:
    return round(count / total, 4) if total else 0.0


def run_plans(
    ask: Asker,
    queries: Sequence[ToolQuery],
    run: PlanRun,
    console: Console,
    method: str,
    log: PerQueryLog,
    fold: int | None = None,
) -> PlanRun:
    """Ask for every next step and one DAG per query (4 in flight) into `run`; a failed call
    is reported, not raised."""

    def attempt(query: ToolQuery) -> tuple[Plan | None, str | None]:
        try:
            return ask(query), None
        except grpc.RpcError as exc:
            return None, describe(exc)

    label = method if fold is None else f"fold {fold + 1}: {method} plans"
    with (
        Progress(console=console, transient=True) as progress,
        ThreadPoolExecutor(IN_FLIGHT) as pool,
    ):
        task = progress.add_task(label, total=len(queries))
        for query, (plan, error) in zip(queries, pool.map(attempt, queries), strict=True):
            values = run.add(query, plan, error)
            log.write(method, query, fold, **_logged(query, plan, values, error))
            progress.advance(task)
    return run


def _logged(
    query: ToolQuery, plan: Plan | None, values: dict[str, float], error: str | None
) -> dict[str, Any]:
    nexts = plan.nexts if plan else []
    return {
        "relevant": steps_of(query),
        "ranked": plan.order[:10] if plan else [],
        "next": [
            {"context": n.context_size, "expected": n.expected, "top": n.candidates[:3]}
            for n in nexts
        ],
        "metrics": values,
        "error": error,
    }


def chosen_methods(
    settings: Settings, tenant: str, executions: int, console: Console, label: str
) -> dict[str, Any]:
    """The methods the planner chose for requests naming none, once it has judged the fold's
    training `executions` (or gone `JUDGEMENT_STALL_S` without judging another)."""
    judged, last_change = -1, time.monotonic()
    with phase(console, f"{label}: waiting for the planner to judge {executions} executions"):
        while True:
            info = client.planner_info(settings, tenant)
            now = info.executions + info.skipped_executions + info.unjudged_executions
            if now != judged:
                judged, last_change = now, time.monotonic()
            if now >= executions or time.monotonic() - last_change > JUDGEMENT_STALL_S:
                break
            time.sleep(1.0)
    weights = f"{info.blend_transitions_weight:g}, {info.blend_hyperpath_weight:g}"
    console.log(
        f"{label}: default methods next={info.next_method} dag={info.dag_method}"
        f" (blend weights: transitions, hyperpath {weights})"
    )
    return {
        "default_next": info.next_method,
        "default_dag": info.dag_method,
        "judged_executions": info.executions,
        # not judged: the planner could not fetch the intent's candidates (search too slow)
        "unjudged_executions": info.unjudged_executions,
        "blend_weights": [info.blend_transitions_weight, info.blend_hyperpath_weight],
        # what the choice was made on: each method's prequential figures on the training runs
        "prequential": _figures(info.methods),
        "prequential_new_work": _figures(info.new_work_methods),
        # what the blend's weights were chosen on
        "blend_variants_new_work": _figures(info.blend_variants_new_work),
    }


def _figures(found: Sequence[planner_pb2.MethodFigures]) -> dict[str, dict[str, float]]:
    return {
        m.method: {"next_hit@1": round(m.next_hit_at_1, 4), "node_f1": round(m.node_f1, 4)}
        for m in found
    }


def planner_asker(stub: PlannerStub, tenant: str, method: str) -> Asker:
    """Answers of the planner service with `method` (`default`: none named, the planner
    chooses): PredictNext per prefix, one SuggestDag."""
    wire = "" if method == DEFAULT_METHOD else method

    def next_step(intent: str, context: list[str]) -> planner_pb2.PredictNextResponse:
        request = planner_pb2.PredictNextRequest(
            tenant_id=tenant, intent=intent, context_tools=context, method=wire
        )
        return retry_unavailable(partial(stub.PredictNext, request, timeout=RPC_TIMEOUT_S))

    def ask(query: ToolQuery) -> Plan:
        nexts = []
        for context, want in next_step_cases(steps_of(query)):
            reply = next_step(query.query, context)
            nexts.append(NextAnswer(len(context), want, candidates_of(reply), reply.accepted))
        request = planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=query.query, method=wire)
        dag = retry_unavailable(partial(stub.SuggestDag, request, timeout=RPC_TIMEOUT_S))
        edges = [(e.source, e.target) for e in dag.edges]
        return Plan(nexts, list(dag.nodes), edges, list(dag.order), dag.accepted)

    return ask


def knn_asker(knn: PlanKnn, vectors: dict[str, np.ndarray]) -> Asker:
    """Answers of the `knn` baseline: the nearest training intent's sequence."""

    def ask(query: ToolQuery) -> Plan:
        sequence = knn.nearest(vectors[query.id])
        nexts = [
            NextAnswer(len(context), want, next_candidates(sequence, context), True)
            for context, want in next_step_cases(steps_of(query))
        ]
        return Plan(nexts, list(sequence), sorted(chain_edges(sequence)), list(sequence), True)

    return ask
