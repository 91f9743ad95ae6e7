"""The forward pass and its gradients, on a small hierarchy in float64."""

from __future__ import annotations

import numpy as np
from autograd import grad

from pml_shgat.forward import propagate
from pml_shgat.params import init_params, make_config
from pml_shgat.synthetic import synthetic_task
from pml_shgat.training import AUTOGRAD, loss, make_batch, path_examples


def _small() -> tuple:
    task = synthetic_task(tools=12, capabilities=6, meta_capabilities=2, dim=8, topics=3, seed=3)
    h = task.hierarchy()
    config = make_config(h.dim, 8, h.num_nodes)
    params = init_params(config, h.features, h.num_levels)
    rng = np.random.default_rng(1)
    # move away from the symmetric initialisation so that every term has a gradient
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    examples = [
        e
        for q in task.train[:5]
        for e in path_examples(h, q.intent, q.tools, 1.0, 0.7, q.capability)
    ]
    return h, config, params, make_batch(examples, h, rng, negatives=3)


def test_numpy_and_autograd_forward_agree() -> None:
    h, _, params, _ = _small()
    np.testing.assert_allclose(propagate(params, h), propagate(params, h, AUTOGRAD), atol=1e-12)


def test_message_passing_changes_nodes_in_the_hierarchy_only() -> None:
    h, _, params, _ = _small()
    out = propagate(params, h)
    members = {int(i) for level in h.levels for i in (*level.child, *level.parent)}
    for node in range(h.num_nodes):
        moved = not np.allclose(out[node], h.features[node])
        assert moved == (node in members)


def test_gradients_match_finite_differences() -> None:
    h, config, params, batch = _small()
    analytic = grad(loss)(params, h, config, batch)
    rng = np.random.default_rng(2)
    eps = 1e-6
    for name, value in params.items():
        for flat in rng.choice(value.size, size=min(4, value.size), replace=False):
            idx = np.unravel_index(flat, value.shape)
            plus = {**params, name: value.copy()}
            minus = {**params, name: value.copy()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            numeric = (loss(plus, h, config, batch) - loss(minus, h, config, batch)) / (2 * eps)
            assert abs(analytic[name][idx] - numeric) <= 1e-6 + 1e-4 * abs(numeric), (name, idx)
    # every parameter family takes part in the loss
    assert all(np.abs(g).max() > 0 for g in analytic.values())
