"""Propagation from the question: Personalized PageRank over the concept ↔ section graph.

The `graph-ppr` method of Ask (issue 14, item 1) ranks a tenant's SectionContexts by a random
walk that starts from the question's seed concepts, as HippoRAG does over its passage graph.
The walk runs on the graph of seed 001 §3, read as one weighted graph, undirected but for
the title routes:

- concept — section, for each `MENTIONED_IN`, weighted by the mention's salience;
- topic — section, for a section under a topic (its `topic_ids`), weight `TOPIC_SECTION`;
- topic — concept, for each `COVERS`, weighted by its confidence × `COVERS_SHARE`;
- concept — topic of the same key (a document's title named as a concept in another's text),
  weight `SAME_KEY`;
- concept → topic, one way, for a concept that names a document (`title_links`: its key, or
  a run of its words, is a title or a title's bare form: "north-west Iowa" names Iowa, "West
  Chicago High School" names "West Chicago, Illinois"; the links come from the tenant's name
  index, `NameIndex.title_links`), weighted `TITLE_ROUTE` × the saliences of the concept's
  mentions: a walker at a concept goes to the document it names three times in four, and to
  the other sections that mention it otherwise. A bridge entity of a multi-hop question is
  most often a name written in the first document that is the title of the second; without
  this edge a name mentioned in many sections ("Kansas") sent almost all of its walk to those
  mentions and almost none to its article;
- concept — concept, for each evidenced semantic relation (Pass 3; never one without evidence,
  invariant I2), weighted by its confidence × `RELATION_SHARE`.

At each step the walker follows an edge of its node with probability proportional to the
edge's weight, or, with probability 1 − `DAMPING`, restarts on a seed drawn by the seeds'
restart weights (`restart_weights`): the inverse of the number of sections that mention the
seed (HippoRAG's node specificity), halved for a seed inside a longer one, and `TOPIC_SEED`
times more for a seed that names a structural topic (a heading: in a corpus of articles, the
title of the one the question is about). The stationary probability of each section is its
score: a section is high when many short, specific routes lead to it from the seeds, which is
where the unnamed bridge entity of a multi-hop question is written.

Two implementations give the same ranking: the GDS plugin's `gds.pageRank` with weighted
`sourceNodes` when it is installed (`pml_search.gds.GdsPageRank`), else power iteration here on
a scipy.sparse CSR matrix. The in-process graph is read once per tenant and kept in a
`TenantCache` bounded by `CACHE_MAX_WEIGHT` (nodes plus edges over all tenants), dropped when the
tenant's graph changes (`invalidate`, called from `knowledge_consumers` on the pass and deletion
events) and read again on its next question; reading it costs one pass over the tenant's
mentions, then a question costs a few sparse products. The index of the tenant's concept names
that links a question to its seeds (`pml_search.seed_linking.NameIndex`) is kept and dropped
the same way; the vectors of its entity and topic names (dense links) are computed with it by
the passage embedder, after it is served for a tenant of more than `DENSE_SYNC_NAMES`.

A tenant whose last read took `STALE_AFTER_S` or more (thousands of documents) would make
every question wait that long while it ingests, as each pass that completes changes its graph:
its questions are answered from the graph read before the change while the new one is read
(`pml.graph_stale` on the question's span), so the newest documents of a large tenant reach
answers a read later. A small tenant's question always waits for the new graph, and a
document's or tenant's deletion drops the old graph at once (nothing deleted is planned again).

Nor does a question wait for the read after an ingestion: once a tenant's graph has been quiet
for a while after a pass's change, its names and graph are read in the background
(`pml_search.read_ahead`), so the first question after an ingestion finds them read (on
MuSiQue's 1,890 documents that read takes about 2 s, the names most of it). A tenant's first
question after the service starts, or after a deletion, still waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import structlog
from opentelemetry import trace
from scipy import sparse

from pml_common.embedding import Embedder
from pml_common.tenant_cache import TenantCache
from pml_search import read_ahead
from pml_search.evidence_plan import SUBSUMED_FACTOR, Seed
from pml_search.knowledge_reads import GraphRows, KnowledgeReads
from pml_search.seed_linking import Draft, NameIndex, title_links

log = structlog.get_logger(__name__)

#: Probability of following an edge rather than restarting on a seed (HippoRAG: 0.5). A
#: bridge section is three steps from a seed concept (seed → section → bridge concept →
#: section), so the walk must go further than HippoRAG's, whose entities link directly.
DAMPING = 0.85
#: Power iteration (in float32) stops when the L1 change of the scores is below this, or after
#: that many steps. 1e-3 gives the same rankings as 1e-6 on both dev sets in a quarter of the
#: time (about 45 steps instead of 85; 16 ms instead of 63 per question on MuSiQue's graph).
TOLERANCE = 1e-3
MAX_ITERATIONS = 100
#: Restart weight of a seed that names a topic, relative to a concept of the same frequency.
TOPIC_SEED = 10.0
#: Edge weights besides salience (see the module doc).
TOPIC_SECTION = 1.0
COVERS_SHARE = 0.5
SAME_KEY = 1.0
#: A concept naming a document sends this many times its mentions' weight to the document's
#: topic (3: three walkers in four; 0.5, 1, 3 and 10 measured on the dev sets, see
#: docs/benchmarks.md).
TITLE_ROUTE = 3.0
RELATION_SHARE = 1.0
#: Nodes plus edges kept over all tenants (MuSiQue's 1,890 documents weigh about 10⁵).
CACHE_MAX_WEIGHT = 2_000_000
#: Names, trigrams and name vectors kept over all tenants for linking questions, about 8
#: bytes each (MuSiQue: about 4 × 10⁶, see `NameIndex.weight`).
NAMES_MAX_WEIGHT = 12_000_000
#: A tenant with more entity and topic names than this gets its name index at once and its
#: dense links once the names are embedded in the background (10,000 names: about 5 s of CPU
#: with Universal Sentence Encoder), so its first question does not wait for them.
DENSE_SYNC_NAMES = 2_000
#: A tenant whose last read took this long is answered from its previous graph while the new
#: one is read (see the module doc).
STALE_AFTER_S = 1.0

V = TypeVar("V")


@dataclass(frozen=True)
class PropagationGraph:
    """One tenant's concept ↔ section graph, ready for power iteration.

    Nodes are numbered concepts first, then topics, then sections; `walk` is the column-
    stochastic transition matrix (column j: where a walker at node j goes; a node without
    edges has an empty column, and its mass restarts on the seeds)."""

    concepts: dict[str, int]
    topics: dict[str, int]
    sections: tuple[str, ...]
    documents: tuple[str, ...]
    walk: sparse.csr_array
    edges: int

    @property
    def size(self) -> int:
        return len(self.concepts) + len(self.topics) + len(self.sections)

    @property
    def first_section(self) -> int:
        return len(self.concepts) + len(self.topics)

    @property
    def weight(self) -> int:
        """Its cost in the cache: nodes plus edges (an empty graph counts as one)."""
        return max(1, self.size + self.edges)

    def seed_nodes(self, key: str) -> list[int]:
        """The nodes a seed key names: its concept, its topic, or both."""
        return [n for n in (self.concepts.get(key), self.topics.get(key)) if n is not None]


class _Edges:
    """Edge lists while a graph is built (one entry per direction is added at the end)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.weights: list[float] = []

    def add(self, a: int, b: int, weight: float) -> None:
        if weight > 0 and a != b:
            self.rows.append(a)
            self.cols.append(b)
            self.weights.append(weight)


def build_graph(
    rows: GraphRows, links: Iterable[tuple[str, str]] | None = None
) -> PropagationGraph:
    """The transition matrix of a tenant's graph from its rows (see `KnowledgeReads.graph`);
    `links` are its concepts that name a document (`NameIndex.title_links`; by default those
    that name one by a topic's key)."""
    concept_keys = sorted(
        {k for s in rows.sections for k in s.concepts}
        | {k for c in rows.covers for k in c.concepts}
        | {k for r in rows.relations for k in (r.source, r.target)}
    )
    concepts = {k: i for i, k in enumerate(concept_keys)}
    topic_keys = sorted(
        {t for s in rows.sections for t in s.topic_ids} | {c.topic_id for c in rows.covers}
    )
    topics = {t: len(concepts) + i for i, t in enumerate(topic_keys)}
    first_section = len(concepts) + len(topics)
    edges = _Edges()
    mentions = np.zeros(len(concepts), dtype=np.float64)
    for offset, section in enumerate(rows.sections):
        node = first_section + offset
        for key, salience in section.concepts.items():
            edges.add(concepts[key], node, salience)
            mentions[concepts[key]] += max(salience, 0.0)
        for topic in section.topic_ids:
            edges.add(topics[topic], node, TOPIC_SECTION)
    for cover in rows.covers:
        for key, confidence in cover.concepts.items():
            edges.add(topics[cover.topic_id], concepts[key], COVERS_SHARE * confidence)
    for key, node in topics.items():
        if key in concepts:
            edges.add(concepts[key], node, SAME_KEY)
    for relation in rows.relations:
        edges.add(
            concepts[relation.source], concepts[relation.target], RELATION_SHARE * relation.weight
        )
    routes = _Edges()
    if links is None:
        links = title_links(concepts, {t: t for t in topics})
    for key, topic in links:
        if key in concepts and topic in topics:  # the names may be read apart from the graph
            concept = concepts[key]
            routes.add(topics[topic], concept, TITLE_ROUTE * float(mentions[concept]))
    walk = _transitions(edges, first_section + len(rows.sections), routes)
    return PropagationGraph(
        concepts=concepts,
        topics=topics,
        sections=tuple(s.context_id for s in rows.sections),
        documents=tuple(s.document_id for s in rows.sections),
        walk=walk,
        edges=len(edges.weights) + len(routes.weights),
    )


def _transitions(edges: _Edges, size: int, one_way: _Edges | None = None) -> sparse.csr_array:
    """Column-stochastic matrix of the graph: column j holds, for each neighbour i of j,
    weight(i, j) / Σ weights of j (parallel edges add up). `edges` are walked both ways, each
    of `one_way` from its second node (column) to its first (row) only."""
    extra = one_way or _Edges()
    rows = np.asarray(edges.rows + edges.cols + extra.rows, dtype=np.int64)
    cols = np.asarray(edges.cols + edges.rows + extra.cols, dtype=np.int64)
    weights = np.asarray(edges.weights + edges.weights + extra.weights, dtype=np.float64)
    adjacency = sparse.coo_array((weights, (rows, cols)), shape=(size, size)).tocsc()
    adjacency.sum_duplicates()
    degree = np.asarray(adjacency.sum(axis=0)).ravel()
    scale = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    return sparse.csr_array(adjacency @ sparse.diags_array(scale)).astype(np.float32)


def restart_weights(seeds: Iterable[Seed]) -> list[tuple[str, float]]:
    """Each seed's share of the restarts, before normalisation (see the module doc), times
    what its link kept of it (`Seed.factor`: a fuzzy link's score, a word inside a named
    entity cut down)."""
    weighted = []
    for seed in seeds:
        weight = seed.factor / max(1, seed.sections)
        if seed.subsumed:
            weight *= SUBSUMED_FACTOR
        if seed.topic:
            weight *= TOPIC_SEED
        weighted.append((seed.key, weight))
    return weighted


def restart_vector(graph: PropagationGraph, seeds: Iterable[tuple[str, float]]) -> np.ndarray:
    """The restart distribution: each (key, weight) on the nodes the key names, summing to 1
    (all zeros when no seed is in the graph)."""
    restart = np.zeros(graph.size, dtype=np.float64)
    for key, weight in seeds:
        nodes = graph.seed_nodes(key)
        for node in nodes:
            restart[node] += weight / len(nodes)
    total = restart.sum()
    return (restart / total if total > 0 else restart).astype(np.float32)


def personalized_pagerank(
    graph: PropagationGraph,
    restart: np.ndarray,
    damping: float = DAMPING,
    tolerance: float = TOLERANCE,
    max_iterations: int = MAX_ITERATIONS,
) -> np.ndarray:
    """Stationary distribution of the walk restarting on `restart` (power iteration); the mass
    of dangling nodes restarts too, so the scores always sum to 1."""
    scores = restart.copy()
    if not restart.any():
        return scores
    for _ in range(max_iterations):
        following = damping * (graph.walk @ scores)
        following += (1.0 - following.sum()) * restart
        change = float(np.abs(following - scores).sum())
        scores = following
        if change < tolerance:
            break
    return scores


def section_scores(
    graph: PropagationGraph, scores: np.ndarray, limit: int
) -> tuple[dict[str, float], dict[str, str]]:
    """The `limit` best sections with a positive score (context id → score) and their
    documents."""
    values = scores[graph.first_section :]
    order = np.argsort(-values, kind="stable")[:limit]
    ranked = {graph.sections[i]: float(values[i]) for i in order if values[i] > 0}
    documents = {graph.sections[i]: graph.documents[i] for i in order if values[i] > 0}
    return ranked, documents


class _TenantLoads(Generic[V]):
    """Values read per tenant on first use, kept in a `TenantCache` until invalidated; one
    load per tenant at a time (shared by concurrent questions), and a load that the tenant's
    graph changed during is not kept as current (it may be stale). A tenant whose last load
    took `stale_after_s` or more gets its previous value while the next one loads."""

    def __init__(
        self,
        name: str,
        capacity: int,
        weigh: Callable[[V], int],
        load: Callable[[str], Awaitable[V]],
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self._name = name
        self._values: TenantCache[str, V] = TenantCache(name, capacity, weigh=weigh)
        self._load = load
        self._loading: dict[str, asyncio.Task[V]] = {}
        self._changed_while_loading: set[str] = set()
        self._stale_after_s = stale_after_s
        #: Tenants whose cached value is from before their last change (kept, within the
        #: cache's bound, because their loads are slow).
        self._outdated: set[str] = set()
        self._load_s: dict[str, float] = {}

    def invalidate(self, tenant: str, removed: bool = False) -> None:
        """The tenant's graph changed: load again on next use. `removed`: something was
        deleted, so the previous value may not be served meanwhile."""
        if removed or self.load_s(tenant) < self._stale_after_s:
            self._values.pop(tenant)
            self._outdated.discard(tenant)
        else:
            self._outdated.add(tenant)
        if removed:
            self._load_s.pop(tenant, None)
        if tenant in self._loading:
            self._changed_while_loading.add(tenant)

    def cached(self, tenant: str) -> bool:
        return tenant in self._values and tenant not in self._outdated

    def load_s(self, tenant: str) -> float:
        """How long the tenant's last load took (0 before its first)."""
        return self._load_s.get(tenant, 0.0)

    async def get(self, tenant: str) -> V:
        cached = self._values.get(tenant)
        if cached is not None and tenant not in self._outdated:
            return cached
        task = self._loading.get(tenant)
        if task is None:
            task = asyncio.create_task(self._timed_load(tenant))
            self._loading[tenant] = task
            task.add_done_callback(lambda _: self._loaded(tenant))
        if cached is not None:
            trace.get_current_span().set_attribute("pml.graph_stale", True)
            log.debug("knowledge.stale_served", cache=self._name, tenant=tenant)
            return cached
        return await asyncio.shield(task)

    async def _timed_load(self, tenant: str) -> V:
        started = time.monotonic()
        value = await self._load(tenant)
        self._load_s[tenant] = time.monotonic() - started
        return value

    def _loaded(self, tenant: str) -> None:
        task = self._loading.pop(tenant)
        changed = tenant in self._changed_while_loading
        self._changed_while_loading.discard(tenant)
        if task.cancelled() or task.exception() is not None:
            return
        if not changed:
            self._values.put(tenant, task.result())
            self._outdated.discard(tenant)
        elif tenant in self._outdated and tenant in self._values:
            # Newer than the value served meanwhile, though not current: served until the
            # next load (started by the next question) lands.
            self._values.put(tenant, task.result())


class Propagation:
    """Each tenant's graph, and the index of its concept names that links questions to it
    (`pml_search.seed_linking`), each read on first use and kept until the graph changes."""

    def __init__(
        self,
        reads: KnowledgeReads,
        capacity: int = CACHE_MAX_WEIGHT,
        names_embedder: Embedder | None = None,
        read_ahead_s: float = read_ahead.DELAY_S,
    ) -> None:
        self._reads = reads
        #: embeds the entities' and topics' names for dense links (none: no dense links)
        self._names_embedder = names_embedder
        self._embeddings: set[asyncio.Task[None]] = set()
        self._graphs = _TenantLoads(
            "knowledge-propagation", capacity, lambda g: g.weight, self._load
        )
        self._names = _TenantLoads(
            "knowledge-names", NAMES_MAX_WEIGHT, lambda n: n.weight, self._load_names
        )
        #: reads the graph, and through it the names
        self._read_ahead = read_ahead.ReadAhead("knowledge-propagation", self.graph, read_ahead_s)

    def invalidate(self, tenant: str, removed: bool = False) -> None:
        """The tenant's graph changed: read it (and its names) again on next use; `removed`:
        by a deletion (see the module doc)."""
        self._graphs.invalidate(tenant, removed)
        self._names.invalidate(tenant, removed)
        if removed:  # a deleted tenant is not read again; after a document's deletion, on ask
            self._read_ahead.drop(tenant)
        else:
            self._read_ahead.changed(
                tenant, self._graphs.load_s(tenant) + self._names.load_s(tenant)
            )

    async def close(self) -> None:
        """Drops the reads ahead (the service is stopping)."""
        await self._read_ahead.close()

    def cached(self, tenant: str) -> bool:
        return self._graphs.cached(tenant)

    def names_cached(self, tenant: str) -> bool:
        return self._names.cached(tenant)

    async def graph(self, tenant: str) -> PropagationGraph:
        return await self._graphs.get(tenant)

    async def names(self, tenant: str) -> NameIndex:
        """The tenant's concept and topic names, indexed for linking a question."""
        return await self._names.get(tenant)

    async def _load_names(self, tenant: str) -> NameIndex:
        rows = await self._reads.names(tenant)
        index = await asyncio.to_thread(NameIndex, rows)
        log.info("knowledge.names_indexed", tenant=tenant, names=len(index.keys))
        if self._names_embedder is None or not index.dense_names:
            return index
        if len(index.dense_names) <= DENSE_SYNC_NAMES:
            await self._embed_names(tenant, index, self._names_embedder)
        else:
            task = asyncio.create_task(self._embed_names(tenant, index, self._names_embedder))
            self._embeddings.add(task)
            task.add_done_callback(self._embeddings.discard)
        return index

    @staticmethod
    async def _embed_names(tenant: str, index: NameIndex, embedder: Embedder) -> None:
        """Gives the index its name vectors; a failure leaves it without dense links."""
        started = time.monotonic()
        try:
            index.with_vectors(await embedder.embed_passages(index.dense_names))
        except Exception:
            log.exception("knowledge.names_not_embedded", tenant=tenant)
            return
        log.info(
            "knowledge.names_embedded",
            tenant=tenant,
            names=len(index.dense_names),
            seconds=round(time.monotonic() - started, 2),
        )

    async def settle(self) -> None:
        """Waits for the name vectors being computed in the background."""
        await asyncio.gather(*self._embeddings)

    async def embed_spans(self, names: NameIndex, draft: Draft) -> dict[str, np.ndarray]:
        """The unit vectors of a question's unlinked named spans, for dense links: none
        without an embedder, or while `names` has no name vectors to compare them with."""
        spans = list(dict.fromkeys(text for text, _, _ in draft.unlinked))
        if self._names_embedder is None or not spans or not names.has_vectors:
            return {}
        vectors = await self._names_embedder.embed_queries(spans)
        return dict(zip(spans, vectors, strict=True))

    async def _load(self, tenant: str) -> PropagationGraph:
        rows = await self._reads.graph(tenant)
        links = (await self.names(tenant)).title_links
        graph = await asyncio.to_thread(build_graph, rows, links)
        log.info(
            "knowledge.propagation_graph_read",
            tenant=tenant,
            concepts=len(graph.concepts),
            topics=len(graph.topics),
            sections=len(graph.sections),
            edges=graph.edges,
        )
        return graph

    async def sections(
        self, tenant: str, seeds: Sequence[Seed], limit: int
    ) -> tuple[dict[str, float], dict[str, str]]:
        """The sections the walk from `seeds` reaches most, best first, with their documents."""
        graph = await self.graph(tenant)
        restart = restart_vector(graph, restart_weights(seeds))
        if not restart.any():
            return {}, {}
        scores = await asyncio.to_thread(personalized_pagerank, graph, restart)
        return section_scores(graph, scores, limit)


def normalised(scores: Mapping[str, float]) -> dict[str, float]:
    top = max(scores.values(), default=0.0)
    return {k: v / top for k, v in scores.items()} if top > 0 else {}
