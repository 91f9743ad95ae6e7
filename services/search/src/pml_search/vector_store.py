"""The search service's vector storage: one interface, one implementation per backend.

Search is the only service that talks to the vector store (so the embedded, single-process
store works). Every point's payload carries `tenant_id` and every read of the search service
filters by it. Vectors are compared by cosine similarity; backends may store them normalised,
so `get`/`scan` return unit vectors, not necessarily the exact arrays written.

The embedded store (qdrant-client's local mode) does all its work synchronously, SQLite commits
included: every call to it runs on one thread of its own, so a large write never blocks the
event loop (other requests keep flowing) and the store is still used by one thread at a time.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import UnexpectedResponse

from pml_common.settings import Settings
from pml_common.stores import qdrant_client

#: field -> exact value, or any of several values (all fields must match).
Filter = Mapping[str, str | Sequence[str]]

TENANT_FIELD = "tenant_id"
T = TypeVar("T")


@dataclass(frozen=True)
class VectorPoint:
    id: str
    vector: np.ndarray
    payload: dict[str, Any]


@dataclass(frozen=True)
class VectorHit:
    id: str
    score: float
    payload: dict[str, Any]


class VectorStore(ABC):
    """Collections of (id, vector, payload) points with cosine search and payload filters."""

    @abstractmethod
    async def ensure_collection(
        self, name: str, dim: int, indexed_fields: Sequence[str] = ()
    ) -> None:
        """Create the collection if missing; fail if it exists with another dimension."""

    @abstractmethod
    async def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or replace points by id; every payload must carry `tenant_id`."""

    @abstractmethod
    async def search(
        self, collection: str, vector: np.ndarray, limit: int, where: Filter | None = None
    ) -> list[VectorHit]:
        """The `limit` points most similar to `vector` (cosine), best first."""

    @abstractmethod
    async def get(self, collection: str, ids: Sequence[str]) -> list[VectorPoint]:
        """The points with these ids, in the order asked; unknown ids are skipped."""

    @abstractmethod
    async def scan(self, collection: str, where: Filter | None = None) -> list[VectorPoint]:
        """Every point matching `where`, with vectors (used to load a tenant's read cache)."""

    @abstractmethod
    async def payloads(
        self, collection: str, where: Filter | None = None, fields: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """The payload of every point matching `where` (only `fields` of it, if given), without
        vectors: for reading what a collection holds, e.g. to copy it into another."""

    @abstractmethod
    async def collections(self) -> list[str]:
        """The names of every collection, sorted."""

    @abstractmethod
    async def delete(self, collection: str, where: Filter) -> int:
        """Delete the points matching `where` (never empty); returns how many there were."""

    @abstractmethod
    async def delete_ids(self, collection: str, ids: Sequence[str]) -> None:
        """Delete the points with these ids; unknown ids are ignored."""

    @abstractmethod
    async def count(self, collection: str, where: Filter | None = None) -> int: ...

    @abstractmethod
    async def close(self) -> None: ...

    @property
    def embedded(self) -> bool:
        """Whether this is an in-process store that only this process uses (and that has no
        payload index: filters are evaluated point by point)."""
        return False


# --- Qdrant -----------------------------------------------------------------------------------

# Qdrant ids must be unsigned ints or UUIDs: string ids are mapped to UUIDv5 in this namespace,
# and the original id is kept in the payload under ID_FIELD (stripped from what we return).
POINT_NAMESPACE = uuid.UUID("6f1c3b8e-2a4d-5e7f-9a0b-1c2d3e4f5a6b")
ID_FIELD = "_pml_id"


def point_uuid(point_id: str) -> str:
    return str(uuid.uuid5(POINT_NAMESPACE, point_id))


def qdrant_filter(where: Filter | None) -> models.Filter | None:
    if not where:
        return None
    conditions: list[models.Condition] = []
    for key, value in where.items():
        match: models.MatchValue | models.MatchAny
        if isinstance(value, str):
            match = models.MatchValue(value=value)
        else:
            match = models.MatchAny(any=list(value))
        conditions.append(models.FieldCondition(key=key, match=match))
    return models.Filter(must=conditions)


def _matches_nothing(where: Filter | None) -> bool:
    """An empty any-of list can match no point; answer it without asking the backend."""
    return bool(where) and any(
        not isinstance(v, str) and len(v) == 0 for v in (where or {}).values()
    )


def _split_payload(payload: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    data = dict(payload or {})
    return str(data.pop(ID_FIELD, "")), data


def _vector_of(record: models.Record) -> np.ndarray:
    # Collections are created with one unnamed vector, so `record.vector` is a list of floats.
    return np.asarray(record.vector, dtype=np.float32)


class _StoreThread:
    """A thread running an event loop of its own, on which the embedded store's calls run.

    qdrant-client's local mode has `async` methods that never await: called on the service's
    loop, each would block it for its whole duration. Calls are queued here in order, one at a
    time, which is also how the local mode must be used (it has no locking of its own).
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pml-vector-store", daemon=True
        )
        self._thread.start()

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self._loop))

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class QdrantVectorStore(VectorStore):
    """Qdrant through qdrant-client's async API: a server, or the embedded local mode."""

    def __init__(self, client: AsyncQdrantClient, upsert_batch: int | None = None) -> None:
        self._client = client
        options = client.init_options
        # Payload indexes only exist on a server; local mode would just warn on each call.
        self._local = options.get("path") is not None or options.get("location") == ":memory:"
        self._thread = _StoreThread() if self._local else None
        # Local mode commits SQLite once per point (~1-2 ms each): small batches let the other
        # calls queued on the store's thread (a search's first load) pass between them.
        self._upsert_batch = upsert_batch or (64 if self._local else 512)

    async def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """Await a client call: on the store's own thread in local mode (see `_StoreThread`)."""
        if self._thread is None:
            return await call
        return await self._thread.run(call)

    @property
    def embedded(self) -> bool:
        return self._local

    @classmethod
    def from_settings(cls, settings: Settings) -> QdrantVectorStore:
        return cls(qdrant_client(settings))

    async def ensure_collection(
        self, name: str, dim: int, indexed_fields: Sequence[str] = ()
    ) -> None:
        if not await self._run(self._client.collection_exists(name)):
            try:
                await self._run(
                    self._client.create_collection(
                        name,
                        vectors_config=models.VectorParams(
                            size=dim, distance=models.Distance.COSINE
                        ),
                    )
                )
            except UnexpectedResponse as exc:
                if exc.status_code != 409:  # 409: another replica created it meanwhile
                    raise
        await self._check_dim(name, dim)
        if not self._local:
            for field in indexed_fields:
                # Idempotent on the server: re-creating an existing index is a no-op.
                await self._client.create_payload_index(
                    name, field, field_schema=models.PayloadSchemaType.KEYWORD, wait=True
                )

    async def _check_dim(self, name: str, dim: int) -> None:
        info = await self._run(self._client.get_collection(name))
        vectors = info.config.params.vectors
        size = vectors.size if isinstance(vectors, models.VectorParams) else None
        if size != dim:
            raise ValueError(
                f"collection {name!r} holds vectors of size {size}, the embedder makes {dim}: "
                "re-index into a new collection (or delete this one) after changing models"
            )

    async def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        for i in range(0, len(points), self._upsert_batch):
            batch = points[i : i + self._upsert_batch]
            # Vectors become lists of Python floats: a batch at a time, off the loop.
            structs = await asyncio.to_thread(self._to_structs, batch)
            await self._run(self._client.upsert(collection, structs, wait=True))

    @classmethod
    def _to_structs(cls, points: Sequence[VectorPoint]) -> list[models.PointStruct]:
        return [cls._to_struct(p) for p in points]

    @staticmethod
    def _to_struct(point: VectorPoint) -> models.PointStruct:
        tenant = point.payload.get(TENANT_FIELD)
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"point {point.id!r} has no `{TENANT_FIELD}` in its payload")
        vector = np.asarray(point.vector, dtype=np.float32).ravel()
        return models.PointStruct(
            id=point_uuid(point.id),
            vector=vector.tolist(),
            payload={**point.payload, ID_FIELD: point.id},
        )

    async def search(
        self, collection: str, vector: np.ndarray, limit: int, where: Filter | None = None
    ) -> list[VectorHit]:
        if limit <= 0 or _matches_nothing(where):
            return []
        response = await self._run(
            self._client.query_points(
                collection,
                query=np.asarray(vector, dtype=np.float32).ravel().tolist(),
                limit=limit,
                query_filter=qdrant_filter(where),
                with_payload=True,
            )
        )
        hits = []
        for scored in response.points:
            point_id, payload = _split_payload(scored.payload)
            hits.append(VectorHit(id=point_id, score=float(scored.score), payload=payload))
        return hits

    async def get(self, collection: str, ids: Sequence[str]) -> list[VectorPoint]:
        if not ids:
            return []
        records = await self._run(
            self._client.retrieve(
                collection, [point_uuid(i) for i in ids], with_payload=True, with_vectors=True
            )
        )
        found = {p.id: p for p in map(self._to_point, records)}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    async def scan(self, collection: str, where: Filter | None = None) -> list[VectorPoint]:
        records = await self._scroll(collection, where, with_payload=True, with_vectors=True)
        return list(map(self._to_point, records))

    async def payloads(
        self, collection: str, where: Filter | None = None, fields: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        selector: bool | list[str] = True if fields is None else list(fields)
        records = await self._scroll(collection, where, with_payload=selector, with_vectors=False)
        return [_split_payload(r.payload)[1] for r in records]

    async def _scroll(
        self,
        collection: str,
        where: Filter | None,
        *,
        with_payload: bool | list[str],
        with_vectors: bool,
    ) -> list[models.Record]:
        """Every point matching `where`, page after page."""
        if _matches_nothing(where):
            return []
        records: list[models.Record] = []
        offset: Any = None  # opaque next-page token from `scroll`, passed back unchanged
        while True:
            page, offset = await self._run(
                self._client.scroll(
                    collection,
                    scroll_filter=qdrant_filter(where),
                    limit=1024,
                    offset=offset,
                    with_payload=with_payload,
                    with_vectors=with_vectors,
                )
            )
            records.extend(page)
            if offset is None:
                return records

    async def collections(self) -> list[str]:
        response = await self._run(self._client.get_collections())
        return sorted(c.name for c in response.collections)

    @staticmethod
    def _to_point(record: models.Record) -> VectorPoint:
        point_id, payload = _split_payload(record.payload)
        return VectorPoint(id=point_id, vector=_vector_of(record), payload=payload)

    async def delete(self, collection: str, where: Filter) -> int:
        if not where:
            raise ValueError("delete needs a filter; refusing to empty the whole collection")
        if _matches_nothing(where):
            return 0
        # Qdrant does not report how many points a delete removed, so count first. Not atomic:
        # callers that write the same points concurrently serialise (catalog_index locks).
        n = await self.count(collection, where)
        if n:
            await self._run(
                self._client.delete(
                    collection,
                    points_selector=models.FilterSelector(filter=qdrant_filter(where)),
                    wait=True,
                )
            )
        return n

    async def delete_ids(self, collection: str, ids: Sequence[str]) -> None:
        for i in range(0, len(ids), self._upsert_batch):
            selector = models.PointIdsList(
                points=[point_uuid(p) for p in ids[i : i + self._upsert_batch]]
            )
            await self._run(self._client.delete(collection, points_selector=selector, wait=True))

    async def count(self, collection: str, where: Filter | None = None) -> int:
        if _matches_nothing(where):
            return 0
        result = await self._run(
            self._client.count(collection, count_filter=qdrant_filter(where), exact=True)
        )
        return int(result.count)

    async def close(self) -> None:
        await self._run(self._client.close())
        if self._thread is not None:
            self._thread.stop()
