"""Indexing of tools and capabilities into the vector store, and the in-memory read cache.

One collection per kind and tool embedder (`pml_tools__<embedder>`, `pml_capabilities__<embedder>`:
vectors of another model never meet, and changing `PML_TOOL_EMBEDDER` starts empty collections
rather than failing on their size); every point's payload holds
`tenant_id`, `id`, `kind`, `name`, `server`, `description`, `fields` (a tool's input-schema
field names) and `content_hash`. The point id is
derived from (tenant, kind, id), so re-registering an entry replaces it.

Text embedded (as a passage) for a tool or a capability: ``"<name>: <description>"``, or the
name alone when there is no description. The name carries the verb/object words agents type
("read_file"), the description the rest.

Idempotence: `content_hash` is a hash of the embedder's name and the whole payload. `index()`
embeds and writes only entries whose hash differs from the stored one, so the `ToolsRegistered`
event that follows a `RegisterTools` RPC (which indexed synchronously) changes nothing, and a
redelivered event neither re-embeds nor rewrites.

All or nothing, in bounded chunks (`writing`): a write embeds and stores `chunk` entries at a
time (the embedder and the store work in threads, so the event loop serves other requests in
between), and reads first the stored versions of the points it is about to replace. If a chunk
fails, the caller's body (a registration's publish) fails, or the request is cancelled, the
points it added are deleted and those it replaced written back: the store is as it was. Searches
see the entries once the whole write, body included, is done.

Read cache: the vector store is the system of record; for ranking, each tenant's vectors are
also kept as an (n, dim) float32 matrix per kind, loaded from the store on the tenant's first
request and updated on every upsert/delete made through this class, so a query is a single
brute-force dot product (see `docs/search.md` in this service for the measurements). The cache
holds at most `max_entries` entries over all tenants (`PML_SEARCH_CACHE_MAX_ENTRIES`): the least
recently used tenants are dropped and read again on their next request. An empty matrix counts
as one entry, so requests naming any tenant ids stay within the bound too.

Ranking is the first stage of `pml_common.first_stage`: every entry's dense similarity and BM25
score, fused. Each cached matrix keeps a lexical index of its entries; a write returns only once
the index covers what it wrote (rebuilds run in a thread, and writers that arrive during one
share the next), so what a registration stored is found by both retrievers as soon as it
returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, TypeVar

import numpy as np
import structlog

from pml_common.embedding import Embedder, catalog_text, part_dims, part_reach
from pml_common.first_stage import (
    DENSE,
    HYBRID,
    LEXICAL,
    LexicalIndex,
    Reach,
    TextScores,
    ToolText,
    hybrid_relevance,
    normalised_lexical,
    part_spans,
    script,
)
from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_search.cosine_batches import CosineBatches
from pml_search.ranking import top_k_indices
from pml_search.vector_store import VectorPoint, VectorStore

log = structlog.get_logger(__name__)

TOOL = "tool"
CAPABILITY = "capability"
KINDS = (TOOL, CAPABILITY)
_STEMS = {TOOL: "pml_tools", CAPABILITY: "pml_capabilities"}


def collections_for(embedder_name: str) -> dict[str, str]:
    """Collection of each kind for vectors of `embedder_name`."""
    slug = re.sub(r"[^a-z0-9]+", "_", embedder_name.lower()).strip("_")
    return {kind: f"{stem}__{slug}" for kind, stem in _STEMS.items()}


INDEXED_FIELDS = ("tenant_id", "id", "kind")
_POINT_NAMESPACE = uuid.UUID("6f2c1a8e-4b0d-5e7f-9a3c-2d1e0f4b5a6c")


@dataclass(frozen=True)
class CatalogEntry:
    """One tool or capability as indexed (the vector store payload, minus the hash)."""

    tenant_id: str
    id: str
    kind: str
    name: str
    server: str
    description: str
    #: Input-schema field names (tools only): read by the lexical retriever.
    fields: tuple[str, ...] = field(default=())

    def text(self) -> str:
        return catalog_text(self.name, self.description)

    def lexical(self) -> ToolText:
        return ToolText(self.id, self.server, self.name, self.description, self.fields)


class Scored(NamedTuple):
    """An entry with its first-stage relevance and the two parts it was fused from.

    A tuple: a request makes one per candidate, and a frozen dataclass costs twice as much."""

    entry: CatalogEntry
    relevance: float
    dense: float
    lexical: float


def point_id(tenant: str, kind: str, node_id: str) -> str:
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{tenant}\x00{kind}\x00{node_id}"))


def content_hash(embedder_name: str, entry: CatalogEntry) -> str:
    blob = json.dumps([embedder_name, asdict(entry)], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def entry_of(payload: dict[str, object]) -> CatalogEntry:
    return CatalogEntry(
        tenant_id=str(payload["tenant_id"]),
        id=str(payload["id"]),
        kind=str(payload["kind"]),
        name=str(payload.get("name", "")),
        server=str(payload.get("server", "")),
        description=str(payload.get("description", "")),
        fields=tuple(str(f) for f in payload.get("fields") or ()),  # type: ignore[attr-defined]
    )


def content_hashes(embedder_name: str, entries: Sequence[CatalogEntry]) -> list[str]:
    return [content_hash(embedder_name, e) for e in entries]


_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass(frozen=True)
class IndexResult:
    indexed: int  # embedded and written
    unchanged: int  # already stored with the same content hash


@dataclass
class _Undo:
    """What a write changed in one collection, to put the store back as it was."""

    collection: str
    added: list[str] = field(default_factory=list)  # point ids that were not stored
    replaced: list[VectorPoint] = field(default_factory=list)  # stored versions overwritten

    async def note(self, store: VectorStore, points: Sequence[VectorPoint]) -> None:
        """Record what writing `points` will change (call before writing them)."""
        ids = [p.id for p in points]
        previous = await store.get(self.collection, ids)
        stored = {p.id for p in previous}
        self.replaced.extend(previous)
        self.added.extend(i for i in ids if i not in stored)

    async def apply(self, store: VectorStore) -> None:
        await store.delete_ids(self.collection, self.added)
        await store.upsert(self.collection, self.replaced)


def _go_on() -> None:
    """The default `proceed` of a write: never gives up."""


class TenantMatrix:
    """Read cache of one tenant's vectors of one kind.

    Rows live in one buffer per model of the embedder (contiguous: a request's dense pass reads
    each model's columns whole), whose capacity doubles, so adding entries one event at a time
    costs amortised O(1) copies. Writers run on the event loop thread. The dense pass of
    concurrent requests runs in a worker thread (`CosineBatches`) over the first n rows: rows
    appended meanwhile are past them, and a row replaced meanwhile is written into fresh copies
    of the buffers, so a pass never reads a row half written.
    """

    def __init__(
        self,
        dim: int,
        parts: tuple[int, ...] | None = None,
        reach: tuple[Reach, ...] = (),
    ) -> None:
        self.dim = dim
        #: Widths of the embedder's models within a vector (see `EnsembleEmbedder`), and how
        #: far each reads (`embedding.part_reach`; empty: all across scripts).
        self.parts = parts or (dim,)
        self.reach = reach
        self.entries: list[CatalogEntry] = []
        self.hashes: list[str] = []
        self.index: dict[str, int] = {}
        self._buffers = [np.zeros((0, width), dtype=np.float32) for width in self.parts]
        self._cosines = CosineBatches(self._rows)
        #: Bumped by every upsert; the lexical index says which version it was built from.
        self.version = 0
        self._lexical: LexicalIndex | None = None
        self._lexical_version = -1
        self._rebuild: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def vectors(self) -> np.ndarray:
        return np.hstack(self._rows())

    def _rows(self) -> list[np.ndarray]:
        """Each model's columns of the rows in use."""
        return [buffer[: len(self.entries)] for buffer in self._buffers]

    def hash_of(self, node_id: str) -> str | None:
        i = self.index.get(node_id)
        return None if i is None else self.hashes[i]

    def upsert(
        self, entries: Sequence[CatalogEntry], hashes: Sequence[str], vecs: np.ndarray
    ) -> None:
        vecs = np.asarray(vecs, dtype=np.float32).reshape(len(entries), self.dim)
        added = sum(1 for e in dict.fromkeys(e.id for e in entries) if e not in self.index)
        self._reserve(len(self.entries) + added)
        if self._cosines.reading and any(e.id in self.index for e in entries):
            self._buffers = [buffer.copy() for buffer in self._buffers]
        for entry, digest, vec in zip(entries, hashes, vecs, strict=True):
            i = self.index.get(entry.id)
            if i is None:
                i = self.index[entry.id] = len(self.entries)
                self.entries.append(entry)
                self.hashes.append(digest)
            else:
                self.entries[i], self.hashes[i] = entry, digest
            for buffer, (start, width) in zip(self._buffers, part_spans(self.parts), strict=True):
                buffer[i] = vec[start : start + width]
        self.version += 1

    def _reserve(self, rows: int) -> None:
        capacity = self._buffers[0].shape[0]
        if rows <= capacity:
            return
        size = max(rows, 2 * capacity, 64)
        grown = [np.zeros((size, width), dtype=np.float32) for width in self.parts]
        for new, old in zip(grown, self._rows(), strict=True):
            new[: len(old)] = old
        self._buffers = grown

    async def lexical_index(self) -> LexicalIndex:
        """A lexical index of every entry upserted so far (rebuilt in a thread if stale)."""
        while self._lexical is None or self._lexical_version < self.version:
            if self._rebuild is None:
                self._rebuild = asyncio.create_task(self._rebuild_lexical())
            await asyncio.shield(self._rebuild)
        return self._lexical

    async def _rebuild_lexical(self) -> None:
        version, docs = self.version, [e.lexical() for e in self.entries]
        try:
            built = await asyncio.to_thread(LexicalIndex.build, docs)
            self._lexical, self._lexical_version = built, version
        finally:
            self._rebuild = None

    async def rank(
        self, texts: Sequence[str], vectors: np.ndarray, k: int, retriever: str
    ) -> list[Scored]:
        """The `k` most relevant entries by the `retriever`'s first-stage relevance.

        `texts[0]` is the request and `vectors[0]` its embedding; the hybrid retriever blends
        in the sub-goals that follow (`first_stage.hybrid_relevance`).
        """
        if not self.entries:
            return []
        index = await self.lexical_index() if retriever != DENSE else None
        # The pass reads at least the rows the lexical index covers; rows added since (by a
        # write still under way) have no lexical score yet.
        top = await self._cosines.finished(
            np.asarray(vectors, dtype=np.float32),
            lambda cosines: _top_relevant(cosines, texts, index, k, retriever, self.reach),
        )
        return [Scored(self.entries[i], r, d, lex) for i, r, d, lex in top]


def _top_relevant(
    cosines: np.ndarray,
    texts: Sequence[str],
    index: LexicalIndex | None,
    k: int,
    retriever: str,
    reach: tuple[Reach, ...] = (),
) -> list[tuple[int, float, float, float]]:
    """(row, relevance, dense, lexical) of the `k` most relevant rows, from the (models,
    texts, rows) cosines of `texts` (the request, then its sub-goals); run in the dense pass's
    worker thread (`CosineBatches.finished`)."""
    rows = cosines.shape[-1]
    parts = [
        TextScores(cosines[:, j], *_lexical(index, text, rows)) for j, text in enumerate(texts)
    ]
    models, bm25 = parts[0].dense, parts[0].lexical
    dense, lexical = models.mean(axis=0), normalised_lexical(bm25)
    if retriever == HYBRID:
        relevance = hybrid_relevance(parts[0], parts[1:], reach)
    else:
        relevance = lexical if retriever == LEXICAL else dense
    top = top_k_indices(relevance, k)
    # Read out as lists at once: one numpy scalar per entry and score costs more than the
    # fusion (a profile of the search service under load).
    return list(
        zip(
            top.tolist(),
            relevance[top].tolist(),
            dense[top].tolist(),
            lexical[top].tolist(),
            strict=True,
        )
    )


def _lexical(
    index: LexicalIndex | None, text: str, rows: int
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """BM25 scores of `rows` entries, those in another script than `text`, and its script; the
    rows the index does not cover yet (a write under way) score 0 and count as in the text's
    script."""
    if index is None:
        return np.zeros(rows), None, script(text)
    scores, foreign, text_script = index.scored(text)
    return _padded(scores, rows), None if foreign is None else _padded(foreign, rows), text_script


def _padded(scores: np.ndarray, rows: int) -> np.ndarray:
    return np.pad(scores, (0, rows - len(scores))) if len(scores) < rows else scores


@dataclass(eq=False)
class _Load:
    """A read of one tenant's entries under way, shared by every request that needs them; a
    deletion meanwhile makes it stale."""

    task: asyncio.Task[TenantMatrix] | None = None
    stale: bool = False


def _retrieved(task: asyncio.Task[TenantMatrix]) -> None:
    """A shared read that failed when nobody waited for it any more is logged, not lost."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("catalog cache read failed", error=repr(error))


def _weight(matrix: TenantMatrix) -> int:
    return max(1, len(matrix))


#: Default of `max_entries`: the setting's.
MAX_ENTRIES: int = Settings.model_fields["search_cache_max_entries"].default
#: Default of a write's `chunk`: the setting's.
WRITE_CHUNK: int = Settings.model_fields["catalog_write_chunk"].default


class CatalogIndex:
    """Writes the catalog into the vector store and answers nearest-neighbour queries."""

    def __init__(
        self,
        store: VectorStore,
        embedder: Embedder,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self.collections = collections_for(embedder.name)
        self._parts = part_dims(embedder)
        self._reach = part_reach(embedder)
        self._cache: TenantCache[tuple[str, str], TenantMatrix] = TenantCache(
            "search.catalog", max_entries, _weight, busy=lambda key: self._writing(key[0])
        )
        # Reads of the store under way, per (tenant, kind): see `is_cached` and `_matrix`. Only
        # while they run.
        self._loading: dict[tuple[str, str], _Load] = {}
        # Held by writers only; a lock nobody holds or waits for is forgotten with its tenant.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    async def start(self) -> None:
        for collection in self.collections.values():
            await self._store.ensure_collection(collection, self._embedder.dim, INDEXED_FIELDS)

    # --- writes -------------------------------------------------------------------------------

    async def index(
        self,
        tenant: str,
        kind: str,
        entries: Sequence[CatalogEntry],
        chunk: int = WRITE_CHUNK,
    ) -> IndexResult:
        """Embed and store the entries whose content changed; all or nothing (`writing`)."""
        async with self.writing(tenant, kind, entries, chunk=chunk) as result:
            return result

    @asynccontextmanager
    async def writing(
        self,
        tenant: str,
        kind: str,
        entries: Sequence[CatalogEntry],
        *,
        chunk: int = WRITE_CHUNK,
        proceed: Callable[[], None] = _go_on,
    ) -> AsyncIterator[IndexResult]:
        """Store the entries whose content changed, run the body, then serve them.

        Entries are embedded and stored `chunk` at a time, `proceed()` called before each chunk
        (it raises to give up, e.g. past the caller's deadline). The body runs once all are
        stored. If storing fails, the body raises or the task is cancelled, the store is put
        back as it was and the exception goes on. The tenant's writes wait for one another
        until the entries are served (in the cache, and covered by its lexical index).
        """
        entries = list({e.id: e for e in entries}.values())
        async with self._lock(tenant):
            matrix = await self._matrix(tenant, kind)
            todo = await self._changed(matrix, entries, chunk)
            undo = _Undo(self.collections[kind])
            try:
                vectors = await self._store_chunks(tenant, kind, todo, undo, chunk, proceed)
                yield IndexResult(indexed=len(todo), unchanged=len(entries) - len(todo))
            except BaseException:
                await self._put_back(tenant, kind, undo)
                raise
            try:
                await self._serve(matrix, todo, vectors)
            except BaseException:
                # Stored whole, served in part: the next request reads the store again.
                self._cache.pop((tenant, kind))
                raise
            self._cache.shrink()  # the matrix grew: other tenants may have to give way
            log.info(
                "catalog indexed",
                tenant=tenant,
                kind=kind,
                indexed=len(todo),
                unchanged=len(entries) - len(todo),
            )

    async def _changed(
        self, matrix: TenantMatrix, entries: Sequence[CatalogEntry], chunk: int
    ) -> list[tuple[CatalogEntry, str]]:
        """The entries whose content differs from the cached one, with their new hash."""
        name = self._embedder.name
        todo: list[tuple[CatalogEntry, str]] = []
        for part in chunks(entries, chunk):
            hashes = await asyncio.to_thread(content_hashes, name, part)
            todo.extend(
                (e, h) for e, h in zip(part, hashes, strict=True) if matrix.hash_of(e.id) != h
            )
        return todo

    async def _store_chunks(
        self,
        tenant: str,
        kind: str,
        todo: Sequence[tuple[CatalogEntry, str]],
        undo: _Undo,
        chunk: int,
        proceed: Callable[[], None],
    ) -> list[np.ndarray]:
        """Embed and store `todo` a chunk at a time; the vectors of each chunk, in order."""
        vectors = []
        for part in chunks(todo, chunk):
            proceed()
            vecs = await self._embedder.embed_passages([e.text() for e, _ in part])
            points = [
                VectorPoint(
                    id=point_id(tenant, kind, e.id),
                    vector=vec,
                    payload={**asdict(e), "content_hash": h},
                )
                for (e, h), vec in zip(part, vecs, strict=True)
            ]
            await undo.note(self._store, points)
            await self._store.upsert(self.collections[kind], points)
            vectors.append(vecs)
        return vectors

    async def _put_back(self, tenant: str, kind: str, undo: _Undo) -> None:
        """Undo a write that did not complete, even if the task is being cancelled."""
        try:
            await asyncio.shield(undo.apply(self._store))
        except Exception:
            # The write's own failure is what the caller hears about; this one is logged.
            log.exception(
                "catalog write could not be undone",
                tenant=tenant,
                kind=kind,
                added=len(undo.added),
                replaced=len(undo.replaced),
            )

    async def _serve(
        self,
        matrix: TenantMatrix,
        todo: Sequence[tuple[CatalogEntry, str]],
        vectors: Sequence[np.ndarray],
    ) -> None:
        """Put stored entries in the cached matrix, a chunk per turn of the loop."""
        done = 0
        for vecs in vectors:
            part = todo[done : done + len(vecs)]
            matrix.upsert([e for e, _ in part], [h for _, h in part], vecs)
            done += len(vecs)
            await asyncio.sleep(0)
        if todo:
            await matrix.lexical_index()

    async def delete_tenant(self, tenant: str) -> int:
        """Remove every point of the tenant from both collections; returns how many."""
        async with self._lock(tenant):
            deleted = 0
            for kind, collection in self.collections.items():
                deleted += await self._store.delete(collection, {"tenant_id": tenant})
                self._cache.pop((tenant, kind))
                if (load := self._loading.get((tenant, kind))) is not None:
                    load.stale = True
            return deleted

    # --- reads --------------------------------------------------------------------------------

    def is_cached(self, tenant: str, kind: str) -> bool:
        """Whether this replica holds the entries, or is reading them: a change announced
        meanwhile must be applied too, since the read may have come before it."""
        key = (tenant, kind)
        return key in self._cache or key in self._loading

    async def ranked(
        self,
        tenant: str,
        kind: str,
        texts: Sequence[str],
        vectors: np.ndarray,
        limit: int,
        retriever: str,
    ) -> list[Scored]:
        """The `limit` entries of `kind` most relevant to a request: its text and embedding
        first, then those of its sub-goals (see `TenantMatrix.rank`)."""
        matrix = await self._matrix(tenant, kind)
        return await matrix.rank(texts, vectors, limit, retriever)

    async def get(self, tenant: str, kind: str, node_id: str) -> CatalogEntry | None:
        matrix = await self._matrix(tenant, kind)
        i = matrix.index.get(node_id)
        return None if i is None else matrix.entries[i]

    async def missing(self, tenant: str, kind: str, ids: Iterable[str]) -> list[str]:
        """The ids (in order, once each) that are not in the tenant's catalog."""
        matrix = await self._matrix(tenant, kind)
        return [i for i in dict.fromkeys(ids) if i not in matrix.index]

    async def size(self, tenant: str, kind: str) -> int:
        return len(await self._matrix(tenant, kind))

    # --- cache --------------------------------------------------------------------------------

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    def _writing(self, tenant: str) -> bool:
        lock = self._locks.get(tenant)
        return lock is not None and lock.locked()

    async def _matrix(self, tenant: str, kind: str) -> TenantMatrix:
        """The tenant's cached matrix, read from the store if need be.

        Requests share one read, and a request that gives up (its deadline, a cancel) leaves it
        running for the next: a large tenant's first read (100,000 tools) can take longer than
        a client waits, and restarting it with every request would never serve the tenant.
        """
        key = (tenant, kind)
        matrix = self._cache.get(key)
        if matrix is not None:
            return matrix
        load = self._loading.get(key)
        if load is None:
            load = self._loading[key] = _Load()
            load.task = asyncio.create_task(self._load_once(key, load))
            load.task.add_done_callback(_retrieved)
        assert load.task is not None
        return await asyncio.shield(load.task)

    async def _load_once(self, key: tuple[str, str], load: _Load) -> TenantMatrix:
        try:
            matrix = await self._load(*key)
        finally:
            del self._loading[key]
        if load.stale:  # deleted meanwhile: serve nothing
            return TenantMatrix(self._embedder.dim, self._parts, self._reach)
        return self._cache.setdefault(key, matrix)

    async def _load(self, tenant: str, kind: str) -> TenantMatrix:
        matrix = TenantMatrix(self._embedder.dim, self._parts, self._reach)
        points = await self._store.scan(self.collections[kind], {"tenant_id": tenant})
        if points:
            entries = [entry_of(dict(p.payload)) for p in points]
            hashes = [str(p.payload.get("content_hash", "")) for p in points]
            vecs = np.asarray([p.vector for p in points], dtype=np.float32)
            matrix.upsert(entries, hashes, vecs)
        log.debug("catalog cache loaded", tenant=tenant, kind=kind, points=len(points))
        return matrix
