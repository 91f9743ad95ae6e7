"""Composition root of the search service: `python -m pml_search`.

Builds, from one `Settings`: logging and telemetry, the Redis client (embedding cache), the
embedders (`PML_TOOL_EMBEDDER` for the catalog, `PML_PASSAGE_EMBEDDER` for document chunks and
the questions of `Ask`), the vector store (sole owner of the embedded Qdrant folder), the Neo4j
driver (read only), the event subscriptions (the shared group `search` and this replica's cache
group, see `consumers`) and the gRPC server on `settings.search_port` with `SearchService` and
`KnowledgeService` (graph-first `Ask`, `pml_search.knowledge`; its replica group
`search-knowledge-<consumer_name>` keeps the GDS projections and the propagation graphs
current, see `knowledge_consumers`).
SIGTERM/SIGINT stop it gracefully: the server stops accepting RPCs and finishes those in flight,
then the consumers stop, then the re-embedding of chunks (`ChunkIndex.start`) if it still runs,
the replica's cache group is removed, then the clients close.
"""

from __future__ import annotations

import asyncio

import structlog

from pml.v1 import knowledge_pb2_grpc, search_pb2_grpc
from pml_common.bus import EventBus, create_replica_group, destroy_replica_group
from pml_common.embedding import build_passage_embedder, build_tool_embedder
from pml_common.grpc_server import GrpcServer
from pml_common.latest_wins import LatestWins
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_search.blas import limit_blas_threads
from pml_search.catalog_index import CatalogIndex
from pml_search.chunk_consumers import GROUP as CHUNK_GROUP
from pml_search.chunk_consumers import ChunkConsumers
from pml_search.chunk_index import ChunkIndex
from pml_search.consumers import CACHE_EVENTS, SearchConsumers
from pml_search.gds import GdsPageRank, GdsPaths
from pml_search.graph_view import GraphView
from pml_search.knowledge import KnowledgeEngine
from pml_search.knowledge_consumers import KNOWLEDGE_CACHE_EVENTS, KnowledgeConsumers
from pml_search.knowledge_reads import KnowledgeReads
from pml_search.knowledge_service import KnowledgeServicer
from pml_search.propagation import Propagation
from pml_search.service import SearchServicer
from pml_search.vector_store import QdrantVectorStore

SERVICE = "search"
log = structlog.get_logger(__name__)


class SearchApp:
    """Every part of the running service, started and stopped in order."""

    def __init__(self, settings: Settings, port: int | None = None) -> None:
        limit_blas_threads(1)  # see pml_search.blas
        self.settings = settings
        self.port = settings.search_port if port is None else port
        self._redis = redis_client(settings)
        self._store = QdrantVectorStore.from_settings(settings)
        self._driver = neo4j_driver(settings)
        self.catalog = CatalogIndex(
            self._store,
            build_tool_embedder(settings, self._redis),
            max_entries=settings.search_cache_max_entries,
        )
        self.graph = GraphView(
            self._driver, settings.neo4j_database, max_entries=settings.search_cache_max_entries
        )
        self.bus = EventBus(settings, SERVICE)
        consumers = SearchConsumers(self.catalog, self.graph)
        # Document chunks (knowledge evidence), from the ingest pipeline's ChunksExtracted; Ask
        # embeds its question with the same embedder (`ChunkIndex.embedder`).
        self.chunks = ChunkIndex(
            self._store,
            build_passage_embedder(settings, self._redis),
            settings.search_chunk_cache_max_chunks,
        )
        ChunkConsumers(self.chunks, LatestWins(self._redis, CHUNK_GROUP)).subscribe(self.bus)
        self._cache_group = consumers.subscribe(self.bus, settings.consumer_name)
        reads = KnowledgeReads(
            self._driver, settings.neo4j_database, settings.knowledge_min_confidence
        )
        gds = GdsPaths(reads.read, settings.consumer_name, reads.min_confidence)
        pagerank = GdsPageRank(reads.read, settings.consumer_name)
        propagation = Propagation(reads, names_embedder=self.chunks.embedder)
        self.knowledge = KnowledgeEngine(reads, gds, self.chunks, propagation, pagerank)
        self._knowledge_group = KnowledgeConsumers(gds, propagation, pagerank).subscribe(
            self.bus, settings.consumer_name
        )
        self.servicer = SearchServicer(settings, self.catalog, self.graph, self.bus)
        self._server = GrpcServer(settings, self.port, SERVICE)
        self._server.add(
            lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(self.servicer, s),
            "pml.v1.SearchService",
        )
        knowledge = KnowledgeServicer(settings, self.knowledge)
        self._server.add(
            lambda s: knowledge_pb2_grpc.add_KnowledgeServiceServicer_to_server(knowledge, s),
            "pml.v1.KnowledgeService",
        )

    async def start(self) -> int:
        """Start consuming and serving; returns the bound port."""
        await self.catalog.start()
        await self.chunks.start()
        # Load the model (and fill the cache) now rather than on the first request.
        await self.catalog.embedder.embed_queries(["warm up"])
        await self.chunks.embedder.embed_queries(["warm up"])
        await create_replica_group(self._redis, self._cache_group, CACHE_EVENTS)
        await create_replica_group(self._redis, self._knowledge_group, KNOWLEDGE_CACHE_EVENTS)
        await self.bus.start()
        self.port = await self._server.start()
        log.info("search started", port=self.port)
        return self.port

    async def stop(self) -> None:
        await self._server.stop()
        await self.bus.stop()
        await self.chunks.stop()  # the chunks' re-embedding, if it still runs
        await self.knowledge.propagation.close()  # its graphs read ahead of questions
        await destroy_replica_group(self._redis, self._cache_group, CACHE_EVENTS)
        await destroy_replica_group(self._redis, self._knowledge_group, KNOWLEDGE_CACHE_EVENTS)
        await self._driver.close()
        await self._store.close()
        await self._redis.aclose()
        log.info("search stopped")


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    app = SearchApp(settings)
    await app.start()
    try:
        await wait_for_shutdown_signal()
    finally:
        await app.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
