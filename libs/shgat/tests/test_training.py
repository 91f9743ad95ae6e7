"""Learning on a synthetic hierarchy: training must beat the untrained model on held-out intents."""

from __future__ import annotations

import numpy as np

from pml_shgat.params import Params, init_params, make_config
from pml_shgat.serving import ServingModel
from pml_shgat.synthetic import SyntheticQuery, SyntheticTask, synthetic_task
from pml_shgat.training import (
    ANCHOR_PULL,
    IterateMean,
    ShgatTrainer,
    averaged_steps,
    make_batch,
    path_examples,
)


def _recall_at_5(model: ServingModel, queries: list[SyntheticQuery]) -> float:
    hits = [
        len({s.id for s in model.score_tools(q.intent, 5)} & set(q.tools)) / len(q.tools)
        for q in queries
    ]
    return float(np.mean(hits))


def _train(task: SyntheticTask, steps: int) -> tuple[float, float]:
    h = task.hierarchy()
    config = make_config(h.dim, 32, h.num_nodes)
    trainer = ShgatTrainer(config, init_params(config, h.features, h.num_levels), h)
    before = _recall_at_5(ServingModel(config, trainer.params, h), task.test)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        picked = [task.train[i] for i in rng.integers(0, len(task.train), 32)]
        examples = [
            e for q in picked for e in path_examples(h, q.intent, q.tools, 1.0, 1.0, q.capability)
        ]
        trainer.step(make_batch(examples, h, rng))
    return before, _recall_at_5(ServingModel(config, trainer.params, h), task.test)


def test_training_beats_the_untrained_model_on_held_out_intents() -> None:
    before, after = _train(synthetic_task(seed=1), steps=150)
    assert after >= before + 0.05, (before, after)


def test_failures_lower_the_score_of_the_failed_path() -> None:
    task = synthetic_task(tools=20, capabilities=8, meta_capabilities=0, dim=16, seed=2)
    h = task.hierarchy()
    config = make_config(h.dim, 16, h.num_nodes)
    trainer = ShgatTrainer(config, init_params(config, h.features, h.num_levels), h)
    query = task.train[0]
    model = ServingModel(config, trainer.params, h)
    before = model.predict_path_success(query.intent, query.tools)
    rng = np.random.default_rng(0)
    for _ in range(40):
        examples = path_examples(h, query.intent, query.tools, 0.0, 1.0, query.capability)
        trainer.step(make_batch(examples, h, rng))
    after = ServingModel(config, trainer.params, h).predict_path_success(query.intent, query.tools)
    assert after < before - 0.1, (before, after)


def _replayed(flip: bool, anchor_pull: float, steps: int) -> tuple[Params, Params]:
    """A model trained on one execution replayed `steps` times, from the untrained parameters
    (with their key rows the other way round if `flip`), and those starting parameters."""
    task = synthetic_task(tools=20, capabilities=8, meta_capabilities=0, dim=16, seed=3)
    h = task.hierarchy()
    config = make_config(h.dim, 16, h.num_nodes)
    start = init_params(config, h.features, h.num_levels)
    if flip:
        start = {**start, "W_q": -start["W_q"], "W_k": -start["W_k"]}
    trainer = ShgatTrainer(config, start, h, anchor_pull=anchor_pull)
    query, rng = task.train[0], np.random.default_rng(0)
    for _ in range(steps):
        examples = path_examples(h, query.intent, query.tools, 1.0, 1.0, query.capability)
        trainer.step(make_batch(examples, h, rng))
    return trainer.params, start


def _distance_from_untrained(anchor_pull: float, steps: int) -> float:
    """How far training on one execution, replayed `steps` times, moves the parameters."""
    trained, untrained = _replayed(False, anchor_pull, steps)
    return float(np.sqrt(sum(np.sum((trained[k] - untrained[k]) ** 2) for k in untrained)))


def test_the_anchor_pull_keeps_a_replayed_model_nearer_the_untrained_one() -> None:
    free = [_distance_from_untrained(0.0, n) for n in (100, 400)]
    pulled = [_distance_from_untrained(0.01, n) for n in (100, 400)]
    assert pulled[1] < 0.75 * free[1], (pulled, free)
    # and the 300 more replays move it less (deterministic: seeded draws)
    assert pulled[1] - pulled[0] < 0.6 * (free[1] - free[0]), (pulled, free)


def test_the_anchor_keeps_the_sign_a_model_started_from() -> None:
    """A model whose key directions started the other way round is not pulled through zero."""
    trained, flipped = _replayed(True, ANCHOR_PULL, 100)
    for name in ("W_q", "W_k"):
        along = np.sum(trained[name] * flipped[name], axis=1)
        assert np.all(along > 0), (name, along)


def test_a_new_model_given_as_its_own_anchor_trains_as_one_whose_anchor_is_computed() -> None:
    task = synthetic_task(tools=20, capabilities=8, meta_capabilities=0, dim=16, seed=4)
    h = task.hierarchy()
    config = make_config(h.dim, 16, h.num_nodes)
    start = init_params(config, h.features, h.num_levels)

    def trained(anchor: Params | None) -> Params:
        trainer = ShgatTrainer(config, start, h, anchor_pull=0.05, anchor=anchor)
        query, rng = task.train[0], np.random.default_rng(0)
        for _ in range(20):
            examples = path_examples(h, query.intent, query.tools, 1.0, 1.0, query.capability)
            trainer.step(make_batch(examples, h, rng))
        return trainer.params

    computed, given = trained(None), trained(start)
    for name in start:
        np.testing.assert_allclose(given[name], computed[name], rtol=0, atol=1e-12)
    # an anchor elsewhere pulls elsewhere: the comparison above can tell anchors apart
    elsewhere = trained({k: v * 0.5 for k, v in start.items()})
    assert not np.allclose(elsewhere["W_intent"], computed["W_intent"])


def test_the_iterate_mean_is_the_mean_of_the_parameters_added() -> None:
    sets = [{"W": np.full((2, 2), float(i)), "a": np.arange(3.0) * i} for i in (1, 2, 6)]
    mean = IterateMean()
    for params in sets:
        mean.add(params)
    assert mean.count == 3
    np.testing.assert_allclose(mean.mean["W"], np.full((2, 2), 3.0))
    np.testing.assert_allclose(mean.mean["a"], np.arange(3.0) * 3.0)
    assert sets[0]["W"][0, 0] == 1.0  # the parameters added are not changed


def test_a_round_averages_its_last_half_and_at_least_one_step() -> None:
    assert [averaged_steps(n) for n in (1, 2, 3, 30)] == [1, 1, 2, 15]
