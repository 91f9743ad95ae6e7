"""`pml eval synthetic`: SHGAT against cosine on a synthetic two-level hierarchy, K-fold.

The hierarchy and intents come from `pml_shgat.synthetic` (tools in topics, capabilities over
2–4 tools, meta-capabilities over two capabilities, intents phrased "in other words"). Queries
of every capability are split into K folds; for each fold the model is trained in-process with
the trainer's own step (`ShgatTrainer`, one example per path node plus the capability, uniform
batches of 32) on the other folds, and both methods rank tools for the held-out intents.
Cosine ranks tools by the similarity of intent and tool embeddings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from pml_cli.eval_folds import fold_split
from pml_cli.metrics import ToolMetrics
from pml_shgat.params import init_params, make_config
from pml_shgat.serving import ServingModel
from pml_shgat.synthetic import SyntheticQuery, synthetic_task
from pml_shgat.training import ShgatTrainer, make_batch, path_examples

BATCH = 32
TOP_K = 10


def evaluate_synthetic(
    folds: int, steps: int, seed: int, key_dim: int, console: Console
) -> dict[str, Any]:
    task = synthetic_task(
        tools=200,
        capabilities=80,
        meta_capabilities=20,
        dim=64,
        topics=16,
        train_per_capability=5,
        test_per_capability=0,
        seed=seed,
    )
    hierarchy = task.hierarchy()
    queries = task.train
    metrics = {"cosine": ToolMetrics(), "shgat": ToolMetrics()}
    rng = np.random.default_rng(seed)
    tools = hierarchy.features[: hierarchy.num_tools]
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("folds", total=folds * steps)
        for test_rows in fold_split(len(queries), folds, seed):
            held_out = set(test_rows.tolist())
            train = [q for i, q in enumerate(queries) if i not in held_out]
            config = make_config(hierarchy.dim, key_dim, hierarchy.num_nodes)
            params = init_params(config, hierarchy.features, hierarchy.num_levels)
            trainer = ShgatTrainer(config, params, hierarchy)
            for _ in range(steps):
                picked = [train[i] for i in rng.integers(0, len(train), BATCH)]
                trainer.step(make_batch(_examples(hierarchy, picked), hierarchy, rng))
                progress.advance(bar)
            model = ServingModel(config, trainer.params, hierarchy)
            for i in held_out:
                query = queries[i]
                by_cosine = np.argsort(-(tools @ query.intent))[:TOP_K]
                metrics["cosine"].add([hierarchy.tool_ids[j] for j in by_cosine], query.tools)
                ranked = [s.id for s in model.score_tools(query.intent, TOP_K)]
                metrics["shgat"].add(ranked, query.tools)
    return {
        "data": "synthetic",
        "folds": folds,
        "steps": steps,
        "tools": hierarchy.num_tools,
        "capabilities": hierarchy.num_capabilities,
        "levels": hierarchy.num_levels,
        **{name: m.result() for name, m in metrics.items()},
    }


def _examples(hierarchy: Any, picked: list[SyntheticQuery]) -> list[Any]:
    return [
        e
        for q in picked
        for e in path_examples(hierarchy, q.intent, q.tools, 1.0, 1.0, q.capability)
    ]
