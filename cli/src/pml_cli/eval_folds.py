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
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from pml.v1 import common_pb2, scorer_pb2, search_pb2
from pml_cli import client
from pml_cli.catalog_files import CatalogFileError, load_catalog
from pml_cli.eval_tools import TOP_K, EvalError, ToolQuery, load_queries, rank_queries, ranker
from pml_cli.local_stack import running_system
from pml_cli.metrics import ToolMetrics
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.settings import Settings

FOLD_METHODS = ("shgat", "cosine")
SPLIT_SEED = 0
#: How long one fold may wait for the trainer to publish a model that saw all its executions.
TRAINING_TIMEOUT_S = 1800.0


def fold_split(count: int, folds: int, seed: int = SPLIT_SEED) -> list[np.ndarray]:
    if folds < 2 or folds > count:
        raise EvalError(f"--folds must be between 2 and the number of queries ({count})")
    order = np.random.default_rng(seed).permutation(count)
    return list(np.array_split(order, folds))


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
    try:
        tools = load_catalog(data / "catalog.jsonl")
    except CatalogFileError as exc:
        raise EvalError(str(exc)) from exc
    queries = [q for q in load_queries(data / "queries.jsonl") if len(q.relevant) >= min_relevant]
    queries = queries[:max_queries] if max_queries is not None else queries
    if not queries:
        raise EvalError(f"{data / 'queries.jsonl'}: no query with {min_relevant}+ relevant tools")
    split = fold_split(len(queries), folds)
    services = ("search", "trainer", "scorer") if method == "shgat" else ("search",)
    metrics = ToolMetrics()
    started = time.perf_counter()
    with running_system(settings, console, services) as live:
        for number, test_rows in enumerate(split):
            train = [queries[i] for f, rows in enumerate(split) if f != number for i in rows]
            test = [queries[i] for i in test_rows]
            tenant = f"eval-{uuid.uuid4().hex[:12]}"
            try:
                with console.status(f"fold {number + 1}/{folds}: registering {len(tools)} tools…"):
                    client.register_tools(live, tenant, tools)
                rank = _prepare(live, tenant, method, train, console, number, folds)
                rank_queries(rank, test, metrics, console, f"fold {number + 1}/{folds}: {method}")
            finally:
                client.search_stub(live).DeleteTenant(
                    search_pb2.DeleteTenantRequest(tenant_id=tenant), timeout=120
                )
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
    capabilities = co_used_capabilities(train)
    _register_capabilities(settings, tenant, capabilities)
    events = [
        ExecutionCompleted.create(
            tenant_id=tenant,
            intent=q.query,
            steps=[ExecutionStep(node_id=t, success=True) for t in steps_of(q)],
            outcome="success",
            capability_id=capabilities.get(tuple(sorted(steps_of(q)))),
        )
        for q in train
    ]
    with console.status(f"fold {number + 1}/{folds}: publishing {len(events)} executions…"):
        asyncio.run(client.publish_events(settings, events))
    with console.status(f"fold {number + 1}/{folds}: waiting for the trainer's model…"):
        version = _wait_for_model(settings, tenant, len(events))
    console.log(f"fold {number + 1}/{folds}: scoring with model {version}")
    return _shgat_ranker(settings, tenant)


def _register_capabilities(
    settings: Settings, tenant: str, capabilities: dict[tuple[str, ...], str]
) -> None:
    messages = [
        common_pb2.Capability(id=cid, name=" + ".join(t.split(":")[-1] for t in tools), tools=tools)
        for tools, cid in capabilities.items()
    ]
    for start in range(0, len(messages), client.REGISTER_BATCH):
        client.search_stub(settings).RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant, capabilities=messages[start : start + client.REGISTER_BATCH]
            ),
            timeout=600,
        )


def _wait_for_model(settings: Settings, tenant: str, executions: int) -> str:
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
