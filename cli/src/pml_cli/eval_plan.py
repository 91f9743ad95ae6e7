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
before, and the evaluation waits until the scorer serves a model trained on all of them. Then
every test query of n steps is asked n times for the next step (PredictNext with the first
i = 0..n-1 steps as context) and once for a whole workflow (SuggestDag), with the chosen method;
the metrics are those of `plan_metrics`. The tenant is deleted afterwards.

Several methods (`--method drdsp,legacy,search`) are asked in turn on the same learned folds, so
they are compared on one and the same learning; the result then has one entry per method.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from rich.console import Console
from rich.progress import Progress

from pml.v1 import planner_pb2
from pml_cli import client
from pml_cli.eval_folds import learn_from, steps_of, train_test_folds
from pml_cli.eval_tools import EvalError, ToolQuery, eval_tenant, load_queries, load_tool_catalog
from pml_cli.local_stack import running_system
from pml_cli.plan_metrics import PlanMetrics, next_step_cases
from pml_common.settings import Settings

PLAN_SERVICES = ("search", "trainer", "scorer", "planner")
RPC_TIMEOUT_S = 60.0
IN_FLIGHT = 4

T = TypeVar("T")
#: A next-step case as asked: the context size, the expected tool and the planner's reply.
_Next = tuple[int, str, planner_pb2.PredictNextResponse]


class PlannerStub(Protocol):
    def PredictNext(
        self, request: planner_pb2.PredictNextRequest, timeout: float
    ) -> planner_pb2.PredictNextResponse: ...

    def SuggestDag(
        self, request: planner_pb2.SuggestDagRequest, timeout: float
    ) -> planner_pb2.SuggestDagResponse: ...


def sequence_source(queries: Sequence[ToolQuery]) -> str:
    """ "sequence" when every query has one, "relevant" when none has, else "mixed"."""
    having = sum(1 for q in queries if q.sequence)
    if having == len(queries):
        return "sequence"
    return "relevant" if having == 0 else "mixed"


def plan_queries(queries: Sequence[ToolQuery], min_steps: int) -> list[ToolQuery]:
    """Queries with at least `min_steps` distinct steps."""
    return [q for q in queries if len(steps_of(q)) >= min_steps]


def candidates_of(reply: planner_pb2.PredictNextResponse) -> list[str]:
    """The ranked candidates; just the next tool when a reply lists none."""
    ranked = [c.tool for c in reply.candidates]
    if not ranked and reply.next_tool:
        ranked = [reply.next_tool]
    return ranked


def methods_of(spec: str) -> list[str]:
    """`drdsp` or `drdsp,legacy,...`: known methods, in the given order, without repeats."""
    methods = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    unknown = [m for m in methods if m not in client.PLAN_METHODS]
    if unknown or not methods:
        choices = ", ".join(client.PLAN_METHODS)
        raise EvalError(f"unknown method {spec!r}; choose among {choices} (comma-separated)")
    return methods


def evaluate_plan(
    settings: Settings,
    data: Path,
    method: str,
    folds: int,
    min_steps: int,
    max_queries: int | None,
    console: Console,
) -> dict[str, Any]:
    methods = methods_of(method)
    if min_steps < 1:
        raise EvalError("--min-steps must be at least 1")
    tools = load_tool_catalog(data)
    queries = plan_queries(load_queries(data / "queries.jsonl"), min_steps)[:max_queries]
    if not queries:
        raise EvalError(f"{data / 'queries.jsonl'}: no query with {min_steps}+ steps")
    source = sequence_source(queries)
    if source != "sequence":
        console.log(f"queries without `sequence`: using `relevant` in file order ({source})")
    split = train_test_folds(queries, folds)
    metrics = {m: PlanMetrics(tool_ids={t.id for t in tools}) for m in methods}
    accepted: dict[str, Counter[str]] = {m: Counter() for m in methods}
    started = time.perf_counter()
    with running_system(settings, console, PLAN_SERVICES) as live:
        stub = client.planner_stub(live)
        for number, (train, test) in enumerate(split):
            label = f"fold {number + 1}/{folds}"
            with eval_tenant(live, tools, console, label) as tenant:
                learn_from(live, tenant, train, console, label, ordered=True)
                for m in methods:
                    answered = run_plans(stub, tenant, m, test, metrics[m], console, label)
                    accepted[m].update(answered)
    common = {"folds": folds, "min_steps": min_steps, "sequence_from": source}
    results = [{"method": m, **common, **_figures(metrics[m], accepted[m])} for m in methods]
    seconds = round(time.perf_counter() - started, 1)
    if len(results) == 1:
        return {**results[0], "seconds": seconds}
    return {**common, "methods": results, "seconds": seconds}


def _figures(metrics: PlanMetrics, accepted: Counter[str]) -> dict[str, Any]:
    result = metrics.result()
    return {
        **result,
        "next_accepted": _share(accepted["next"], int(result["predictions"])),
        "dag_accepted": _share(accepted["dag"], int(result["queries"])),
    }


def _share(count: int, total: int) -> float:
    return round(count / total, 4) if total else 0.0


def run_plans(
    stub: PlannerStub,
    tenant: str,
    method: str,
    queries: Sequence[ToolQuery],
    metrics: PlanMetrics,
    console: Console,
    label: str,
) -> dict[str, int]:
    """Ask for every next step and one DAG per query; add them to `metrics`.

    Returns how many next-step and DAG answers the planner marked accepted.
    """

    def next_step(intent: str, context: list[str]) -> planner_pb2.PredictNextResponse:
        request = planner_pb2.PredictNextRequest(
            tenant_id=tenant, intent=intent, context_tools=context, method=method
        )
        return _retrying(partial(stub.PredictNext, request, timeout=RPC_TIMEOUT_S))

    def ask(query: ToolQuery) -> tuple[list[str], list[_Next], planner_pb2.SuggestDagResponse]:
        """The query's steps, (expected, reply) per next-step case, and its DAG."""
        steps = steps_of(query)
        nexts = [
            (len(ctx), want, next_step(query.query, ctx)) for ctx, want in next_step_cases(steps)
        ]
        request = planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=query.query, method=method)
        dag = _retrying(partial(stub.SuggestDag, request, timeout=RPC_TIMEOUT_S))
        return steps, nexts, dag

    accepted = {"next": 0, "dag": 0}
    with (
        Progress(console=console, transient=True) as progress,
        ThreadPoolExecutor(IN_FLIGHT) as pool,
    ):
        task = progress.add_task(f"{label}: {method} plans", total=len(queries))
        for steps, nexts, dag in pool.map(ask, queries):
            for context_size, expected, reply in nexts:
                metrics.add_next(candidates_of(reply), expected, context_size)
                accepted["next"] += int(reply.accepted)
            metrics.add_dag(
                dag.nodes, [(e.source, e.target) for e in dag.edges], list(dag.order), steps
            )
            accepted["dag"] += int(dag.accepted)
            progress.advance(task)
    return accepted


def _retrying(call: Callable[[], T]) -> T:
    """One retry on UNAVAILABLE, so a blip on a shared machine does not void a long run."""
    try:
        return call()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
            raise
        return call()
