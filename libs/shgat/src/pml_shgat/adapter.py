"""Query adapter: a linear map of the request's embedding, learned from what executions ran.

Agents phrase requests in their own words and servers describe tools in theirs; the first
stage's embedders were trained on neither. An adapter learns, per model of the tool embedder, a
map W of the request's embedding (close to the identity) under which the tools a tenant's
executions ran are the nearest of its whole catalog:

    minimise  mean over executions of −log softmax(cos(x W, tools) / TEMPERATURE)[executed]
              + RIDGE · ‖W − I‖²

The map acts on requests only, so it transfers to tools no execution ran and to workflows of a
new kind: what it learns is how this tenant's requests are worded against how its catalog is.
Served, the first stage is computed a second time with the mapped request embeddings, and the
difference to the plain first stage is a correction whose weight the gate chooses on held-back
executions (`pml_shgat.gating`): at weight 1 the adapted first stage replaces the plain one.

RIDGE and TEMPERATURE were chosen on the development sets' folds (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

#: Pull of each map toward the identity.
RIDGE = 0.003
#: Temperature of the softmax over the catalog's cosines.
TEMPERATURE = 0.02
#: L-BFGS iterations of one map.
MAX_ITERATIONS = 200
#: Tools a fit reads the softmax over (the executed ones and a sample of the others): bounds a
#: fit's cost on a large catalog.
MAX_TOOLS = 4096
_PREFIX = "adapter/"

FloatArray = NDArray[np.floating]


@dataclass(frozen=True)
class QueryAdapter:
    """One map per model of the tool embedder (`parts`: each model's width in its vectors)."""

    maps: tuple[NDArray[np.float32], ...]
    parts: tuple[int, ...]

    def adapt(self, vectors: FloatArray) -> NDArray[np.float32]:
        """Request embeddings (rows, each model's unit vector scaled by 1/√k side by side, as
        the tool embedder gives them) mapped, in the same layout."""
        rows = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        out = np.empty_like(rows)
        for (start, width), matrix in zip(_spans(self.parts), self.maps, strict=True):
            mapped = _unit(rows[:, start : start + width]) @ matrix
            out[:, start : start + width] = _unit(mapped) / np.float32(np.sqrt(len(self.parts)))
        return out

    @property
    def rows(self) -> int:
        """Rows of its maps, each an embedding-sized vector (what caches weigh it by)."""
        return sum(self.parts)

    def to_arrays(self) -> dict[str, NDArray[np.generic]]:
        """The maps as named arrays, stored beside the model's parameters (W − I in float16:
        the maps stay close to the identity, and a version's bytes stay small)."""
        arrays: dict[str, NDArray[np.generic]] = {
            f"{_PREFIX}parts": np.asarray(self.parts, dtype=np.int64)
        }
        for i, matrix in enumerate(self.maps):
            arrays[f"{_PREFIX}{i}"] = (matrix - np.eye(len(matrix), dtype=np.float32)).astype(
                np.float16
            )
        return arrays

    @staticmethod
    def from_arrays(arrays: Mapping[str, NDArray[np.generic]]) -> QueryAdapter | None:
        """The adapter stored in `arrays`; None when they hold none."""
        if f"{_PREFIX}parts" not in arrays:
            return None
        parts = tuple(int(p) for p in np.asarray(arrays[f"{_PREFIX}parts"]))
        maps = []
        for i, width in enumerate(parts):
            delta = np.asarray(arrays.get(f"{_PREFIX}{i}", np.empty(0)), dtype=np.float32)
            if delta.shape != (width, width):
                raise ValueError("stored query adapter is inconsistent")
            maps.append(delta + np.eye(width, dtype=np.float32))
        return QueryAdapter(tuple(maps), parts)


def is_adapter_array(name: str) -> bool:
    return name.startswith(_PREFIX)


def fit(
    intents: FloatArray,
    tool_sets: Sequence[Sequence[int]],
    catalog: FloatArray,
    parts: Sequence[int],
    rng: np.random.Generator,
) -> QueryAdapter | None:
    """The adapter of executions (`intents`: their request embeddings by the tool embedder,
    `tool_sets`: the catalog rows each ran) over `catalog` (the tools' embeddings by the same
    embedder, `parts` its models' widths). None when no execution ran a catalog tool."""
    kept = [i for i, tools in enumerate(tool_sets) if len(tools)]
    if not kept or not len(catalog) or not parts:
        return None
    columns = _columns(tool_sets, kept, len(catalog), rng)
    position = {int(c): j for j, c in enumerate(columns)}
    targets = np.zeros((len(kept), len(columns)))
    for row, i in enumerate(kept):
        hit = [position[int(t)] for t in dict.fromkeys(tool_sets[i])]
        targets[row, hit] = 1.0 / len(hit)
    queries = np.asarray(intents, dtype=np.float64)[kept]
    tools = np.asarray(catalog, dtype=np.float64)[columns]
    maps = tuple(
        _fit_map(
            _unit(queries[:, start : start + width]),
            _unit(tools[:, start : start + width]),
            targets,
        )
        for start, width in _spans(parts)
    )
    return QueryAdapter(maps, tuple(parts))


def _columns(
    tool_sets: Sequence[Sequence[int]], kept: Sequence[int], size: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """The catalog rows a fit reads: all of them up to `MAX_TOOLS`, else the executed ones and
    a uniform sample of the others."""
    if size <= MAX_TOOLS:
        return np.arange(size)
    executed = np.unique(np.concatenate([np.asarray(tool_sets[i], np.int64) for i in kept]))
    others = np.setdiff1d(np.arange(size), executed)
    room = max(MAX_TOOLS - len(executed), 0)
    sample = rng.choice(others, size=min(room, len(others)), replace=False)
    return np.sort(np.concatenate([executed, sample])).astype(np.int64)


def _fit_map(x: FloatArray, tools: FloatArray, targets: FloatArray) -> NDArray[np.float32]:
    """The map minimising the module's objective for requests `x` over `tools`.

    The loss reads W only through x W toolsᵀ, and the pull is toward I, so the minimiser is
    I + Qx M Qtᵀ, where Qx and Qt are orthonormal bases of the requests' and the tools' spans
    (every gradient lies in that subspace, so L-BFGS started at I never leaves it). M is fitted
    instead of W: the same map, with (requests × tools) unknowns in place of width² when a
    tenant has fewer executions or tools than the embedding has dimensions.
    """
    width = x.shape[1]
    qx = np.linalg.qr(x.T)[0]
    qt = np.linalg.qr(tools.T)[0]
    # float32 products: half the time of float64, and far finer than the cosines they read
    a, b = (x @ qx).astype(np.float32), (tools @ qt).astype(np.float32)
    base = (x @ tools.T / TEMPERATURE).astype(np.float32)
    goal = np.asarray(targets, dtype=np.float32)
    shape = (qx.shape[1], qt.shape[1])

    def loss(flat: FloatArray) -> tuple[float, FloatArray]:
        m = flat.reshape(shape).astype(np.float32)
        logits = base + (a @ m) @ b.T / np.float32(TEMPERATURE)
        logits -= logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        # the value summed in float64: L-BFGS's line search compares values this close
        value = -np.sum(goal * log_p, dtype=np.float64) / len(x) + RIDGE * np.sum(
            m**2, dtype=np.float64
        )
        residual = (np.exp(log_p) - goal) / np.float32(len(x) * TEMPERATURE)
        grad = a.T @ (residual @ b) + 2 * RIDGE * m
        return float(value), grad.ravel().astype(np.float64)

    result = optimize.minimize(
        loss,
        np.zeros(shape[0] * shape[1]),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": MAX_ITERATIONS},
    )
    delta = qx @ result.x.reshape(shape) @ qt.T
    return np.asarray(np.eye(width) + delta, dtype=np.float32)


def _spans(widths: Sequence[int]) -> list[tuple[int, int]]:
    """(start, width) of each model's slice (the layout of `pml_common.first_stage`)."""
    starts = [0, *itertools.accumulate(widths)][: len(widths)]
    return list(zip(starts, widths, strict=True))


def _unit(rows: FloatArray) -> NDArray[np.float32]:
    array = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return np.asarray(array / np.maximum(norms, 1e-12), dtype=np.float32)
