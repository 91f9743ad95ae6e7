from __future__ import annotations

import numpy as np
import pytest

from pml_shgat.forward import propagate
from pml_shgat.hierarchy import CapabilityInput, Hierarchy
from pml_shgat.params import (
    ShgatConfig,
    from_bytes,
    heads_for,
    init_params,
    make_config,
    num_levels,
    to_bytes,
)
from pml_shgat.serving import UNKNOWN_SCORE, ServingModel, path_success
from pml_shgat.synthetic import synthetic_task


def _model(seed: int = 0) -> tuple[ServingModel, dict, ShgatConfig]:
    task = synthetic_task(tools=30, capabilities=12, meta_capabilities=3, dim=16, seed=seed)
    h = task.hierarchy()
    config = make_config(h.dim, 16, h.num_nodes)
    params = init_params(config, h.features, h.num_levels)
    return ServingModel(config, params, h), params, config


def test_scores_are_the_k_head_formula_on_propagated_embeddings() -> None:
    model, params, config = _model()
    h = model.hierarchy
    intent = np.random.default_rng(5).standard_normal(h.dim)
    u = intent / np.linalg.norm(intent)
    e = propagate(params, h)
    q = params["W_q"] @ params["W_intent"] @ u
    k = e @ params["W_k"].T
    d_h = config.head_dim
    heads = [
        q[i * d_h : (i + 1) * d_h] @ k[:, i * d_h : (i + 1) * d_h].T / np.sqrt(d_h)
        for i in range(config.heads)
    ]
    expected = 1 / (1 + np.exp(-np.mean(heads, axis=0)))
    top = model.score_capabilities(intent, top_k=h.num_capabilities)
    got = {s.id: s.score for s in top}
    for i, cid in enumerate(h.capability_ids):
        assert got[cid] == pytest.approx(expected[h.num_tools + i], rel=1e-4)
    assert [s.score for s in top] == sorted((s.score for s in top), reverse=True)


def test_level_filter_and_top_by_level() -> None:
    model, _, _ = _model()
    intent = np.ones(model.hierarchy.dim)
    ones = model.score_capabilities(intent, top_k=50, level=1)
    assert ones and all(s.level == 1 for s in ones)
    by_level = model.top_by_level(intent, k=2)
    assert sorted(by_level) == [0, 1]
    assert all(len(v) == 2 for v in by_level.values())
    tools = model.score_tools(intent, top_k=3)
    assert len(tools) == 3 and all(s.level == -1 for s in tools)


def test_predict_path_success_weighs_later_steps_more() -> None:
    model, _, _ = _model()
    intent = np.ones(model.hierarchy.dim)
    assert model.predict_path_success(intent, []) == UNKNOWN_SCORE
    a, b = model.hierarchy.tool_ids[:2]
    sa, sb = model.node_scores(intent, [a, b])
    assert model.predict_path_success(intent, [a, b]) == pytest.approx((sa + 1.5 * sb) / 2.5)
    assert model.node_scores(intent, ["nobody"]) == [UNKNOWN_SCORE]
    assert path_success([1.0, 0.0, 0.0]) == pytest.approx(1 / 4.5)


def test_wrong_intent_size_is_refused() -> None:
    model, _, _ = _model()
    with pytest.raises(ValueError, match="expects 16"):
        model.score_tools(np.ones(5), 3)


def test_bytes_round_trip_and_new_levels_start_from_the_initial_values() -> None:
    _, params, config = _model()
    config2, params2 = from_bytes(to_bytes(config, params))
    assert config2 == config
    assert params2.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(params2[name], params[name])
    deeper = Hierarchy.build(
        {"s:a": np.ones(16)},
        [
            CapabilityInput("c0", None, tools=["s:a"]),
            CapabilityInput("c1", None, capabilities=["c0"]),
            CapabilityInput("c2", None, capabilities=["c1"]),
        ],
    )
    assert num_levels(params) == 2
    served = ServingModel(config, params, deeper)  # a third level the model was not trained on
    assert served.num_levels == 3


def test_damaged_blob_is_refused() -> None:
    _, params, config = _model()
    broken = dict(params)
    broken["W_q"] = broken["W_q"][:3]
    with pytest.raises(ValueError, match="W_q"):
        from_bytes(to_bytes(config, broken))


def test_heads_grow_with_the_graph() -> None:
    assert [heads_for(n) for n in (10, 1000, 100_000)] == [4, 8, 16]
    assert make_config(512, 128, 100_000).head_dim == 8
