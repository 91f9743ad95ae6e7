"""A tenant's untrained first stage over its tool graph, as the scorer serves it and the
trainer's gate compares with: BM25 over the tools' texts and the cosine of the intent with the
tools' embeddings, fused (`pml_common.first_stage.fused_relevance`).

The dense part uses the embeddings of the tool graph (`read_tool_graph`, the shared embedding
cache), the ones SHGAT starts from, so the correction and the first stage see the same vectors.
Scores come in the order of the graph's tools, which is the hierarchy's tool order.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from pml_common.first_stage import LexicalIndex, ToolText, fused_relevance
from pml_common.tool_graph import ToolGraph


class FusedFirstStage:
    def __init__(self, ids: tuple[str, ...], vectors: NDArray[np.float64], lexical: LexicalIndex):
        self.ids = ids
        self._vectors = vectors
        self._lexical = lexical

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
        texts = [ToolText(t.id, t.server, t.name, t.description) for t in graph.tools]
        return cls(ids, vectors, LexicalIndex.build(texts))

    def scores(self, text: str | None, intent: NDArray[np.floating]) -> NDArray[np.float64]:
        """Relevance of every tool in [0, 1]; without text (an embedding given alone) the
        lexical side is empty and the dense side decides."""
        if not self.ids:
            return np.zeros(0, dtype=np.float64)
        query = np.asarray(intent, dtype=np.float64)
        dense = self._vectors @ (query / max(float(np.linalg.norm(query)), 1e-12))
        lexical = self._lexical.scores(text) if text else np.zeros(len(self.ids), np.float32)
        return np.asarray(fused_relevance(dense, lexical), dtype=np.float64)
