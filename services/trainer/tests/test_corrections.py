"""The cheap corrections and their out-of-fold scores (pml_trainer.corrections)."""

from __future__ import annotations

import numpy as np

from pml_common.first_stage import Reach
from pml_common.tool_first_stage import Intent
from pml_common.tool_graph import GraphTool, ToolGraph
from pml_shgat.memory import Execution, fit
from pml_trainer.corrections import FOLDS, MIN_OUT_OF_FOLD, fit_adapter, fit_corrections
from pml_trainer.evaluation import TenantView, build_view, hierarchy_of
from pml_trainer.replay_buffer import Trace

DIM = 16


def _view(rng: np.random.Generator) -> tuple[TenantView, list[str]]:
    ids = [f"srv{i % 3}:tool{i}" for i in range(12)]
    tools = tuple(GraphTool(i, i.split(":")[1], f"does {i}", i.split(":")[0]) for i in ids)
    catalog = rng.normal(size=(len(ids), DIM)).astype(np.float32)
    catalog /= np.linalg.norm(catalog, axis=1, keepdims=True)
    graph = ToolGraph(
        "t",
        tools,
        (),
        {i: rng.normal(size=DIM).astype(np.float32) for i in ids},
        catalog,
        (DIM,),
        (Reach.CROSS_SCRIPT,),
    )
    return build_view(graph, hierarchy_of(graph, DIM), None), graph.servers_of(ids)


def _executions(rng: np.random.Generator, count: int) -> tuple[list[Trace], list[Intent]]:
    """Traces over six habits (a pair of tools each), the last one's pair run once only."""
    habits = [(f"srv{a % 3}:tool{a}", f"srv{b % 3}:tool{b}") for a, b in ((0, 1), (2, 5), (3, 4))]
    traces, intents = [], []
    for i in range(count):
        path = ["srv2:tool11", "srv0:tool9"] if i == count - 1 else list(habits[i % 3])
        traces.append(Trace(trace_id=f"t{i}", intent=f"request {i}", path=path, outcome=1))
        vector = rng.normal(size=DIM).astype(np.float32)
        intents.append(Intent(vector, (f"request {i}",), vector[None, :] / np.linalg.norm(vector)))
    return traces, intents


def test_each_execution_is_scored_by_corrections_fitted_without_its_fold() -> None:
    rng = np.random.default_rng(3)
    view, servers = _view(rng)
    traces, intents = _executions(rng, 28)
    fitted = fit_corrections(view, servers, traces, intents, np.random.default_rng(0))
    assert fitted.memory is not None and fitted.adapter is not None
    assert fitted.out_of_fold is not None
    oof = fitted.out_of_fold()
    assert oof is not None and oof.corrections.shgat is None
    assert oof.corrections.memory is not None and oof.corrections.adapter is not None
    order = [i for fold in range(FOLDS) for i in range(28)[fold::FOLDS]]
    assert len(oof.judged) == len(order) == 28
    ids = view.hierarchy.tool_ids
    first = [view.first_stage(i) for i in intents]
    executions = [Execution(i.vector, tuple(t.path)) for t, i in zip(traces, intents, strict=True)]
    for row, i in enumerate(order):
        others = [j for j in range(28) if j % FOLDS != i % FOLDS]
        memory = fit([executions[j] for j in others], [first[j] for j in others], ids, servers)
        assert memory is not None
        expected = memory.serve(ids, servers).correction(first[i], intents[i].vector)
        np.testing.assert_allclose(oof.corrections.memory[row], expected)
        adapter = fit_adapter(view, [traces[j] for j in others], [intents[j] for j in others], rng)
        assert adapter is not None
        adapted = view.baseline.scores_adapted(intents[i], adapter.adapt)[1]
        assert adapted is not None
        np.testing.assert_allclose(oof.corrections.adapter[row], adapted - first[i], atol=1e-6)
        np.testing.assert_array_equal(oof.first_stage[row], first[i])
        # novel: no trace of the fits ran its set of tools (the last trace's pair is run once)
        assert oof.judged[row].novel == (i == 27)


def test_too_few_executions_give_no_out_of_fold_scores_and_none_no_corrections() -> None:
    rng = np.random.default_rng(4)
    view, servers = _view(rng)
    traces, intents = _executions(rng, MIN_OUT_OF_FOLD - 1)
    fitted = fit_corrections(view, servers, traces, intents, rng)
    assert fitted.memory is not None and fitted.out_of_fold is not None
    assert fitted.out_of_fold() is None
    empty = fit_corrections(view, servers, [], [], rng)
    assert empty.memory is empty.adapter is empty.out_of_fold is None
