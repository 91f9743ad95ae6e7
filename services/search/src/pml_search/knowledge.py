"""Graph-first question answering: `KnowledgeService.Ask` (seed 001 §2, §5, §8bis, §9).

    question ─seeds→ concepts of the graph ─paths→ k-shortest paths between seeds (GDS Yen, or
    the Cypher fallback), scored by §8bis ─plan→ evidence plan (SectionContexts) ─vector→ the
    chunks of the plan's sections nearest the question, ranked by semantic × plan weight

Seeds are the concepts and topics the question names, linked by key, alias or fuzzy name
(`seed_linking`, over an index of the tenant's names kept with the propagation graph).

Methods: `graph-first` plans evidence by anchoring the seeds and one bridge hop
(`evidence_plan`); `graph-ppr` ranks the sections by a Personalized PageRank from the seeds over
the concept ↔ section graph (`propagation`, GDS `pageRank` when the plugin is present), plans
the best of them, and then follows the names its best answers write: the documents their text
names (title links) gain on the others (`LINK_BONUS`, the `links` stage), as a reader follows a
link from the first document of a multi-hop question to the second (the default method: it
ranks better on every dev set, docs/benchmarks.md); `vector` is the plain baseline. Both graph
methods search paths the same way and share every invariant below.

Modes (§2.2, §8bis): REASONED when a selected path has evidence on its edges; ANCHORED when
there is no such path but the question's concepts anchor it in the graph (mentions, topics);
TEXT_ONLY when nothing of the question is in the graph, answered by plain vector search. The
invariants of §9 hold on every code path and are checked where the answer is made:

- I1: the graph is queried before the vector store (even for TEXT_ONLY, whose seed look-up is
  a graph query); `method = "vector"` is the plain baseline and is labelled so.
- I2: REASONED only with paths whose every selected edge carries evidence (`paths.may_reason`).
- I3: evidence is addressed by SectionContext (`context_id`), the vector search is filtered by
  the plan's context ids, never by chunk.

When the plan's sections hold fewer than `k` chunks, the nearest chunks outside it complete the
answer (plan weight 0, never weighted as plan evidence), so an answer always has `k` chunks when
the tenant has them; the answer says how many (`topped_up`: all of them for TEXT_ONLY).
Each stage runs in its own span and is timed in the answer. The question is embedded while the
graph is queried (that reads no store); the `embed` stage is what is left to wait for it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np
from opentelemetry import trace

from pml_search import evidence_plan as planning
from pml_search.chunk_index import ChunkHit, ChunkIndex
from pml_search.evidence_plan import EvidencePlan, Seed
from pml_search.gds import GdsPageRank, GdsPaths
from pml_search.knowledge_reads import PATHS_PER_PAIR, KnowledgeReads, Route
from pml_search.paths import MAX_HOPS, Edge, Mode, Path, answer_mode, build_path, select_paths
from pml_search.propagation import Propagation, restart_weights
from pml_search.seed_linking import NameIndex

_tracer = trace.get_tracer("pml_search.knowledge")

GRAPH_FIRST = "graph-first"
GRAPH_PPR = "graph-ppr"
VECTOR = "vector"
METHODS = (GRAPH_FIRST, VECTOR, GRAPH_PPR)
GRAPH_METHODS = (GRAPH_FIRST, GRAPH_PPR)
#: Seeds whose pairs are searched for paths (the strongest with semantic relations).
PATH_SEEDS = 6
#: Chunks of the plan's sections scored: up to `CHUNKS_PER_PLAN_SECTION` per section, and at
#: least `PLAN_CHUNKS_PER_K` per requested chunk and `MIN_PLAN_CHUNKS`. A chunk's plan weight
#: can outweigh its cosine, so a plan chunk left out for its cosine alone could have ranked
#: first.
CHUNKS_PER_PLAN_SECTION = 4
PLAN_CHUNKS_PER_K = 8
MIN_PLAN_CHUNKS = 64
#: `graph-ppr` follows the names written in its best answers: the sections of the documents
#: named (`NameIndex.named`) by the best section of each of the `LINK_ANCHORS` best documents
#: gain `LINK_BONUS` / that document's rank on their rank score (plan sections only). A
#: multi-hop question's second document is most often one its first document names (a
#: hyperlink, in Wikipedia), while the walk also lifts the documents that mention the first
#: one, which share the question's words more; 1 to 3 anchors and bonuses of 0.1 to 0.3 were
#: compared on the dev sets (docs/benchmarks.md).
LINK_ANCHORS = 2
LINK_BONUS = 0.2
GDS_YEN = "gds-yen"
CYPHER = "cypher"
#: Who ran the propagation of `graph-ppr`.
GDS_PAGERANK = "gds-pagerank"
SCIPY = "scipy"


@dataclass(frozen=True)
class RankedChunk:
    hit: ChunkHit
    score: float
    semantic: float
    plan_weight: float
    #: the section of a best answer whose text names this chunk's document ("": none)
    named_by: str = ""


@dataclass
class Stages:
    """Wall time of each stage (ms), each stage also a span."""

    timings: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[trace.Span]:
        start = time.perf_counter()
        with _tracer.start_as_current_span(f"ask.{name}") as span:
            try:
                yield span
            finally:
                self.timings.append((name, (time.perf_counter() - start) * 1000.0))


@dataclass
class Answer:
    mode: Mode
    method: str
    seeds: list[Seed]
    paths: list[Path]
    plan: EvidencePlan
    chunks: list[RankedChunk]
    path_finder: str
    stages: Stages
    #: `graph-ppr` only: who ran the walk (`GDS_PAGERANK` or `SCIPY`), "" otherwise.
    propagation: str = ""
    #: Store reads in the order they happened ("graph" / "vector"), for invariant I1.
    reads: list[str] = field(default_factory=list)
    #: Chunks from outside the plan that complete the answer (the plan held fewer than k).
    topped_up: int = 0


class KnowledgeEngine:
    """Everything `Ask` does, independent of gRPC."""

    def __init__(
        self,
        reads: KnowledgeReads,
        gds: GdsPaths,
        chunks: ChunkIndex,
        propagation: Propagation | None = None,
        gds_pagerank: GdsPageRank | None = None,
    ) -> None:
        self.reads = reads
        self.gds = gds
        self.chunks = chunks
        self.propagation = propagation or Propagation(reads, names_embedder=chunks.embedder)
        self.gds_pagerank = gds_pagerank

    async def ask(self, tenant: str, question: str, k: int, method: str) -> Answer:
        stages = Stages()
        embedding = asyncio.create_task(self._embed(question))
        try:
            if method == VECTOR:
                return await self._vector_only(tenant, k, embedding, stages)
            return await self._graph_first(tenant, question, k, embedding, stages, method)
        finally:
            if not embedding.done():
                embedding.cancel()

    async def _embed(self, question: str) -> np.ndarray:
        vectors = await self.chunks.embedder.embed_queries([question])
        return np.asarray(vectors[0], dtype=np.float32)

    # --- the plain baseline ---------------------------------------------------------------

    async def _vector_only(
        self, tenant: str, k: int, embedding: asyncio.Task[np.ndarray], stages: Stages
    ) -> Answer:
        answer = Answer(Mode.TEXT_ONLY, VECTOR, [], [], EvidencePlan(), [], "", stages)
        with stages.stage("embed"):
            vector = await embedding
        with stages.stage("vector"):
            answer.reads.append("vector")
            hits = await self.chunks.search(tenant, vector, k)
        answer.chunks = [RankedChunk(h, h.score, h.score, 0.0) for h in hits]
        answer.topped_up = len(answer.chunks)
        return answer

    # --- graph first ----------------------------------------------------------------------

    async def _graph_first(
        self,
        tenant: str,
        question: str,
        k: int,
        embedding: asyncio.Task[np.ndarray],
        stages: Stages,
        method: str,
    ) -> Answer:
        answer = Answer(Mode.TEXT_ONLY, method, [], [], EvidencePlan(), [], "", stages)
        with stages.stage("seeds") as span:
            answer.reads.append("graph")
            names = await self.propagation.names(tenant)
            draft = names.draft(question)
            vectors = await self.propagation.embed_spans(names, draft)
            span.set_attribute("pml.dense_spans", len(vectors))
            links = {link.key: link for link in names.finish(draft, vectors)}
            # graph-ppr walks the cached graph instead of following the seeds' routes
            per_key = 0 if method == GRAPH_PPR else planning.ROUTES_PER_KEY
            rows, routes = await self.reads.anchors(tenant, list(links), per_key)
            total = await self.reads.section_count(tenant)
            answer.seeds = planning.seeds_of(rows, total, links)
            span.set_attribute("pml.seeds", len(answer.seeds))
            span.set_attribute("pml.linked", len(links))
        degrees = {r.key: r.degree for r in rows}
        with stages.stage("paths") as span:
            answer.paths, answer.path_finder = await self._paths(tenant, answer.seeds, degrees)
            span.set_attribute("pml.paths", len(answer.paths))
            span.set_attribute("pml.path_finder", answer.path_finder)
        if method == GRAPH_PPR:
            with stages.stage("propagate") as span:
                walked, documents, answer.propagation = await self._propagate(tenant, answer.seeds)
                span.set_attribute("pml.propagation", answer.propagation)
                span.set_attribute("pml.walked_sections", len(walked))
        with stages.stage("plan") as span:
            if method == GRAPH_PPR:
                answer.plan = planning.propagated(walked, documents, answer.paths)
            else:
                answer.plan = await self._plan(tenant, answer.seeds, routes, answer.paths, total)
            span.set_attribute("pml.plan_sections", len(answer.plan.weights))
        answer.mode = answer_mode(answer.paths, anchored=bool(answer.plan))
        with stages.stage("embed"):
            vector = await embedding
        with stages.stage("vector") as span:
            answer.reads.append("vector")
            ranked = await self._plan_chunks(tenant, vector, k, answer.plan)
            extra = await self._top_up(tenant, vector, k, ranked)
            answer.topped_up = len(extra)
            span.set_attribute("pml.mode", answer.mode.value)
            span.set_attribute("pml.topped_up", answer.topped_up)
        if method == GRAPH_PPR:
            with stages.stage("links") as span:
                ranked = await self._follow_links(tenant, ranked, k, names)
                span.set_attribute("pml.linked_chunks", sum(bool(c.named_by) for c in ranked[:k]))
        answer.chunks = [*ranked[:k], *extra]
        return answer

    async def _paths(
        self, tenant: str, seeds: Sequence[Seed], degrees: dict[str, int]
    ) -> tuple[list[Path], str]:
        """Selected paths between pairs of the strongest seeds that have relations."""
        linked = [s.key for s in seeds if degrees.get(s.key, 0) > 0][:PATH_SEEDS]
        pairs = list(itertools.combinations(linked, 2))
        if not pairs:
            return [], ""
        if await self.gds.available():
            finder = GDS_YEN
            sequences = await self.gds.paths(tenant, pairs, PATHS_PER_PAIR, MAX_HOPS)
        else:
            finder = CYPHER
            sequences = await self.reads.cypher_paths(tenant, pairs)
        return await self._scored_paths(tenant, sequences), finder

    async def _scored_paths(self, tenant: str, sequences: Sequence[tuple[str, ...]]) -> list[Path]:
        hops = sorted({(min(a, b), max(a, b)) for seq in sequences for a, b in pairwise(seq)})
        edges = await self.reads.edges(tenant, [(a, b) for a, b in hops if a != b])
        best = best_edges(edges)
        nodes = sorted({n for seq in sequences for n in seq})
        degrees = await self.reads.degrees(tenant, nodes)
        built = []
        for seq in sequences:
            path = build_path(seq, best)
            if path is not None:
                built.append(Path(path.nodes, path.edges, degrees))
        return select_paths(built)

    async def _propagate(
        self, tenant: str, seeds: Sequence[Seed]
    ) -> tuple[dict[str, float], dict[str, str], str]:
        """The sections a walk from the seeds reaches most (context id → score), their
        documents, and who ran the walk: GDS when the plugin is present, else scipy here."""
        limit = planning.PPR_SECTIONS
        if self.gds_pagerank is not None and await self.gds.available():
            weighted = restart_weights(seeds)
            links = (await self.propagation.names(tenant)).title_links
            walked, documents = await self.gds_pagerank.sections(tenant, weighted, limit, links)
            return walked, documents, GDS_PAGERANK
        walked, documents = await self.propagation.sections(tenant, seeds, limit)
        return walked, documents, SCIPY

    async def _plan(
        self,
        tenant: str,
        seeds: Sequence[Seed],
        routes: Sequence[Route],
        paths: Sequence[Path],
        total: int,
    ) -> EvidencePlan:
        """Anchoring (the seeds' routes), bridging (hop 2) and the paths' evidence."""
        documents: dict[str, str] = {}
        seed_weights = {s.key: s.weight for s in seeds}
        hop1 = planning.anchor_scores(routes, seed_weights, documents)
        best = planning.top_sections(hop1, planning.BRIDGE_SECTIONS)
        bridges = await self.reads.bridges(tenant, best, planning.MAX_BRIDGE_SECTIONS)
        followed = planning.bridge_keys(hop1, bridges, seeds, total)
        inner = {n: 1.0 for p in paths for n in p.nodes[1:-1] if n not in seed_weights}
        keys = list(dict.fromkeys([*followed, *inner]))
        routes2 = await self.reads.routes(tenant, keys, planning.ROUTES_PER_KEY)
        hop2 = planning.anchor_scores(
            [r for r in routes2 if r.key in followed], followed, documents
        )
        path_routes = planning.anchor_scores(
            [r for r in routes2 if r.key in inner], inner, documents
        )
        return planning.combine(hop1, hop2, paths, path_routes, documents)

    async def _plan_chunks(
        self, tenant: str, vector: np.ndarray, k: int, plan: EvidencePlan
    ) -> list[RankedChunk]:
        """The chunks of the plan's sections, best first by their fused score."""
        if not plan:
            return []
        sections = CHUNKS_PER_PLAN_SECTION * len(plan.weights)
        limit = max(MIN_PLAN_CHUNKS, PLAN_CHUNKS_PER_K * k, sections)
        hits = await self.chunks.search(tenant, vector, limit, context_ids=plan.ordered())
        return _ranked(
            RankedChunk(
                h,
                planning.fused_score(h.score, plan.weight(h.context_id), plan.fusion),
                h.score,
                plan.weight(h.context_id),
            )
            for h in hits
        )

    async def _follow_links(
        self, tenant: str, ranked: list[RankedChunk], k: int, names: NameIndex
    ) -> list[RankedChunk]:
        """`ranked` with `LINK_BONUS` on the chunks of the documents that the best section of
        each of the `LINK_ANCHORS` best documents names (see `LINK_ANCHORS`), among the chunks
        the bonus can lift into the first `k`."""
        anchors: dict[str, str] = {}  # document -> its best section
        for chunk in ranked:
            if len(anchors) == LINK_ANCHORS:
                break
            anchors.setdefault(chunk.hit.document_id, chunk.hit.context_id)
        reach = ranked[k - 1].score - LINK_BONUS if len(ranked) >= k else -math.inf
        within = list(dict.fromkeys(c.hit.context_id for c in ranked if c.score >= reach))
        mentioned, topics = await self.reads.link_rows(tenant, list(anchors.values()), within)
        # topic -> the best anchor section that names it, and its bonus (by the anchor's rank)
        named_by: dict[str, tuple[str, float]] = {}
        for rank, context_id in enumerate(anchors.values(), start=1):
            for key in mentioned.get(context_id, ()):
                for topic in names.named.get(key, ()):
                    named_by.setdefault(topic, (context_id, LINK_BONUS / rank))
        linked: dict[str, tuple[str, float]] = {}  # section -> its best namer and bonus
        for context_id, under in topics.items():
            namers = [named_by[t] for t in under if t in named_by]
            if namers:
                linked[context_id] = max(namers, key=lambda namer: namer[1])
        return _ranked(
            replace(
                c,
                score=c.score + linked[c.hit.context_id][1],
                named_by=linked[c.hit.context_id][0],
            )
            if c.hit.context_id in linked and c.hit.document_id not in anchors
            else c
            for c in ranked
        )

    async def _top_up(
        self, tenant: str, vector: np.ndarray, k: int, ranked: list[RankedChunk]
    ) -> list[RankedChunk]:
        """The nearest chunks outside `ranked` that complete it to `k` (none when the plan's
        sections hold `k` chunks)."""
        if len(ranked) >= k:
            return []
        seen = {c.hit.chunk_id for c in ranked}
        more = await self.chunks.search(tenant, vector, k + len(seen))
        extra = [RankedChunk(h, h.score, h.score, 0.0) for h in more if h.chunk_id not in seen]
        return extra[: k - len(ranked)]


def _ranked(chunks: Iterable[RankedChunk]) -> list[RankedChunk]:
    """Best first by rank score (then by chunk id, so the order is stable)."""
    return sorted(chunks, key=lambda c: (-c.score, c.hit.chunk_id))


def best_edges(edges: Sequence[Edge]) -> dict[frozenset[str], Edge]:
    """The relation a path follows between two concepts: an evidenced one before any other,
    then the most confident (then by type, so the choice is stable)."""
    best: dict[frozenset[str], Edge] = {}
    for edge in edges:
        pair = frozenset((edge.source, edge.target))
        kept = best.get(pair)
        if kept is None or _edge_rank(edge) > _edge_rank(kept):
            best[pair] = edge
    return best


def _edge_rank(edge: Edge) -> tuple[bool, float, str]:
    return (edge.evidenced, edge.confidence, edge.relation)


def invariant_violations(answer: Answer) -> list[str]:
    """Which of seed 001's invariants (§9, §8bis) an answer breaks; [] when it holds them."""
    broken = []
    if answer.method in GRAPH_METHODS and (not answer.reads or answer.reads[0] != "graph"):
        broken.append("I1: the vector store was read before the graph")
    if answer.mode is Mode.REASONED:
        if not answer.paths:
            broken.append("I2: REASONED without a path")
        for path in answer.paths:
            unproven = [e for e in path.edges if not e.evidenced]
            if unproven or not path.edges:
                broken.append(f"I2: REASONED path {' > '.join(path.nodes)} has unproven edges")
    planned = set(answer.plan.weights)
    for chunk in answer.chunks:
        if chunk.plan_weight > 0 and chunk.hit.context_id not in planned:
            broken.append(f"I3: chunk {chunk.hit.chunk_id} weighted outside the plan")
    return broken
