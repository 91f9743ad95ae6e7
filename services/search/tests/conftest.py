"""The search service running in-process on a real gRPC port, with real stores and embedder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from pml.v1 import search_pb2_grpc
from pml_common.embedding import build_passage_embedder
from pml_common.settings import Settings
from pml_search.chunk_index import ChunkIndex
from pml_search.gds import GdsPaths
from pml_search.knowledge import KnowledgeEngine
from pml_search.knowledge_reads import KnowledgeReads
from pml_search.vector_store import QdrantVectorStore

if TYPE_CHECKING:
    from pml_search.main import SearchApp


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[SearchApp]:
    from pml_search.main import SearchApp

    application = SearchApp(settings, port=0)
    await application.start()
    yield application
    await application.stop()


@pytest.fixture
async def stub(app: SearchApp) -> AsyncIterator[search_pb2_grpc.SearchServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield search_pb2_grpc.SearchServiceStub(channel)


@pytest.fixture
async def engine(settings: Settings, redis, graph_db) -> AsyncIterator[KnowledgeEngine]:
    """Ask's engine on the suite's stores and the embedded vector store."""
    store = QdrantVectorStore.from_settings(settings)
    chunks = ChunkIndex(store, build_passage_embedder(settings, redis))
    await chunks.start()
    reads = KnowledgeReads(graph_db, settings.neo4j_database)
    engine = KnowledgeEngine(reads, GdsPaths(reads.read, "test"), chunks)
    yield engine
    await engine.propagation.close()  # its reads ahead, as the service does when it stops
    await chunks.stop()
    await store.close()
