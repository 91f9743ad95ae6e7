"""In-process latency of the search hot path at N tools (default 10k), without gRPC or embedding.

    uv run python services/search/bench/ranking_latency.py [--tools 10000] [--qdrant]
        [--blas-threads 1]

Measures, per query: retrieval from the in-memory matrix (`CatalogIndex.ranked`, dense) plus unified
ranking (`rank_unified`) and hybrid re-ranking with context (`rank_hybrid`), over a tenant whose
every tool has execution statistics and a sparse LINK graph. With `--qdrant` it also measures
the embedded Qdrant's filtered search on the same points, which the matrix replaces on the hot
path. Vectors are random unit vectors: latency does not depend on what they encode.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from pml_common.first_stage import DENSE
from pml_search import ranking
from pml_search.blas import limit_blas_threads
from pml_search.catalog_index import TOOL, CatalogEntry, CatalogIndex, TenantMatrix
from pml_search.graph_view import NodeStats, TenantGraph
from pml_search.service import rank_hybrid, rank_unified
from pml_search.vector_store import QdrantVectorStore, VectorPoint

DIM = 384
TENANT = "bench"


class _StoredVectors:
    """Embedder stand-in for the bench only: `nearest` is handed vectors, never texts."""

    name = "bench"
    dim = DIM

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _catalog(n: int) -> list[CatalogEntry]:
    return [
        CatalogEntry(TENANT, f"s{i % 200}:tool_{i}", TOOL, f"tool_{i}", f"s{i % 200}", "d")
        for i in range(n)
    ]


def _graph(entries: list[CatalogEntry], rng: np.random.Generator) -> TenantGraph:
    view = TenantGraph()
    for e in entries:
        runs = int(rng.integers(0, 50))
        ok = int(rng.integers(0, runs + 1))
        view.tools[e.id] = NodeStats(runs, ok, ok / runs if runs else None)
    ids = [e.id for e in entries]
    for _ in range(3 * len(ids)):
        a, b = rng.integers(0, len(ids), 2)
        view.links.add_edge(ids[a], ids[b], float(rng.choice([0.25, 0.35, 0.5, 0.7, 1.0])))
    return view


async def _timed(fn: Callable[[], Awaitable[object]], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def _report(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:<44} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms")


async def main(n: int, runs: int, with_qdrant: bool, blas_threads: int) -> None:
    if blas_threads > 0:
        limit_blas_threads(blas_threads)  # as SearchApp does with 1
    rng = np.random.default_rng(7)
    entries = _catalog(n)
    vectors = _unit(rng, n)
    queries = _unit(rng, runs)
    view = _graph(entries, rng)
    print(f"{n} tools, {view.links.edge_count()} LINK edges, {runs} queries")

    with tempfile.TemporaryDirectory() as folder:
        from qdrant_client import AsyncQdrantClient

        store = QdrantVectorStore(AsyncQdrantClient(path=folder))
        catalog = CatalogIndex(store, _StoredVectors())
        matrix = TenantMatrix(DIM)
        matrix.upsert(entries, ["h"] * n, vectors)
        catalog._cache[(TENANT, TOOL)] = matrix  # the read cache as loaded from the store
        queue = iter(range(10**9))

        async def unified() -> object:
            q = queries[next(queue) % runs]
            candidates = await catalog.ranked(TENANT, TOOL, ["read a file"], q[None], 50, DENSE)
            return rank_unified(candidates, view, 10)

        async def hybrid() -> object:
            q = queries[next(queue) % runs]
            context = [entries[int(rng.integers(0, n))].id for _ in range(3)]
            candidates = await catalog.ranked(TENANT, TOOL, ["read a file"], q[None], 50, DENSE)
            links = view.links
            alpha = ranking.adaptive_alpha(True, links.edge_count(), max(n, links.node_count()))
            tools = rank_hybrid(candidates, view, context, alpha, 10)
            for t in tools:
                ranking.related_tools(links, t.tool_id)
            return tools

        await _timed(unified, 20)
        _report("matrix retrieve + unified rank", await _timed(unified, runs))
        _report("matrix retrieve + hybrid rerank (3 ctx)", await _timed(hybrid, runs))

        if with_qdrant:
            await store.ensure_collection("bench", DIM)
            points = [
                VectorPoint(id=e.id, vector=v, payload={"tenant_id": TENANT, "id": e.id})
                for e, v in zip(entries, vectors, strict=True)
            ]
            await store.upsert("bench", points)

            async def qdrant() -> object:
                q = queries[next(queue) % runs]
                return await store.search("bench", q, 50, {"tenant_id": TENANT})

            _report("embedded Qdrant filtered search (top 50)", await _timed(qdrant, 30))
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--qdrant", action="store_true")
    parser.add_argument(
        "--blas-threads", type=int, default=1, help="0: leave OpenBLAS's default pool"
    )
    args = parser.parse_args()
    asyncio.run(main(args.tools, args.runs, args.qdrant, args.blas_threads))
