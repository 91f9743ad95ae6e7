"""`pml eval tools --folds K`: learned ranking against supervised baselines and the first
stage, every method on the same folds.

Queries are split into K folds, by query or by workflow (`eval_split`; seeded, so every method
sees the same split). For each fold:
- the supervised baselines `knn` and `popular` (`eval_baselines`) are computed in this process
  from the training folds;
- for the methods served by the system, a tenant of its own receives the catalog; when a
  learned method (`shgat`) is asked for, it then learns from the *training* folds the way a
  live system does: every training query becomes an `ExecutionCompleted` event (intent =
  query, steps = `sequence` when present else `relevant`, outcome = success) published on the
  stream, which the real trainer consumes, buffers and trains on under its lock; the scorer
  then serves the published model. The trainer's gate may reject a model (it holds back some
  executions to judge it): the evaluation measures what is served then, and `models` lists per
  fold the version served, its weights, whether the last model was admitted, and the gate's
  figures of the served version and of the last rejected candidate (`gate`, `rejected`:
  executions learned from and held back, held-back recall@5 and MRR of the candidate, the
  version it was judged against and the first stage), so the gate's choice can be read
  beside the fold's test figures. The *test* fold's queries
  are ranked through the public gRPC API. Single-pass methods (`cosine`, `dense`, ...) rank as
  without folds, on the fold's tenant: `unified` and `hybrid` then also read what the trainer
  learned from the training folds (reliability, co-use edges) when a learned method ran.

Capabilities: a data set in the exchange format has none, so each distinct set of tools used
together by a training query (two tools or more) becomes one capability, named after its tools
and without a description (its embedding is the mean of its tools'). Test queries never shape
capabilities, baselines or anything learned.

The result has one block per method and, for every method that is not a baseline, its
difference to the best baseline per metric (`vs_best_baseline`); `test_gold_seen` counts the
test queries whose gold tool set a training query had (what memory alone could answer).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console

from pml.v1 import common_pb2, scorer_pb2, search_pb2
from pml_cli import client
from pml_cli.eval_baselines import (
    BASELINES,
    ToolKnn,
    by_popularity,
    embed_intents,
    popularity,
)
from pml_cli.eval_data import QuerySelection, ToolQuery, load_tool_catalog
from pml_cli.eval_runs import (
    PerQueryLog,
    compare_to_baselines,
    methods_of,
    per_query_log,
    retry_unavailable,
)
from pml_cli.eval_split import SPLIT_SEED, gold_seen, train_test_folds
from pml_cli.eval_split import fold_split as fold_split
from pml_cli.eval_split import steps_of as steps_of
from pml_cli.eval_tools import (
    METHODS,
    TOP_K,
    Rank,
    ToolRun,
    eval_tenant,
    load_eval_queries,
    rank_queries,
    ranker,
    retrying,
)
from pml_cli.local_stack import running_system
from pml_cli.metrics import TOOL_METRICS
from pml_cli.phases import phase
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.input_rules import MAX_ID_CHARS
from pml_common.settings import Settings

LEARNED = ("shgat",)
FOLD_METHODS = (*LEARNED, *BASELINES, *METHODS)
#: How long one fold may wait for the trainer to publish a model that saw all its executions.
TRAINING_TIMEOUT_S = 1800.0
#: The trainer's seed in the private system an evaluation starts (`seeded_trainer`).
TRAINER_SEED = 0


def co_used_capabilities(queries: Sequence[ToolQuery]) -> dict[tuple[str, ...], str]:
    """Tool set → capability id, for every set of 2+ tools some training query used."""
    sets = sorted({tuple(sorted(steps_of(q))) for q in queries if len(set(steps_of(q))) >= 2})
    return {tools: capability_id(tools) for tools in sets}


def capability_id(tools: Sequence[str]) -> str:
    """`co-used:<tool>+<tool>…`, or a digest of it when that is longer than an id may be."""
    readable = "co-used:" + "+".join(tools)
    if len(readable) <= MAX_ID_CHARS:
        return readable
    return "co-used:" + hashlib.sha256(readable.encode("utf-8")).hexdigest()


def evaluate_folds(
    settings: Settings,
    data: Path,
    method: str,
    folds: int,
    selection: QuerySelection,
    console: Console,
    split: str = "query",
    seed: int = SPLIT_SEED,
    per_query: Path | None = None,
) -> dict[str, Any]:
    methods = methods_of(method, FOLD_METHODS, "with --folds")
    tools = load_tool_catalog(data)
    queries, truncated = load_eval_queries(settings, data, selection)
    parts = train_test_folds(queries, folds, split, seed)
    started = time.perf_counter()
    vectors = intent_vectors(settings, queries, console) if "knn" in methods else {}
    served = [m for m in methods if m not in BASELINES]
    runs = {m: ToolRun() for m in methods}
    seen = 0
    models: list[dict[str, Any]] = []
    with per_query_log(per_query) as log, _system(settings, console, served) as live:
        trainer_seed = live.train_seed if live is not None else None
        for number, (train, test) in enumerate(parts):
            seen += gold_seen(train, test)
            for m in (m for m in methods if m in BASELINES):
                rank = baseline_ranker(m, train, vectors)
                rank_queries(rank, test, runs[m], console, m, log, number)
            if live is not None:
                model = _served_fold(live, tools, served, train, test, runs, console, log, number)
                models += [{"fold": number, **asdict(model)}] if model else []
    results = {m: runs[m].result() for m in methods}
    if models:
        results["shgat"]["models"] = models
    compare_to_baselines(results, BASELINES, TOOL_METRICS)
    return {
        "data": data.name,
        "split": split,
        "seed": seed,
        "folds": folds,
        "min_relevant": selection.min_relevant,
        "id_prefixes": list(selection.id_prefixes),
        "queries": len(queries),
        "truncated": truncated,
        "test_gold_seen": seen,
        "trainer_seed": trainer_seed,
        "methods": results,
        "seconds": round(time.perf_counter() - started, 1),
    }


@contextmanager
def _system(
    settings: Settings, console: Console, served: Sequence[str]
) -> Iterator[Settings | None]:
    """The running system the served methods need; None (nothing started) when there are none."""
    if not served:
        yield None
        return
    services = ("search", "trainer", "scorer") if set(served) & set(LEARNED) else ("search",)
    with running_system(settings, console, services, seeded_trainer(settings)) as live:
        yield live


def seeded_trainer(settings: Settings) -> dict[str, object]:
    """A private system's trainer seeded (`PML_TRAIN_SEED`; `TRAINER_SEED` unless set), so
    that it learns each fold the same way on every run; a running system keeps its own."""
    return {} if settings.train_seed is not None else {"train_seed": TRAINER_SEED}


def _served_fold(
    live: Settings,
    tools: Sequence[Any],
    served: Sequence[str],
    train: list[ToolQuery],
    test: list[ToolQuery],
    runs: dict[str, ToolRun],
    console: Console,
    log: PerQueryLog,
    number: int,
) -> ServedModel | None:
    """One fold of the methods the system serves, on a tenant of the fold's own; the model
    the fold learned, when a learned method asked for one."""
    label = f"fold {number + 1}"
    model = None
    with eval_tenant(live, tools, console, label) as tenant:
        if set(served) & set(LEARNED):
            model = learn_from(live, tenant, train, console, label)
        for m in served:
            rank = _shgat_ranker(live, tenant) if m == "shgat" else ranker(live, tenant, m)
            rank_queries(rank, test, runs[m], console, m, log, number)
    return model


def intent_vectors(
    settings: Settings, queries: Sequence[ToolQuery], console: Console
) -> dict[str, np.ndarray]:
    """Query id → the embedding of its intent, by the system's embedder."""
    with phase(console, f"embedding {len(queries)} intents for knn"):
        matrix = embed_intents(settings, [q.query for q in queries])
    return {q.id: matrix[i] for i, q in enumerate(queries)}


def baseline_ranker(
    method: str, train: Sequence[ToolQuery], vectors: dict[str, np.ndarray]
) -> Rank:
    """The `Rank` of a supervised baseline learned from `train` alone."""
    if method == "popular":
        ranking = by_popularity(popularity(train))[:TOP_K]
        return lambda query: ranking
    knn = ToolKnn(train, np.stack([vectors[q.id] for q in train]))
    return lambda query: knn.rank(vectors[query.id], TOP_K)


def learn_from(
    settings: Settings,
    tenant: str,
    train: Sequence[ToolQuery],
    console: Console,
    label: str,
    ordered: bool = False,
) -> ServedModel:
    """Teach `tenant` the training queries as a live system learns; the model then served.

    Registers the co-used capabilities, publishes one ExecutionCompleted per query, and waits
    until the trainer has judged a model trained on all of them (`wait_for_model`). `ordered`:
    capabilities list their tools in the order the queries ran them and each step `depends_on`
    the one before (plans); otherwise capability tools are sorted and steps carry no
    dependencies (retrieval).
    """
    capabilities = co_used_capabilities(train)
    orders = capability_orders(train) if ordered else None
    register_capabilities(settings, tenant, capabilities, orders)
    events = training_events(tenant, train, capabilities, chain=ordered)
    with phase(console, f"{label}: publishing {len(events)} executions"):
        asyncio.run(client.publish_events(settings, events))
    with phase(console, f"{label}: waiting for the trainer's model"):
        served = wait_for_model(settings, tenant, len(events))
    verdict = "admitted" if served.admitted else "rejected by the trainer's gate"
    verdict = verdict if served.complete else served.note
    w, m, a = served.weights
    console.log(
        f"{label}: serving model {served.version or '(first stage)'} (weights: SHGAT {w:g}, "
        f"memory {m:g}, adapter {a:g}); last one {verdict}"
    )
    return served


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
        request = search_pb2.RegisterCapabilitiesRequest(
            tenant_id=tenant, capabilities=messages[start : start + client.REGISTER_BATCH]
        )
        retry_unavailable(partial(stub.RegisterCapabilities, request, timeout=600))


@dataclass(frozen=True)
class ServedModel:
    """What the scorer serves once the trainer has judged a model trained on every execution:
    `admitted` False when the trainer's gate rejected that model (the version served is then
    an earlier one, or the untrained first stage). `complete` False when no such model came
    within `TRAINING_TIMEOUT_S`: the fold is then measured on what is served at that time (as
    a live system would answer), and `note` says why."""

    version: str
    admitted: bool
    complete: bool = True
    note: str = ""
    #: The served version's weights of SHGAT's correction, the execution memory's and the
    #: query adapter's.
    weights: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: The trainer's gate figures of the served version (`gate_figures`), and of the candidate
    #: it rejected last when that one accounts for every execution: what the gate chose on.
    gate: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, float] = field(default_factory=dict)


#: The figures of a version's record that say what the gate judged it on.
GATE_FIGURES = (
    "traces_seen",
    "holdout_size",
    "holdout_novel_size",
    "holdout_candidate_recall_at_5",
    "holdout_candidate_mrr",
    "holdout_serving_recall_at_5",
    "holdout_serving_mrr",
    "holdout_first_stage_recall_at_5",
    "holdout_first_stage_mrr",
    "holdout_cross_fitted_recall_at_5",
    "holdout_cross_fitted_mrr",
    "holdout_cross_fitted_first_stage_recall_at_5",
    "out_of_fold_size",
)


def gate_figures(metrics: Mapping[str, float]) -> dict[str, float]:
    """The `GATE_FIGURES` among a version's metrics, rounded for the report."""
    return {name: round(float(metrics[name]), 4) for name in GATE_FIGURES if name in metrics}


def wait_for_model(settings: Settings, tenant: str, executions: int) -> ServedModel:
    """Poll until the trainer has judged a model that accounts for all `executions`: served
    (the scorer's model does) or rejected by its gate (`ModelInfo.last_rejected` does),
    whichever comes first; at most `TRAINING_TIMEOUT_S`, so that one fold
    whose training does not finish is reported rather than the end of the run."""
    stub = client.scorer_stub(settings)
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    version = ""
    while time.monotonic() < deadline:
        try:
            info = stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
        except grpc.RpcError:
            # A scorer busy on a loaded machine may answer late: the deadline bounds the wait.
            time.sleep(1.0)
            continue
        version = str(info.version)
        weights = (
            float(info.correction_weight),
            float(info.memory_weight),
            float(info.adapter_weight),
        )
        gate = gate_figures(info.metrics)
        if covered(info.metrics) >= executions:
            return ServedModel(version, True, weights=weights, gate=gate)
        rejected = judged_figures(info.last_rejected)
        if info.last_rejected.version and covered(rejected) >= executions:
            return ServedModel(
                version, False, weights=weights, gate=gate, rejected=gate_figures(rejected)
            )
        time.sleep(1.0)
    note = f"no model accounted for all {executions} executions within {TRAINING_TIMEOUT_S:.0f}s"
    return ServedModel(version, False, complete=False, note=note)


def covered(metrics: Mapping[str, float]) -> float:
    """Executions a trained model accounts for: those it could learn from (`traces_seen`) and
    those the trainer held back to judge it (`holdout_size`), which it never learns from."""
    return metrics.get("traces_seen", 0.0) + metrics.get("holdout_size", 0.0)


def judged_figures(record: scorer_pb2.CandidateFigures) -> dict[str, float]:
    """A `ModelInfo` candidate's figures under the names of the version's metrics
    (`GATE_FIGURES`)."""
    return {
        "traces_seen": float(record.traces_seen),
        "holdout_size": float(record.holdout_size),
        "holdout_novel_size": float(record.holdout_novel_size),
        "holdout_candidate_recall_at_5": record.candidate_recall_at_5,
        "holdout_candidate_mrr": record.candidate_mrr,
        "holdout_serving_recall_at_5": record.serving_recall_at_5,
        "holdout_serving_mrr": record.serving_mrr,
        "holdout_first_stage_recall_at_5": record.first_stage_recall_at_5,
        "holdout_first_stage_mrr": record.first_stage_mrr,
        "holdout_cross_fitted_recall_at_5": record.cross_fitted_recall_at_5,
        "holdout_cross_fitted_mrr": record.cross_fitted_mrr,
        "holdout_cross_fitted_first_stage_recall_at_5": record.cross_fitted_first_stage_recall_at_5,
        "out_of_fold_size": float(record.out_of_fold_size),
    }


def _shgat_ranker(settings: Settings, tenant: str) -> Rank:
    stub = client.scorer_stub(settings)

    def rank(query: ToolQuery) -> list[str]:
        reply = stub.ScoreTools(
            scorer_pb2.ScoreRequest(tenant_id=tenant, text=query.query, top_k=TOP_K), timeout=60
        )
        return [s.id for s in reply.scores]

    return retrying(rank)
