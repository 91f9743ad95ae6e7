"""Multi-level message passing, V → E⁰ → … → E^L upward then back down (seed 000).

Written once against a `Backend` (numpy for serving, autograd's numpy for training), so the
model that is served is exactly the model whose gradients were checked.

Upward, level k: every level-k capability c attends over its direct children j,
    z_j = W_child/k · h_j,   α_cj = softmax_j(LeakyReLU(a_up/k · [z_j ‖ W_child/k · h_c]))
    h_c ← h_c + ELU(Σ_j α_cj z_j)
Downward, level k from the top: every child j of a level-k capability attends over its parents,
    z_c = W_parent/k · h_c,  β_jc = softmax_c(LeakyReLU(a_down/k · [z_c ‖ W_parent/k · h_j]))
    h_j ← h_j + ELU(Σ_c β_jc z_c)
The residual keeps a node's own meaning; the result is L2-normalised before the key projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from pml_shgat.hierarchy import Hierarchy, LevelIncidence
from pml_shgat.params import level_slot

LEAKY_SLOPE = 0.2
Array = Any  # a numpy array, or an autograd box around one while training


class SegmentSum(Protocol):
    def __call__(self, values: Array, segments: Array, count: int) -> Array: ...


@dataclass(frozen=True)
class Backend:
    xp: ModuleType
    segment_sum: SegmentSum
    #: The plain value of an array (drops autograd's tracing), for constants such as maxima.
    value: Any


def numpy_segment_sum(values: Array, segments: Array, count: int) -> Array:
    out = np.zeros((count, *values.shape[1:]), dtype=values.dtype)
    np.add.at(out, segments, values)
    return out


NUMPY = Backend(xp=np, segment_sum=numpy_segment_sum, value=lambda a: a)


def propagate(params: dict[str, Array], hierarchy: Hierarchy, backend: Backend = NUMPY) -> Array:
    """Embeddings of all nodes after message passing, L2-normalised (tools, then capabilities)."""
    h: Array = hierarchy.features
    for k, incidence in enumerate(hierarchy.levels):
        p = level_slot(k)
        h = _upward(h, incidence, params[f"W_child/{p}"], params[f"a_up/{p}"], backend)
    for k in reversed(range(hierarchy.num_levels)):
        p = level_slot(k)
        incidence = hierarchy.levels[k]
        h = _downward(h, incidence, params[f"W_parent/{p}"], params[f"a_down/{p}"], backend)
    return _normalise(h, backend)


def _upward(h: Array, inc: LevelIncidence, w: Array, a: Array, b: Backend) -> Array:
    if not len(inc.child):
        return h
    dim = w.shape[0]
    z_children = h[inc.child] @ w.T
    z_parents = h[inc.parents] @ w.T
    logits = _leaky(z_children @ a[:dim] + (z_parents @ a[dim:])[inc.parent_slot], b)
    weights = _segment_softmax(logits, inc.parent_slot, len(inc.parents), b)
    message = b.segment_sum(weights[:, None] * z_children, inc.parent_slot, len(inc.parents))
    return h + b.segment_sum(_elu(message, b), inc.parents, len(h))


def _downward(h: Array, inc: LevelIncidence, w: Array, a: Array, b: Backend) -> Array:
    if not len(inc.child):
        return h
    dim = w.shape[0]
    z_parents = (h[inc.parents] @ w.T)[inc.parent_slot]
    z_children = h[inc.children] @ w.T
    logits = _leaky(z_parents @ a[:dim] + (z_children @ a[dim:])[inc.child_slot], b)
    weights = _segment_softmax(logits, inc.child_slot, len(inc.children), b)
    message = b.segment_sum(weights[:, None] * z_parents, inc.child_slot, len(inc.children))
    return h + b.segment_sum(_elu(message, b), inc.children, len(h))


def _segment_softmax(logits: Array, segments: Array, count: int, b: Backend) -> Array:
    # The per-segment maximum only stabilises exp(); it is a constant for the gradient.
    maxima = np.full(count, -np.inf)
    np.maximum.at(maxima, segments, b.value(logits))
    exp = b.xp.exp(logits - maxima[segments])
    return exp / b.segment_sum(exp, segments, count)[segments]


def _leaky(x: Array, b: Backend) -> Array:
    return b.xp.where(x > 0, x, LEAKY_SLOPE * x)


def _elu(x: Array, b: Backend) -> Array:
    return b.xp.where(x > 0, x, b.xp.exp(b.xp.minimum(x, 0.0)) - 1.0)


def _normalise(h: Array, b: Backend) -> Array:
    norms = b.xp.sqrt(b.xp.sum(h * h, axis=1, keepdims=True) + 1e-12)
    return h / norms
