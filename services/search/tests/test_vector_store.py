"""QdrantVectorStore against qdrant-client's embedded local mode in a temporary folder."""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from pml_common.settings import Settings
from pml_search.vector_store import ID_FIELD, QdrantVectorStore, VectorPoint

COLL = "things"


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def point(pid: str, vec: np.ndarray, tenant: str = "a", **payload: str) -> VectorPoint:
    return VectorPoint(id=pid, vector=vec, payload={"tenant_id": tenant, **payload})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[QdrantVectorStore]:
    s = QdrantVectorStore.from_settings(Settings(qdrant_path=str(tmp_path / "qdrant")))
    await s.ensure_collection(COLL, 4, ("tenant_id", "kind"))
    yield s
    await s.close()


async def test_search_returns_cosine_best_first(store: QdrantVectorStore) -> None:
    query = unit(1, 0, 0, 0)
    await store.upsert(
        COLL,
        [
            point("far", unit(0, 0, 1, 0), name="far"),
            point("near", unit(1, 0.1, 0, 0), name="near"),
            point("mid", unit(1, 1, 0, 0), name="mid"),
            point("opposite", unit(-1, 0, 0, 0), name="opposite"),
        ],
    )
    hits = await store.search(COLL, query, limit=3)
    assert [h.id for h in hits] == ["near", "mid", "far"]
    assert hits[0].score == pytest.approx(float(unit(1, 0.1, 0, 0) @ query), abs=1e-5)
    assert hits[1].score == pytest.approx(np.sqrt(0.5), abs=1e-5)
    assert hits[2].score == pytest.approx(0.0, abs=1e-5)
    # The payload comes back as written: the stored original id is not leaked.
    assert hits[0].payload == {"tenant_id": "a", "name": "near"}
    assert await store.search(COLL, query, limit=0) == []


async def test_filters_by_tenant_and_any_of(store: QdrantVectorStore) -> None:
    await store.upsert(
        COLL,
        [
            point("a-tool", unit(1, 0, 0, 0), "a", kind="tool"),
            point("a-cap", unit(1, 0.2, 0, 0), "a", kind="capability"),
            point("a-doc", unit(1, 0.3, 0, 0), "a", kind="document"),
            point("b-tool", unit(1, 0, 0, 0), "b", kind="tool"),
        ],
    )
    query = unit(1, 0, 0, 0)
    only_a = await store.search(COLL, query, 10, {"tenant_id": "a"})
    assert {h.id for h in only_a} == {"a-tool", "a-cap", "a-doc"}
    any_of = await store.search(COLL, query, 10, {"tenant_id": "a", "kind": ["tool", "document"]})
    assert [h.id for h in any_of] == ["a-tool", "a-doc"]
    assert await store.search(COLL, query, 10, {"tenant_id": ["a", "b"], "kind": "tool"}) != []
    assert await store.count(COLL) == 4
    assert await store.count(COLL, {"tenant_id": "b"}) == 1
    assert await store.count(COLL, {"tenant_id": "a", "kind": ("tool", "capability")}) == 2
    assert await store.count(COLL, {"tenant_id": "nobody"}) == 0
    # An empty any-of list matches nothing (rather than everything).
    assert await store.search(COLL, query, 10, {"tenant_id": []}) == []
    assert await store.count(COLL, {"kind": []}) == 0


async def test_delete_by_filter_returns_count(store: QdrantVectorStore) -> None:
    await store.upsert(
        COLL,
        [point(f"a{i}", unit(1, i, 0, 0), "a", kind="tool") for i in range(5)]
        + [point(f"b{i}", unit(1, i, 0, 0), "b", kind="tool") for i in range(3)],
    )
    assert await store.delete(COLL, {"tenant_id": "a", "kind": "tool"}) == 5
    assert await store.count(COLL, {"tenant_id": "a"}) == 0
    assert await store.count(COLL, {"tenant_id": "b"}) == 3
    assert await store.delete(COLL, {"tenant_id": "a"}) == 0
    assert await store.delete(COLL, {"tenant_id": []}) == 0
    with pytest.raises(ValueError, match="needs a filter"):
        await store.delete(COLL, {})
    assert await store.count(COLL) == 3


async def test_reupsert_same_id_replaces_point(store: QdrantVectorStore) -> None:
    await store.upsert(COLL, [point("x", unit(1, 0, 0, 0), version="1")])
    await store.upsert(COLL, [point("x", unit(0, 1, 0, 0), version="2")])
    await store.upsert(COLL, [point("x", unit(0, 1, 0, 0), version="2")])
    assert await store.count(COLL) == 1
    [got] = await store.get(COLL, ["x"])
    assert got.payload == {"tenant_id": "a", "version": "2"}
    np.testing.assert_allclose(got.vector, unit(0, 1, 0, 0), atol=1e-6)


async def test_get_by_ids_keeps_order_and_skips_unknown(store: QdrantVectorStore) -> None:
    vecs = {"p1": unit(1, 2, 3, 4), "p2": unit(4, 3, 2, 1), "tool:with/odd chars": unit(1, 1, 1, 1)}
    await store.upsert(COLL, [point(k, v, tag=k) for k, v in vecs.items()])
    got = await store.get(COLL, ["tool:with/odd chars", "missing", "p1", "p1"])
    assert [p.id for p in got] == ["tool:with/odd chars", "p1"]
    for p in got:
        np.testing.assert_allclose(p.vector, vecs[p.id], atol=1e-6)
        assert p.payload == {"tenant_id": "a", "tag": p.id}
        assert ID_FIELD not in p.payload
    assert await store.get(COLL, []) == []


async def test_scan_pages_through_every_matching_point(store: QdrantVectorStore) -> None:
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(2500, 4)).astype(np.float32)
    await store.upsert(COLL, [point(f"p{i}", v, "a" if i % 5 else "b") for i, v in enumerate(vecs)])
    a_points = await store.scan(COLL, {"tenant_id": "a"})
    assert len(a_points) == 2000
    assert {p.id for p in a_points} == {f"p{i}" for i in range(2500) if i % 5}
    assert all(p.vector.shape == (4,) for p in a_points)
    assert len(await store.scan(COLL)) == 2500


async def test_every_point_needs_a_tenant(store: QdrantVectorStore) -> None:
    bad = VectorPoint(id="x", vector=unit(1, 0, 0, 0), payload={"name": "no tenant"})
    with pytest.raises(ValueError, match="tenant_id"):
        await store.upsert(COLL, [bad])
    assert await store.count(COLL) == 0


async def test_ensure_collection_is_idempotent_and_checks_dim(store: QdrantVectorStore) -> None:
    await store.upsert(COLL, [point("kept", unit(1, 0, 0, 0))])
    with warnings.catch_warnings():
        # Local mode ignores payload indexes; the store must not even ask (no warning).
        warnings.simplefilter("error")
        await store.ensure_collection(COLL, 4, ("tenant_id", "kind"))
    assert await store.count(COLL) == 1
    with pytest.raises(ValueError, match="size 4"):
        await store.ensure_collection(COLL, 8)


async def test_points_survive_reopening_the_embedded_store(tmp_path: Path) -> None:
    settings = Settings(qdrant_path=str(tmp_path / "persist"))
    first = QdrantVectorStore.from_settings(settings)
    await first.ensure_collection(COLL, 4)
    await first.upsert(COLL, [point("durable", unit(1, 2, 3, 4))])
    await first.close()
    second = QdrantVectorStore.from_settings(settings)
    try:
        assert [p.id for p in await second.get(COLL, ["durable"])] == ["durable"]
    finally:
        await second.close()


async def test_search_latency_10k_points(tmp_path: Path) -> None:
    store = QdrantVectorStore.from_settings(Settings(qdrant_path=str(tmp_path / "big")))
    dim, n, tenants = 384, 10_000, 10
    rng = np.random.default_rng(42)
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    try:
        await store.ensure_collection("big", dim, ("tenant_id",))
        started = time.perf_counter()
        await store.upsert(
            "big", [point(f"p{i}", v, f"t{i % tenants}") for i, v in enumerate(vecs)]
        )
        upsert_s = time.perf_counter() - started

        timings = []
        for q in range(20):
            started = time.perf_counter()
            hits = await store.search("big", vecs[q], 10, {"tenant_id": f"t{q % tenants}"})
            timings.append(time.perf_counter() - started)
            # A stored vector finds itself first, and only its tenant's points come back.
            assert hits[0].id == f"p{q}"
            assert all(h.payload["tenant_id"] == f"t{q % tenants}" for h in hits)
        unfiltered_started = time.perf_counter()
        await store.search("big", vecs[0], 10)
        unfiltered_ms = (time.perf_counter() - unfiltered_started) * 1000
        print(
            f"\nembedded qdrant, {n} points x {dim}: upsert {upsert_s:.1f}s, "
            f"tenant-filtered search p50 {np.median(timings) * 1000:.1f} ms "
            f"max {max(timings) * 1000:.1f} ms, unfiltered {unfiltered_ms:.1f} ms"
        )
    finally:
        await store.close()
