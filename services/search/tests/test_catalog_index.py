"""CatalogIndex over the embedded Qdrant with the real embedder."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pml_common.embedding import build_tool_embedder, catalog_text, part_dims, part_reach
from pml_common.events import ToolSpec, ToolsRegistered
from pml_common.first_stage import (
    CJK,
    DENSE,
    HYBRID,
    LEXICAL,
    LexicalIndex,
    dense_parts,
    fused_relevance,
    part_cosines,
    sub_goals,
)
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_search import cosine_batches
from pml_search.catalog_index import (
    CAPABILITY,
    TOOL,
    CatalogEntry,
    CatalogIndex,
    TenantMatrix,
)
from pml_search.consumers import SearchConsumers
from pml_search.vector_store import QdrantVectorStore


def _tool(tenant: str, tid: str, description: str) -> CatalogEntry:
    server, name = tid.split(":")
    return CatalogEntry(tenant, tid, TOOL, name, server, description)


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[tuple[QdrantVectorStore, CatalogIndex]]:
    redis = redis_client(settings)
    store = QdrantVectorStore.from_settings(settings)
    catalog = CatalogIndex(store, build_tool_embedder(settings, redis))
    await catalog.start()
    yield store, catalog
    await store.close()
    await redis.aclose()


def test_catalog_text() -> None:
    assert catalog_text("read_file", "  Read a file. ") == "read_file: Read a file."
    assert catalog_text("read_file", "") == "read_file"


async def test_index_skip_reload_and_delete(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str
) -> None:
    store, catalog = parts
    entries = [
        _tool(tenant, "fs:read_file", "Read the contents of a file"),
        _tool(tenant, "web:fetch", "Fetch a web page by URL"),
    ]
    first = await catalog.index(tenant, TOOL, entries)
    assert (first.indexed, first.unchanged) == (2, 0)
    again = await catalog.index(tenant, TOOL, entries)
    assert (again.indexed, again.unchanged) == (0, 2)
    assert await store.count(catalog.collections[TOOL], {"tenant_id": tenant}) == 2

    stored = await store.scan(catalog.collections[TOOL], {"tenant_id": tenant})
    payload = next(p.payload for p in stored if p.payload["id"] == "fs:read_file")
    assert {k: payload[k] for k in ("tenant_id", "id", "kind", "name", "server")} == {
        "tenant_id": tenant,
        "id": "fs:read_file",
        "kind": "tool",
        "name": "read_file",
        "server": "fs",
    }
    assert payload["description"] == "Read the contents of a file"

    query = (await catalog.embedder.embed_queries(["read a file"]))[0]
    top = await catalog.ranked(tenant, TOOL, ["read a file"], query[None], 2, DENSE)
    assert [s.entry.id for s in top] == ["fs:read_file", "web:fetch"]
    assert top[0].relevance > top[1].relevance

    # A fresh index over the same store (a restart) rebuilds the read cache from the store:
    # same ranking, same scores, and the stored hashes still make re-indexing a no-op.
    restarted = CatalogIndex(store, catalog.embedder)
    again_top = await restarted.ranked(tenant, TOOL, ["read a file"], query[None], 2, DENSE)
    assert [s.entry.id for s in again_top] == ["fs:read_file", "web:fetch"]
    np.testing.assert_allclose(
        [s.relevance for s in again_top], [s.relevance for s in top], rtol=1e-5
    )
    assert (await restarted.index(tenant, TOOL, entries)).indexed == 0
    assert await restarted.missing(tenant, TOOL, ["web:fetch", "x:y", "x:y"]) == ["x:y"]

    await restarted.index(tenant, CAPABILITY, [CatalogEntry(tenant, "c1", CAPABILITY, "c", "", "")])
    assert await restarted.delete_tenant(tenant) == 3
    assert await restarted.ranked(tenant, TOOL, ["read a file"], query[None], 5, HYBRID) == []
    assert await store.count(catalog.collections[CAPABILITY], {"tenant_id": tenant}) == 0


async def test_writes_during_a_dense_pass_never_change_the_rows_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def held_pass(models: list[np.ndarray], queries: np.ndarray) -> np.ndarray:
        release.wait(timeout=10)
        return part_cosines(models, queries)

    monkeypatch.setattr(cosine_batches, "part_cosines", held_pass)
    matrix = TenantMatrix(2)
    entry = [CatalogEntry("t", f"s:{i}", TOOL, f"tool {i}", "s", "") for i in range(3)]
    matrix.upsert(entry[:2], ["a", "b"], np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
    east = np.array([[1.0, 0.0]], dtype=np.float32)
    during = asyncio.create_task(matrix.rank(["tool"], east, 3, HYBRID))
    for _ in range(500):
        if matrix._cosines.reading:
            break
        await asyncio.sleep(0.01)
    # s:0 turns north and s:2 arrives while the pass reads the two rows there were
    matrix.upsert(
        [entry[0], entry[2]], ["c", "d"], np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    )
    release.set()
    seen = await during
    assert [s.entry.id for s in seen] == ["s:0", "s:1"]
    assert seen[0].dense == pytest.approx(1.0)  # the row as it was when the pass began
    after = await matrix.rank(["tool"], east, 3, HYBRID)
    assert [s.entry.id for s in after][:1] == ["s:2"]
    assert {s.entry.id: s.dense for s in after}["s:0"] == pytest.approx(0.0)


async def test_tenant_matrix_grows_replaces_and_ranks() -> None:
    matrix = TenantMatrix(2)
    entry = [CatalogEntry("t", f"s:{i}", TOOL, str(i), "s", "") for i in range(100)]
    # one at a time, as capability events arrive
    for i in range(100):
        angle = i * np.pi / 200  # 0 .. just under 90 degrees
        matrix.upsert([entry[i]], [f"h{i}"], np.array([[np.cos(angle), np.sin(angle)]]))
    assert len(matrix) == 100
    assert matrix.vectors.shape == (100, 2)
    top = await matrix.rank([""], np.array([[1.0, 0.0]], dtype=np.float32), 3, DENSE)
    assert [s.entry.id for s in top] == ["s:0", "s:1", "s:2"]
    assert top[0].relevance == pytest.approx(1.0)
    # replacing a row keeps its slot and changes its vector; a batch may repeat an id
    matrix.upsert(
        [entry[50], entry[50]], ["x", "y"], np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    )
    assert len(matrix) == 100
    assert matrix.hash_of("s:50") == "y"
    again = await matrix.rank([""], np.array([[1.0, 0.0]], dtype=np.float32), 2, DENSE)
    assert [s.entry.id for s in again] == ["s:0", "s:50"]


async def test_the_lexical_retriever_reads_names_fields_and_chinese(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str
) -> None:
    """Words of a camelCase name, an input-schema field name and a Chinese description are
    found by the lexical retriever as soon as the write returns, and the hybrid relevance lies
    between its two parts' weighted sum bounds."""
    _, catalog = parts
    entries = [
        _tool(tenant, "wallet:getWalletBalance", "Show funds"),
        CatalogEntry(tenant, "git:commit", TOOL, "commit", "git", "Record changes", ("branch",)),
        _tool(tenant, "fs:read_file", "读取文件的内容"),
        _tool(tenant, "web:fetch", "Fetch a web page by URL"),
    ]
    await catalog.index(tenant, TOOL, entries)

    async def top(text: str, retriever: str) -> str:
        vector = (await catalog.embedder.embed_queries([text]))[0]
        return (await catalog.ranked(tenant, TOOL, [text], vector[None], 1, retriever))[0].entry.id

    assert await top("what is my wallet balance", LEXICAL) == "wallet:getWalletBalance"
    assert await top("which branch", LEXICAL) == "git:commit"
    assert await top("读取文件", LEXICAL) == "fs:read_file"
    vector = (await catalog.embedder.embed_queries(["which branch"]))[0]
    hybrid = await catalog.ranked(tenant, TOOL, ["which branch"], vector[None], 4, HYBRID)
    best = hybrid[0]
    assert best.entry.id == "git:commit" and best.lexical == pytest.approx(1.0)
    assert all(0.0 <= s.relevance <= 1.0 for s in hybrid)

    # A chained request: each step's tool comes up, not only the most-mentioned step's.
    await catalog.index(
        tenant,
        TOOL,
        [
            _tool(tenant, "eth:check_balance", "Check the ETH balance of a wallet address"),
            _tool(tenant, "eth:get_balance", "Get the balance of an Ethereum account"),
            _tool(tenant, "bsc:balance_of", "Balance of a wallet on BNB chain"),
            _tool(tenant, "eth:send_transaction", "Send ETH from one wallet to another"),
        ],
    )
    chained = (
        "Check my wallet balance on Ethereum, make sure the balance covers it and the balance "
        "is not locked. Then send 0.05 ETH to my friend's wallet."
    )
    texts = [chained, *sub_goals(chained)]
    assert len(texts) == 3
    vectors = await catalog.embedder.embed_queries(texts)
    steps_top = await catalog.ranked(tenant, TOOL, texts, vectors, 3, HYBRID)
    assert "eth:send_transaction" in [s.entry.id for s in steps_top]

    # A tool added later is lexically searchable once its write returns.
    await catalog.index(tenant, TOOL, [_tool(tenant, "cal:create_event", "Schedule a meeting")])
    assert await top("schedule meeting", LEXICAL) == "cal:create_event"


async def test_a_tool_described_in_chinese_is_judged_in_part_by_the_cross_script_model(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str
) -> None:
    """For an English request, the Chinese-described tool's relevance is blended with USE's
    alone (`first_stage.fused_relevance`), and the English tools' is as it was; for a Chinese
    request, every tool's is."""
    _, catalog = parts
    entries = [
        _tool(tenant, "weather:forecast", "未来几天的天气预报，包括气温和降雨概率。"),
        _tool(tenant, "news:headlines", "The latest news headlines from around the world."),
        _tool(tenant, "travel:flights", "Search and book flights between cities."),
        _tool(tenant, "calendar:create_event", "Add an event to your calendar."),
    ]
    await catalog.index(tenant, TOOL, entries)
    request = "Will it rain in Paris tomorrow?"
    embedder = catalog.embedder
    vector = (await embedder.embed_queries([request]))[0]
    ranked = await catalog.ranked(tenant, TOOL, [request], vector[None], len(entries), HYBRID)
    got = {s.entry.id: s.relevance for s in ranked}

    passages = await embedder.embed_passages([e.text() for e in entries])
    cosines = dense_parts(passages, vector, part_dims(embedder))
    lexical = LexicalIndex.build([e.lexical() for e in entries])
    foreign = lexical.foreign(request)
    assert foreign is not None and foreign.tolist() == [True, False, False, False]
    flags = part_reach(embedder)
    want = fused_relevance(cosines, lexical.scores(request), foreign, reach=flags)
    plain = fused_relevance(cosines, lexical.scores(request))
    assert [got[e.id] for e in entries] == pytest.approx(want.tolist(), abs=1e-5)
    assert got["weather:forecast"] > plain[0] + 0.05  # the rule changed what it would have been
    assert [got[e.id] for e in entries[1:]] == pytest.approx(plain[1:].tolist(), abs=1e-5)
    assert ranked[0].entry.id == "weather:forecast"

    # A Chinese request, in the script of one tool of four: every tool is judged as foreign,
    # the Chinese one too, and MiniLM (English only) has no say.
    request = "明天巴黎会下雨吗？"
    vector = (await embedder.embed_queries([request]))[0]
    ranked = await catalog.ranked(tenant, TOOL, [request], vector[None], len(entries), HYBRID)
    got = {s.entry.id: s.relevance for s in ranked}
    cosines = dense_parts(passages, vector, part_dims(embedder))
    foreign = lexical.foreign(request)
    assert foreign is not None and foreign.all()
    want = fused_relevance(cosines, lexical.scores(request), foreign, CJK, reach=flags)
    assert [got[e.id] for e in entries] == pytest.approx(want.tolist(), abs=1e-5)


async def test_a_request_that_gives_up_leaves_the_tenants_read_for_the_next_one(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large tenant's first read can outlast a client's deadline: the read goes on, once."""
    store, writer = parts
    await writer.index(tenant, TOOL, [_tool(tenant, "fs:read_file", "Read a file")])
    reader = CatalogIndex(store, writer.embedder)
    reads, release = [], asyncio.Event()
    load = reader._load

    async def slow_load(name: str, kind: str) -> TenantMatrix:
        reads.append(name)
        await release.wait()
        return await load(name, kind)

    monkeypatch.setattr(reader, "_load", slow_load)
    impatient = asyncio.create_task(reader.get(tenant, TOOL, "fs:read_file"))
    await asyncio.sleep(0.05)
    impatient.cancel()  # its deadline passed
    with pytest.raises(asyncio.CancelledError):
        await impatient
    patient = [asyncio.create_task(reader.get(tenant, TOOL, "fs:read_file")) for _ in range(2)]
    await asyncio.sleep(0.05)
    release.set()
    found = await asyncio.gather(*patient)
    assert [entry.id for entry in found if entry] == ["fs:read_file", "fs:read_file"]
    assert reads == [tenant]  # one read of the store for the three requests
    assert reader.is_cached(tenant, TOOL)


async def test_an_entry_announced_while_a_replica_reads_the_catalog_is_not_lost(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica B reads the tenant's catalog; replica A registers a tool and announces it before
    B's read is stored: B must serve the new tool (B applies announcements while it reads)."""
    store, replica_a = parts
    await replica_a.index(tenant, TOOL, [_tool(tenant, "fs:read_file", "Read a file")])
    replica_b = CatalogIndex(store, replica_a.embedder)
    read_done, release = asyncio.Event(), asyncio.Event()
    load = replica_b._load

    async def slow_load(name: str, kind: str) -> TenantMatrix:
        loaded = await load(name, kind)
        read_done.set()
        await release.wait()
        return loaded

    monkeypatch.setattr(replica_b, "_load", slow_load)
    first_request = asyncio.create_task(replica_b.get(tenant, TOOL, "fs:read_file"))
    await read_done.wait()  # B's read has only fs:read_file
    spec = ToolSpec(id="web:fetch", server="web", name="fetch", description="Fetch a web page")
    await replica_a.index(tenant, TOOL, [_tool(tenant, spec.id, spec.description)])
    # B's replica group receives the announcement (the graph view is not involved here)
    b_consumers = SearchConsumers(replica_b, graph=None)  # type: ignore[arg-type]
    event = ToolsRegistered.create(tenant_id=tenant, tools=[spec])
    announced = asyncio.create_task(b_consumers.on_tools_registered_cached(event))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first_request, announced)
    monkeypatch.setattr(replica_b, "_load", load)
    matrix = replica_b._cache.peek((tenant, TOOL))
    assert matrix is not None
    assert set(matrix.index) == {"fs:read_file", "web:fetch"}
    assert not replica_b.is_cached(f"{tenant}-never-read", TOOL)


async def test_the_cache_keeps_its_entry_budget_and_reads_dropped_tenants_again(
    parts: tuple[QdrantVectorStore, CatalogIndex], tenant: str
) -> None:
    """At most `max_entries` entries stay in memory: the least recently used tenant is dropped
    and served again from the store; a tenant without entries counts as one."""
    store, full = parts
    catalog = CatalogIndex(store, full.embedder, max_entries=3)
    first, second = f"{tenant}-a", f"{tenant}-b"
    await catalog.index(first, TOOL, [_tool(first, "fs:read_file", "Read a file")])
    await catalog.index(first, TOOL, [_tool(first, "fs:write_file", "Write a file")])
    assert catalog.is_cached(first, TOOL)
    await catalog.index(second, TOOL, [_tool(second, "web:fetch", "Fetch a web page")])
    await catalog.index(second, TOOL, [_tool(second, "web:post", "Post a form")])
    assert catalog.is_cached(second, TOOL)
    assert not catalog.is_cached(first, TOOL)  # 4 entries > 3: the older tenant gave way

    query = await catalog.embedder.embed_queries(["read a file"])
    top = await catalog.ranked(first, TOOL, ["read a file"], query, 1, HYBRID)
    assert [s.entry.id for s in top] == ["fs:read_file"]  # read again from the store
    assert catalog.is_cached(first, TOOL) and not catalog.is_cached(second, TOOL)

    for i in range(20):  # requests naming tenants that have nothing
        assert await catalog.ranked(f"{tenant}-none-{i}", TOOL, ["x"], query, 1, HYBRID) == []
    assert catalog._cache.weight() == 3 and catalog.is_cached(f"{tenant}-none-19", TOOL)
    assert len(catalog._locks) == 0  # locks live while writers hold them only
