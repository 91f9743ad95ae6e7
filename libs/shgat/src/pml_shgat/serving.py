"""A trained SHGAT frozen for serving: keys precomputed, scoring is one product and a top-k.

`score = sigmoid(mean_h(Q_h·K_h)/√d_h)` with Q_h = W_q[h]·W_intent·intent and K_h = W_k[h]·E
(seed 000). With the heads stacked, the mean over heads is one dot product times 1/(K·√d_h),
so every candidate's score is a row of `keys @ query`. A `ServingModel` is immutable: a scorer
swaps whole models, never parts of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pml_shgat.forward import propagate
from pml_shgat.hierarchy import Hierarchy, normalise_rows
from pml_shgat.params import Params, ShgatConfig, ensure_levels

#: Score of a node the model does not know, and of an empty path (seed 000's cold start).
UNKNOWN_SCORE = 0.5


@dataclass(frozen=True)
class ScoredNode:
    id: str
    score: float
    level: int  # -1 for a tool


class ServingModel:
    def __init__(self, config: ShgatConfig, params: Params, hierarchy: Hierarchy) -> None:
        self.config = config
        self.hierarchy = hierarchy
        params = ensure_levels(params, config, hierarchy.num_levels)
        embeddings = propagate(params, hierarchy)
        scale = config.logit_scale
        # float32 halves the memory read per query, which is what bounds scoring at 100k nodes.
        self._keys = np.ascontiguousarray((embeddings @ params["W_k"].T).astype(np.float32))
        self._query = np.asarray(scale * params["W_q"] @ params["W_intent"], dtype=np.float32)
        self._levels = hierarchy.capability_levels

    @property
    def num_levels(self) -> int:
        return self.hierarchy.num_levels

    def logits(self, intent: NDArray[np.floating]) -> NDArray[np.float32]:
        """Logits of every node (tools, then capabilities) for one intent embedding."""
        vector = normalise_rows(np.asarray(intent, dtype=np.float64)[None, :])[0]
        if vector.shape[0] != self.config.dim:
            raise ValueError(
                f"intent embedding has {vector.shape[0]} values, the model expects "
                f"{self.config.dim}"
            )
        query = self._query @ vector.astype(np.float32)
        return np.asarray(self._keys @ query, dtype=np.float32)

    def score_capabilities(
        self, intent: NDArray[np.floating], top_k: int, level: int | None = None
    ) -> list[ScoredNode]:
        logits = self.logits(intent)[self.hierarchy.num_tools :]
        candidates = np.arange(len(logits))
        if level is not None:
            candidates = np.flatnonzero(self._levels == level)
        return self._top(logits, candidates, top_k, tools=False)

    def score_tools(self, intent: NDArray[np.floating], top_k: int) -> list[ScoredNode]:
        logits = self.logits(intent)[: self.hierarchy.num_tools]
        return self._top(logits, np.arange(len(logits)), top_k, tools=True)

    def top_by_level(self, intent: NDArray[np.floating], k: int) -> dict[int, list[ScoredNode]]:
        logits = self.logits(intent)[self.hierarchy.num_tools :]
        return {
            level: self._top(logits, np.flatnonzero(self._levels == level), k, tools=False)
            for level in range(self.num_levels)
        }

    def node_scores(self, intent: NDArray[np.floating], node_ids: Sequence[str]) -> list[float]:
        """Score of each named node; `UNKNOWN_SCORE` for ids the model does not know."""
        logits = self.logits(intent)
        scores = []
        for node_id in node_ids:
            index = self.hierarchy.node_index(node_id)
            scores.append(UNKNOWN_SCORE if index is None else float(_sigmoid(logits[index])))
        return scores

    def predict_path_success(self, intent: NDArray[np.floating], path: Sequence[str]) -> float:
        """Weighted mean of the path's node scores, later steps weighing more (1, 1.5, 2, …)."""
        if not path:
            return UNKNOWN_SCORE
        return path_success(self.node_scores(intent, path))

    def _top(
        self, logits: NDArray[np.float32], candidates: NDArray[np.int64], k: int, *, tools: bool
    ) -> list[ScoredNode]:
        if k <= 0 or not len(candidates):
            return []
        values = logits[candidates]
        whole = k >= len(values)
        part = np.arange(len(values)) if whole else np.argpartition(-values, k - 1)[:k]
        chosen = part[np.argsort(-values[part], kind="stable")]
        ids = self.hierarchy.tool_ids if tools else self.hierarchy.capability_ids
        return [
            ScoredNode(
                id=ids[candidates[i]],
                score=float(_sigmoid(values[i])),
                level=-1 if tools else int(self._levels[candidates[i]]),
            )
            for i in chosen
        ]


def path_success(node_scores: Sequence[float]) -> float:
    weights = 1.0 + 0.5 * np.arange(len(node_scores))
    return float(np.dot(weights, node_scores) / weights.sum())


def _sigmoid(x: NDArray[np.float32] | np.float32) -> NDArray[np.float64]:
    return np.asarray(1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64))))
