"""Training SHGAT by backpropagation through the whole hierarchy (autograd over numpy).

One example per node of an executed path (seed 000, story 11.6): the intent should score that
node at the run's outcome (1 success, 0 failure). Each example also draws negatives of the same
kind (tools for a tool, capabilities for a capability) that the intent should score low, which
is what teaches ranking. Examples carry the importance weight of the trace they come from (PER).

Every step also pulls each parameter a fraction `ANCHOR_PULL` of the way back to the untrained
model's (`untrained_like`: `init_params` of the current hierarchy, the ranking the first stage
and the hierarchy give without learning). The trainer replays a small buffer round after round,
each round continuing from the serving model; trained further on the same executions, the model
recalled them better and ranked new requests worse (docs/benchmarks.md). The trainer ties a
round's steps to the executions it adds (`pml_trainer.learning`), and the pull holds each
parameter within about `learning_rate / ANCHOR_PULL` of its untrained value, however many
rounds run. What a round publishes is the mean of its last iterates (`IterateMean`,
`averaged_steps`), not its final one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field

import autograd.numpy as anp
import numpy as np
from autograd import value_and_grad
from autograd.extend import defvjp, primitive
from autograd.tracer import getval
from numpy.typing import NDArray

from pml_shgat.forward import Array, Backend, numpy_segment_sum, propagate
from pml_shgat.hierarchy import Hierarchy, normalise_rows
from pml_shgat.params import Params, ShgatConfig, ensure_levels, untrained_like

NEGATIVES_PER_EXAMPLE = 8
#: Fraction of the way back to the untrained parameters each step moves every parameter
#: (decoupled from the gradient, as AdamW's weight decay, but toward the untrained model, not 0).
ANCHOR_PULL = 0.01
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
#: Gradients are clipped to this global norm: a rare huge TD error must not wreck the model.
MAX_GRAD_NORM = 5.0


@primitive  # type: ignore[untyped-decorator]
def _segment_sum(values: Array, segments: Array, count: int) -> Array:
    return numpy_segment_sum(values, segments, count)


defvjp(_segment_sum, lambda _ans, _values, segments, _count: lambda g: g[segments])

AUTOGRAD = Backend(xp=anp, segment_sum=_segment_sum, value=getval)


@dataclass(frozen=True)
class Example:
    intent: NDArray[np.floating]
    node: int
    label: float
    weight: float = 1.0


@dataclass(frozen=True)
class Batch:
    intents: NDArray[np.float64]  # (B, d), L2-normalised
    nodes: NDArray[np.int64]  # (B,)
    labels: NDArray[np.float64]  # (B,)
    weights: NDArray[np.float64]  # (B,)
    negatives: NDArray[np.int64]  # (B, n)
    negative_mask: NDArray[np.float64]  # (B, n): 0 where a negative drew the positive


@dataclass(frozen=True)
class StepStats:
    loss: float
    grad_norm: float


def path_examples(
    hierarchy: Hierarchy,
    intent: NDArray[np.floating],
    path: Sequence[str],
    outcome: float,
    weight: float = 1.0,
    capability_id: str | None = None,
) -> list[Example]:
    """One example per known node of the path, plus the capability the run executed."""
    ids = list(dict.fromkeys([*path, *([capability_id] if capability_id else [])]))
    nodes = [hierarchy.node_index(node_id) for node_id in ids]
    return [Example(intent, n, outcome, weight) for n in nodes if n is not None]


def make_batch(
    examples: Sequence[Example],
    hierarchy: Hierarchy,
    rng: np.random.Generator,
    negatives: int = NEGATIVES_PER_EXAMPLE,
) -> Batch:
    nodes = np.asarray([e.node for e in examples], dtype=np.int64)
    is_tool = nodes < hierarchy.num_tools
    n_tools, n_caps = hierarchy.num_tools, hierarchy.num_capabilities
    draws = rng.random((len(nodes), negatives))
    sampled = np.where(
        is_tool[:, None],
        (draws * max(n_tools, 1)).astype(np.int64),
        n_tools + (draws * max(n_caps, 1)).astype(np.int64),
    )
    return Batch(
        intents=normalise_rows(np.asarray([e.intent for e in examples], dtype=np.float64)),
        nodes=nodes,
        labels=np.asarray([e.label for e in examples], dtype=np.float64),
        weights=np.asarray([e.weight for e in examples], dtype=np.float64),
        negatives=sampled,
        negative_mask=(sampled != nodes[:, None]).astype(np.float64),
    )


def loss(
    params: dict[str, Array], hierarchy: Hierarchy, config: ShgatConfig, batch: Batch
) -> Array:
    """Importance-weighted binary cross-entropy of positives (at their label) and negatives (0)."""
    embeddings = propagate(params, hierarchy, AUTOGRAD)
    queries = config.logit_scale * ((batch.intents @ params["W_intent"].T) @ params["W_q"].T)
    positive_keys = embeddings[batch.nodes] @ params["W_k"].T
    negative_keys = embeddings[batch.negatives] @ params["W_k"].T
    positive = anp.sum(queries * positive_keys, axis=1)
    negative = anp.einsum("bk,bnk->bn", queries, negative_keys)
    positive_loss = _bce(positive, batch.labels)
    mask = batch.negative_mask
    negative_loss = anp.sum(_bce(negative, 0.0) * mask, axis=1) / np.maximum(mask.sum(1), 1.0)
    weights = batch.weights
    return anp.sum(weights * (positive_loss + negative_loss)) / max(float(weights.sum()), 1e-12)


def _bce(logits: Array, labels: Array) -> Array:
    return anp.logaddexp(0.0, logits) - labels * logits


#: Share of a round's last steps whose parameters are averaged into the round's result
#: (`IterateMean`).
AVERAGED_SHARE = 0.5


def averaged_steps(steps: int) -> int:
    """How many of a round's last `steps` are averaged (at least the last one)."""
    return max(1, math.ceil(AVERAGED_SHARE * steps))


@dataclass
class IterateMean:
    """The running mean of the parameters after several steps (stochastic weight averaging,
    Izmailov et al. 2018). A few dozen Adam steps on a few hundred executions end at a noisy
    point of a wide basin; the mean of the last iterates lies nearer its middle, and ranks
    requests it did not train on better (docs/benchmarks.md)."""

    count: int = 0
    mean: Params = field(default_factory=dict)

    def add(self, params: Params) -> None:
        self.count += 1
        if self.count == 1:
            self.mean = {name: np.array(value, dtype=np.float64) for name, value in params.items()}
            return
        for name, value in params.items():
            self.mean[name] += (np.asarray(value) - self.mean[name]) / self.count


@dataclass
class ShgatTrainer:
    """Adam over every parameter; `params` is a fresh dict after each step (never mutated)."""

    config: ShgatConfig
    params: Params
    hierarchy: Hierarchy
    learning_rate: float = 0.003
    anchor_pull: float = ANCHOR_PULL
    _moments: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]] = field(
        default_factory=dict
    )
    _steps: int = 0
    #: The untrained parameters pulled toward (`untrained_like` of `params` when not given): a
    #: caller that has just built `params` with `init_params` passes them, as they are those,
    #: and the basis is not computed twice (a d × d Gram matrix over every node).
    anchor: InitVar[Params | None] = None
    _anchor: Params = field(default_factory=dict)

    def __post_init__(self, anchor: Params | None) -> None:
        if not 0.0 <= self.anchor_pull < 1.0:
            raise ValueError("anchor_pull must be in [0, 1)")
        levels = self.hierarchy.num_levels
        self.params = ensure_levels(self.params, self.config, levels)
        if self.anchor_pull:
            self._anchor = (
                ensure_levels(anchor, self.config, levels)
                if anchor is not None
                else untrained_like(self.config, self.hierarchy.features, self.params)
            )

    def step(self, batch: Batch) -> StepStats:
        value, grads = value_and_grad(loss)(self.params, self.hierarchy, self.config, batch)
        norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
        clip = min(1.0, MAX_GRAD_NORM / max(norm, 1e-12))
        self._steps += 1
        self.params = {
            name: self._adam(name, value_, clip * grads[name])
            for name, value_ in self.params.items()
        }
        return StepStats(loss=float(value), grad_norm=norm)

    def _adam(
        self, name: str, value: NDArray[np.float64], grad: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        b1, b2 = ADAM_BETAS
        m, v = self._moments.get(name, (np.zeros_like(value), np.zeros_like(value)))
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        self._moments[name] = (m, v)
        m_hat = m / (1 - b1**self._steps)
        v_hat = v / (1 - b2**self._steps)
        stepped = value - self.learning_rate * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
        if self.anchor_pull:
            stepped -= self.anchor_pull * (stepped - self._anchor[name])
        return np.asarray(stepped)
