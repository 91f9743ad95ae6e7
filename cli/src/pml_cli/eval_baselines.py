"""Supervised baselines: the simplest use of the data the learned methods learn from.

They are computed in the command's process from the *training* folds only, with the tools a
training query ran (`steps_of`: its `sequence`, else `relevant`), exactly what the trainer is
taught. Intents are compared by the cosine of their embeddings from the system's own embedder
(`build_embedder(settings)`, query encoding for both sides; vectors are L2-normalised, so the
cosine is a dot product).

- `popular` (tools): every tool ranked by the number of training queries that ran it, most
  first; ties by tool id.
- `knn` (tools): the k = 10 training intents most similar to the test intent are its
  neighbours; a tool's score is the sum of the similarities of the neighbours that ran it
  (a similarity below 0 counts as 0). Tools are ranked by score, then by popularity as above
  (so the tools no neighbour ran follow, most popular first).
- `knn` (plans): the nearest training intent's step sequence S. Next step after a context:
  the element of S after the context's last tool when that tool is in S and not last, else
  S's first element; the other candidates follow: the rest of S in order, without the tools
  already in the context. The DAG is S as a chain.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from itertools import islice

import numpy as np

from pml_cli.eval_data import ToolQuery
from pml_cli.eval_split import steps_of
from pml_common.embedding import build_embedder
from pml_common.settings import Settings

BASELINES = ("knn", "popular")
KNN_K = 10


def embed_intents(settings: Settings, texts: Sequence[str]) -> np.ndarray:
    """(len(texts), dim) normalised vectors of the intents, by the system's embedder."""
    embedder = build_embedder(settings, None)
    return asyncio.run(embedder.embed_queries(list(texts)))


def popularity(train: Sequence[ToolQuery]) -> Counter[str]:
    """Tool → how many training queries ran it."""
    return Counter(tool for q in train for tool in steps_of(q))


def by_popularity(counts: Counter[str]) -> list[str]:
    """Tools by count, most first; ties by id."""
    return sorted(counts, key=lambda tool: (-counts[tool], tool))


class ToolKnn:
    """The `knn` tool ranking of the module docstring over one fold's training queries."""

    def __init__(self, train: Sequence[ToolQuery], vectors: np.ndarray, k: int = KNN_K) -> None:
        if len(train) != len(vectors):
            raise ValueError("one vector per training query")
        self._steps = [steps_of(q) for q in train]
        self._vectors = vectors
        self._k = k
        self._popular = by_popularity(popularity(train))
        self._rank_of = {tool: i for i, tool in enumerate(self._popular)}

    def rank(self, vector: np.ndarray, top_k: int) -> list[str]:
        similarity = self._vectors @ vector
        neighbours = np.argsort(-similarity, kind="stable")[: self._k]
        scores: dict[str, float] = {}
        for row in neighbours:
            for tool in self._steps[row]:
                scores[tool] = scores.get(tool, 0.0) + max(float(similarity[row]), 0.0)
        ranked = sorted(scores, key=lambda t: (-scores[t], self._rank_of[t]))
        rest = (t for t in self._popular if t not in scores)
        return (ranked + list(islice(rest, top_k)))[:top_k]


class PlanKnn:
    """The `knn` plan of the module docstring over one fold's training queries."""

    def __init__(self, train: Sequence[ToolQuery], vectors: np.ndarray) -> None:
        if len(train) != len(vectors) or not len(train):
            raise ValueError("one vector per training query, and at least one")
        self._steps = [steps_of(q) for q in train]
        self._vectors = vectors

    def nearest(self, vector: np.ndarray) -> list[str]:
        """The step sequence of the most similar training intent (the first on a tie)."""
        return self._steps[int(np.argmax(self._vectors @ vector))]


def next_candidates(sequence: Sequence[str], context: Sequence[str]) -> list[str]:
    """Ranked next steps from `sequence` after `context` (see the module docstring)."""
    if not sequence:
        return []
    last = context[-1] if context else None
    position = sequence.index(last) if last in sequence else -1
    first = sequence[position + 1] if 0 <= position < len(sequence) - 1 else sequence[0]
    done = set(context) | {first}
    return [first, *(t for t in sequence if t not in done)]
