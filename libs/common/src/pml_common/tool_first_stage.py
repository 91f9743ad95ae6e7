"""A tenant's untrained first stage over its tool graph, as the scorer serves it and the
trainer's gate compares with: the same hybrid relevance as search's `Search`
(`pml_common.first_stage`: BM25 over name, server, description and input-schema fields, the
tool embedder's cosines, fused, and a chained request's sub-goals blended in).

The dense side reads the tools' embeddings by the tool embedder (`ToolGraph.catalog_vectors`,
from the shared embedding cache, so the vectors search stored are reused). An intent given as
an embedding alone (no text) can only be compared with the tools' embeddings in SHGAT's space:
the first stage is then that cosine. Scores come in the order of the graph's tools, which is the
hierarchy's tool order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pml_common.embedding import Embedder
from pml_common.first_stage import (
    LexicalIndex,
    Reach,
    TextScores,
    ToolText,
    dense_parts,
    fused_relevance,
    hybrid_relevance,
    sub_goals,
)
from pml_common.tool_graph import GraphTool, ToolGraph


@dataclass(frozen=True)
class Intent:
    """A request as the served score reads it."""

    #: Its embedding by the embedder SHGAT works in (`PML_EMBEDDER`).
    vector: NDArray[np.floating]
    #: The request then its sub-goals, and their embeddings by the tool embedder; no texts
    #: when the request came as an embedding alone (the first stage is then the cosine with
    #: the tools' embeddings in SHGAT's space).
    texts: tuple[str, ...] = ()
    text_vectors: NDArray[np.floating] | None = None


async def embed_intents(
    texts: Sequence[str], embedder: Embedder, tool_embedder: Embedder | None
) -> list[Intent]:
    """The `Intent` of each request text, in two batched embedding calls (each distinct text
    once). Without a tool embedder the request is read by BM25 and SHGAT's embedder alone."""
    unique = list(dict.fromkeys(texts))
    if not unique:
        return []
    vectors = np.asarray(await embedder.embed_queries(unique))
    goals = [(text, *sub_goals(text)) if tool_embedder else (text,) for text in unique]
    flat = [goal for group in goals for goal in group]
    goal_vectors = np.asarray(await tool_embedder.embed_queries(flat)) if tool_embedder else None
    by_text, start = {}, 0
    for text, vector, group in zip(unique, vectors, goals, strict=True):
        rows = goal_vectors[start : start + len(group)] if goal_vectors is not None else None
        by_text[text] = Intent(vector, group, rows)
        start += len(group)
    return [by_text[text] for text in texts]


class FusedFirstStage:
    def __init__(
        self,
        ids: tuple[str, ...],
        vectors: NDArray[np.float64],
        lexical: LexicalIndex,
        catalog: NDArray[np.float32] | None = None,
        parts: tuple[int, ...] = (),
        reach: tuple[Reach, ...] = (),
    ):
        self.ids = ids
        self._vectors = vectors
        self._lexical = lexical
        self._catalog = catalog
        self._parts = parts
        self._reach = reach

    @classmethod
    def of_graph(cls, graph: ToolGraph) -> FusedFirstStage:
        """Built from the graph's tools (the BM25 index is built here: call off the event loop
        for a large tenant)."""
        ids = tuple(t.id for t in graph.tools)
        rows = [np.asarray(graph.tool_vectors[i], dtype=np.float64) for i in ids]
        dim = len(rows[0]) if rows else 0
        vectors = np.vstack(rows) if rows else np.zeros((0, dim))
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
        texts = [ToolText(t.id, t.server, t.name, t.description, t.fields) for t in graph.tools]
        return cls(
            ids,
            vectors,
            LexicalIndex.build(texts),
            graph.catalog_vectors,
            graph.catalog_parts,
            graph.catalog_reach,
        )

    @classmethod
    def of_vectors(
        cls, ids: Sequence[str], vectors: Sequence[NDArray[np.floating]]
    ) -> FusedFirstStage:
        """The first stage of tools known by their ids and embeddings alone (a synthetic
        catalog): BM25 over the ids and the cosine."""
        tools = tuple(GraphTool(i, i, "") for i in ids)
        vectors_of = {i: np.asarray(v, np.float32) for i, v in zip(ids, vectors, strict=True)}
        return cls.of_graph(ToolGraph("", tools, (), vectors_of))

    @property
    def parts(self) -> tuple[int, ...]:
        """Widths of the tool embedder's models in the catalog's vectors (empty without)."""
        return self._parts if self._catalog is not None else ()

    @property
    def catalog(self) -> NDArray[np.float32] | None:
        """The tools' embeddings by the tool embedder, in tool order (None without)."""
        return self._catalog

    def scores(self, intent: Intent) -> NDArray[np.float64]:
        """Relevance of every tool in [0, 1] (see the module docstring)."""
        return self.scores_adapted(intent, None)[0]

    def scores_adapted(
        self,
        intent: Intent,
        adapt: Callable[[NDArray[np.floating]], NDArray[np.floating]] | None,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
        """`scores(intent)`, and the relevance of the request's embeddings by the tool embedder
        mapped by `adapt` (a learned query adapter), BM25 read once for both; None without
        `adapt` or without those embeddings (a request given as an embedding alone)."""
        if not self.ids:
            return np.zeros(0, dtype=np.float64), None
        if intent.texts and intent.text_vectors is not None and self._catalog is not None:
            catalog, lexical = self._catalog, [self._lexical.scored(t) for t in intent.texts]
            plain = self._hybrid(catalog, intent.text_vectors, lexical)
            adapted = self._hybrid(catalog, adapt(intent.text_vectors), lexical) if adapt else None
            return plain, adapted
        query = np.asarray(intent.vector, dtype=np.float64)
        dense = self._vectors @ (query / max(float(np.linalg.norm(query)), 1e-12))
        # SHGAT's embedder alone (USE by default) is taken to read across scripts.
        bm25, foreign = (
            self._lexical.scored(intent.texts[0])[:2]
            if intent.texts
            else (np.zeros(len(self.ids), np.float32), None)
        )
        return np.asarray(fused_relevance(dense, bm25, foreign), dtype=np.float64), None

    def _hybrid(
        self,
        catalog: NDArray[np.float32],
        vectors: NDArray[np.floating],
        lexical: Sequence[tuple[NDArray[np.float32], NDArray[np.bool_] | None, str]],
    ) -> NDArray[np.float64]:
        """The hybrid relevance of a request and its sub-goals (`vectors`, `lexical`: each
        one's embedding by the tool embedder, BM25 scores, tools in another script and script)
        over the tools' embeddings `catalog`."""
        parts = [
            TextScores(dense_parts(catalog, vector, self._parts), *scored)
            for vector, scored in zip(vectors, lexical, strict=True)
        ]
        relevance = hybrid_relevance(parts[0], parts[1:], self._reach)
        return np.asarray(relevance, dtype=np.float64)
