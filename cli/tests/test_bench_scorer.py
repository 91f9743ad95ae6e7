"""`pml bench scorer`'s serving part on a small hierarchy: both calls are measured, on a
version carrying the execution memory the bench builds."""

import asyncio
import io

import numpy as np
from rich.console import Console

from pml_cli.bench_scorer import (
    _first_stage_cost,
    _gate_cost,
    _grpc_latencies,
    _synthetic_hierarchy,
    _synthetic_memory,
)
from pml_common.embedding import build_embedder
from pml_common.settings import Settings
from pml_shgat.hierarchy import normalise_rows
from pml_shgat.params import init_params, make_config
from pml_shgat.serving import ServingModel


def test_score_capabilities_and_score_tools_are_both_measured() -> None:
    rng = np.random.default_rng(0)
    settings = Settings()
    embedder = build_embedder(settings, None)
    hierarchy = _synthetic_hierarchy(40, 100, embedder.dim, rng)
    config = make_config(embedder.dim, 16, hierarchy.num_nodes)
    model = ServingModel(config, init_params(config, hierarchy.features, 2), hierarchy)
    memory = _synthetic_memory(hierarchy, 30, rng)
    assert len(memory.memory) == 30 and memory.memory.num_tools == hierarchy.num_tools
    intents = normalise_rows(rng.standard_normal((4, embedder.dim)))
    capabilities, tools = asyncio.run(
        _grpc_latencies(settings, model, memory, embedder, intents, 5, Console(file=io.StringIO()))
    )
    assert len(capabilities) == len(tools) == 5
    assert all(t > 0 for t in capabilities + tools)


def test_first_stage_is_measured_plain_and_adapted() -> None:
    figures = _first_stage_cost(300, 20, np.random.default_rng(0), Console(file=io.StringIO()))
    assert figures["first_stage_tools"] == 300 and figures["adapter_executions"] == 20
    assert figures["first_stage_p50_ms"] > 0 and figures["adapted_first_stage_p50_ms"] > 0
    assert figures["adapter_fit_s"] > 0


def test_the_gate_is_measured_on_a_candidate_it_admits() -> None:
    figures = _gate_cost(300, 40, np.random.default_rng(0), Console(file=io.StringIO()))
    assert figures["gate_executions"] == 40 and figures["gate_judge_s"] >= 0
    # the candidate lifts half the executions' tools: the branch that reads the cross-fit
    assert figures["gate_admitted"] is True
