"""`pml eval tools --folds K`: learned ranking (SHGAT) against cosine under the same folds.

Queries are split into K folds (seeded shuffle, so every method sees the same split). For each
fold a tenant of its own receives the catalog and then learns from the *training* folds the
way a live system does: every training query becomes an `ExecutionCompleted` event (intent =
query, steps = `sequence` when present else `relevant`, outcome = success) published on the
stream, which the real trainer consumes, buffers and trains on under its lock; the scorer then
serves the published model. The *test* fold's queries are ranked through the public gRPC API.

Capabilities: a data set in the exchange format has none, so each distinct set of tools used
together by a training query (two tools or more) becomes one capability, named after its tools
and without a description (its embedding is the mean of its tools'). Test queries never shape
capabilities.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console

from pml.v1 import common_pb2, scorer_pb2, search_pb2
from pml_cli import client
from pml_cli.eval_tools import (
    TOP_K,
    EvalError,
    ToolQuery,
    eval_tenant,
    load_queries,
    load_tool_catalog,
    rank_queries,
    ranker,
)
from pml_cli.local_stack import running_system
from pml_cli.metrics import ToolMetrics
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.settings import Settings

FOLD_METHODS = ("shgat", "cosine")
SPLIT_SEED = 0
Q = TypeVar("Q")
#: How long one fold may wait for the trainer to publish a model that saw all its executions.
TRAINING_TIMEOUT_S = 1800.0


def fold_split(count: int, folds: int, seed: int = SPLIT_SEED) -> list[np.ndarray]:
    if folds < 2 or folds > count:
        raise EvalError(f"--folds must be between 2 and the number of queries ({count})")
    order = np.random.default_rng(seed).permutation(count)
    return list(np.array_split(order, folds))


def train_test_folds(
    queries: Sequence[Q], folds: int, seed: int = SPLIT_SEED
) -> list[tuple[list[Q], list[Q]]]:
    """(training queries, test queries) of every fold of `fold_split`."""
    split = fold_split(len(queries), folds, seed)
    return [
        (
            [queries[i] for other, rows in enumerate(split) if other != number for i in rows],
            [queries[i] for i in test_rows],
        )
        for number, test_rows in enumerate(split)
    ]


def steps_of(query: ToolQuery) -> list[str]:
    return list(dict.fromkeys(query.sequence or query.relevant))


def co_used_capabilities(queries: Sequence[ToolQuery]) -> dict[tuple[str, ...], str]:
    """Tool set → capability id, for every set of 2+ tools some training query used."""
    sets = sorted({tuple(sorted(steps_of(q))) for q in queries if len(set(steps_of(q))) >= 2})
    return {tools: "co-used:" + "+".join(tools) for tools in sets}


def evaluate_folds(
    settings: Settings,
    data: Path,
    method: str,
    folds: int,
    min_relevant: int,
    max_queries: int | None,
    console: Console,
) -> dict[str, Any]:
    if method not in FOLD_METHODS:
        raise EvalError(f"--folds supports {', '.join(FOLD_METHODS)}, not {method!r}")
    tools = load_tool_catalog(data)
    queries = [q for q in load_queries(data / "queries.jsonl") if len(q.relevant) >= min_relevant]
    queries = queries[:max_queries] if max_queries is not None else queries
    if not queries:
        raise EvalError(f"{data / 'queries.jsonl'}: no query with {min_relevant}+ relevant tools")
    split = train_test_folds(queries, folds)
    services = ("search", "trainer", "scorer") if method == "shgat" else ("search",)
    metrics = ToolMetrics()
    started = time.perf_counter()
    with running_system(settings, console, services) as live:
        for number, (train, test) in enumerate(split):
            label = f"fold {number + 1}/{folds}"
            with eval_tenant(live, tools, console, label) as tenant:
                rank = _prepare(live, tenant, method, train, console, number, folds)
                rank_queries(rank, test, metrics, console, f"{label}: {method}")
    return {
        "method": method,
        "folds": folds,
        "min_relevant": min_relevant,
        **metrics.result(),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _prepare(
    settings: Settings,
    tenant: str,
    method: str,
    train: list[ToolQuery],
    console: Console,
    number: int,
    folds: int,
) -> Callable[[str], list[str]]:
    if method == "cosine":
        return ranker(settings, tenant, "cosine")
    learn_from(settings, tenant, train, console, f"fold {number + 1}/{folds}")
    return _shgat_ranker(settings, tenant)


def learn_from(
    settings: Settings,
    tenant: str,
    train: Sequence[ToolQuery],
    console: Console,
    label: str,
    ordered: bool = False,
) -> str:
    """Teach `tenant` the training queries as a live system learns; the served model version.

    Registers the co-used capabilities, publishes one ExecutionCompleted per query, and waits
    until the scorer serves a model trained on all of them. `ordered`: capabilities list their
    tools in the order the queries ran them and each step `depends_on` the one before (plans);
    otherwise capability tools are sorted and steps carry no dependencies (retrieval).
    """
    capabilities = co_used_capabilities(train)
    orders = capability_orders(train) if ordered else None
    register_capabilities(settings, tenant, capabilities, orders)
    events = training_events(tenant, train, capabilities, chain=ordered)
    with console.status(f"{label}: publishing {len(events)} executions…"):
        asyncio.run(client.publish_events(settings, events))
    with console.status(f"{label}: waiting for the trainer's model…"):
        version = wait_for_model(settings, tenant, len(events))
    console.log(f"{label}: serving model {version}")
    return version


def capability_orders(queries: Sequence[ToolQuery]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Tool set → the order its queries ran it in most often (the first seen on a tie)."""
    counts: dict[tuple[str, ...], Counter[tuple[str, ...]]] = {}
    for q in queries:
        steps = tuple(steps_of(q))
        if len(steps) >= 2:
            counts.setdefault(tuple(sorted(steps)), Counter())[steps] += 1
    # Counter.most_common keeps insertion order among equal counts.
    return {key: c.most_common(1)[0][0] for key, c in counts.items()}


def training_events(
    tenant: str,
    train: Sequence[ToolQuery],
    capabilities: dict[tuple[str, ...], str],
    chain: bool = False,
) -> list[ExecutionCompleted]:
    """One successful execution per training query; `chain`: step i depends on step i-1."""
    events = []
    for q in train:
        steps = steps_of(q)
        events.append(
            ExecutionCompleted.create(
                tenant_id=tenant,
                intent=q.query,
                steps=[
                    ExecutionStep(
                        node_id=t,
                        success=True,
                        depends_on=[steps[i - 1]] if chain and i > 0 else [],
                    )
                    for i, t in enumerate(steps)
                ],
                outcome="success",
                capability_id=capabilities.get(tuple(sorted(steps))),
            )
        )
    return events


def register_capabilities(
    settings: Settings,
    tenant: str,
    capabilities: dict[tuple[str, ...], str],
    orders: dict[tuple[str, ...], tuple[str, ...]] | None = None,
) -> None:
    """Register the capabilities; their `tools` in `orders` when given, else sorted."""
    orders = orders or {}
    messages = [
        common_pb2.Capability(
            id=cid,
            name=" + ".join(t.split(":")[-1] for t in orders.get(tools, tools)),
            tools=orders.get(tools, tools),
        )
        for tools, cid in capabilities.items()
    ]
    stub = client.search_stub(settings)
    for start in range(0, len(messages), client.REGISTER_BATCH):
        stub.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant, capabilities=messages[start : start + client.REGISTER_BATCH]
            ),
            timeout=600,
        )


def wait_for_model(settings: Settings, tenant: str, executions: int) -> str:
    """Poll the scorer until it serves a model trained after all `executions` arrived."""
    stub = client.scorer_stub(settings)
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    while time.monotonic() < deadline:
        info = stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
        if info.metrics.get("traces_seen", 0) >= executions:
            return str(info.version)
        time.sleep(1.0)
    raise EvalError(f"no model trained on all {executions} executions within {TRAINING_TIMEOUT_S}s")


def _shgat_ranker(settings: Settings, tenant: str) -> Callable[[str], list[str]]:
    stub = client.scorer_stub(settings)

    def rank(query: str) -> list[str]:
        reply = stub.ScoreTools(
            scorer_pb2.ScoreRequest(tenant_id=tenant, text=query, top_k=TOP_K), timeout=60
        )
        return [s.id for s in reply.scores]

    return rank
