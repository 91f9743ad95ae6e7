"""Propagation from the question (`graph-ppr`): the walk itself, the cache of each tenant's graph,
the GDS variant on recorded rows, and a planted two-hop corpus in the real Neo4j.

The planted corpus is the shape of a multi-hop question: it names a journal and asks about the
society that publishes it, which only the journal's own text names. A distractor document shares
the question's words (association, journal, psychotherapy, integration, founded, year) and
nothing else: plain vector search prefers it, the walk from the question's concepts goes through
the journal's section to the society's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from pml_common.concepts import canonical_key
from pml_common.events import Pass1Completed, TenantDeleted
from pml_search.evidence_plan import SUBSUMED_FACTOR, Seed
from pml_search.gds import PAGERANK_PROCEDURE, GdsPageRank, GdsPaths, graph_name
from pml_search.knowledge import (
    GDS_PAGERANK,
    GRAPH_PPR,
    SCIPY,
    KnowledgeEngine,
    invariant_violations,
)
from pml_search.knowledge_consumers import KnowledgeConsumers
from pml_search.knowledge_reads import (
    CoverRow,
    GraphRows,
    KnowledgeReads,
    RelationRow,
    SectionRow,
)
from pml_search.paths import Mode
from pml_search.propagation import (
    DAMPING,
    TITLE_ROUTE,
    TOPIC_SEED,
    Propagation,
    _TenantLoads,
    build_graph,
    personalized_pagerank,
    restart_vector,
    restart_weights,
)
from pml_search.seed_linking import NameRow, title_forms, title_links

from .planted import Doc, index, plant

# --- the walk on a small graph ---------------------------------------------------------------

ROWS = GraphRows(
    sections=[
        SectionRow("s1", "d1", ("t1",), {"a": 0.9, "b": 0.4}),
        SectionRow("s2", "d2", (), {"b": 0.8, "c": 0.6}),
        SectionRow("s3", "d3", (), {"c": 0.7}),
        SectionRow("s4", "d4", (), {"d": 0.5}),
    ],
    covers=[CoverRow("t1", {"a": 0.8})],
    relations=[RelationRow("c", "d", 0.6)],
)


def seed(key: str, weight: float = 1.0) -> tuple[str, float]:
    return (key, weight)


def dense_ppr(walk: np.ndarray, restart: np.ndarray, damping: float) -> np.ndarray:
    """The closed form x = (1 − d) (I − d W)⁻¹ r, for a graph without dangling nodes."""
    size = len(restart)
    return (1 - damping) * np.linalg.solve(np.eye(size) - damping * walk, restart)


def test_the_transition_matrix_is_column_stochastic_and_symmetric_in_its_edges() -> None:
    graph = build_graph(ROWS)
    walk = graph.walk.toarray()
    np.testing.assert_allclose(walk.sum(axis=0), np.ones(graph.size), rtol=1e-6)
    # an edge is walked both ways: a→s1 and s1→a
    a, s1 = graph.concepts["a"], graph.first_section
    assert walk[s1, a] > 0 and walk[a, s1] > 0
    # from concept a: s1 by salience 0.9, topic t1 by COVERS; nothing else
    assert set(np.flatnonzero(walk[:, a])) == {s1, graph.topics["t1"]}
    assert graph.sections == ("s1", "s2", "s3", "s4")


def test_power_iteration_matches_the_closed_form() -> None:
    graph = build_graph(ROWS)
    restart = restart_vector(graph, [seed("a", 0.7), seed("c", 0.3)])
    assert restart.sum() == pytest.approx(1.0, abs=1e-6)
    scores = personalized_pagerank(graph, restart, tolerance=1e-7)
    expected = dense_ppr(graph.walk.toarray().astype(np.float64), restart, DAMPING)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert scores.sum() == pytest.approx(1.0, abs=1e-5)
    # the service's tolerance leaves the order of the scores as it is
    coarse = personalized_pagerank(graph, restart)
    assert list(np.argsort(-coarse)) == list(np.argsort(-expected))


def test_the_walk_reaches_two_hops_and_fades_with_distance() -> None:
    graph = build_graph(ROWS)
    scores = personalized_pagerank(graph, restart_vector(graph, [seed("a")]))
    section = dict(zip(graph.sections, scores[graph.first_section :], strict=True))
    # s1 mentions a; s2 shares b with s1 (two hops); s3 shares c with s2 (four hops); s4 is
    # reached only through the c—d relation
    assert section["s1"] > section["s2"] > section["s3"] > section["s4"] > 0


def test_seeds_outside_the_graph_give_no_walk() -> None:
    graph = build_graph(ROWS)
    restart = restart_vector(graph, [seed("unknown")])
    assert not restart.any()
    assert not personalized_pagerank(graph, restart).any()


def test_restarts_favour_rare_seeds_whole_seeds_and_topics() -> None:
    seeds = [
        Seed("rare", "rare", 0.9, 1, False),
        Seed("common", "common", 0.3, 20, False),
        Seed("part", "part", 0.4, 1, False, subsumed=True),
        Seed("title", "title", 0.8, 2, True),
    ]
    weights = dict(restart_weights(seeds))
    assert weights["rare"] == 20 * weights["common"]
    assert weights["part"] == SUBSUMED_FACTOR * weights["rare"]
    assert weights["title"] == TOPIC_SEED * weights["rare"] / 2


# A corpus of one airport, the state it is in (a document of its own) and eight documents that
# mention the state more saliently than the state's own article does.
STATE_ROWS = GraphRows(
    sections=[
        SectionRow(
            "airport",
            "d-airport",
            ("dodge city airport",),
            {"dodge city airport": 0.9, "kansas": 0.5, "ford county kansas": 0.5},
        ),
        SectionRow("state", "d-state", ("kansas",), {"kansas": 0.3, "population": 0.6}),
        *(
            SectionRow(f"other{i}", f"d-other{i}", (), {"kansas": 0.9, f"town{i}": 0.8})
            for i in range(8)
        ),
    ],
    covers=[],
    relations=[],
)


def test_a_concept_naming_a_document_sends_most_of_its_walk_there_one_way() -> None:
    graph = build_graph(STATE_ROWS)
    walk = graph.walk.toarray()
    kansas, topic = graph.concepts["kansas"], graph.topics["kansas"]
    mentions = 0.5 + 0.3 + 8 * 0.9
    # from the concept: TITLE_ROUTE × its mentions (and the same-key edge) to the topic
    routed = TITLE_ROUTE * mentions + 1.0
    assert walk[topic, kansas] == pytest.approx(routed / (routed + mentions), rel=1e-5)
    assert walk[topic, kansas] > 0.7
    # from the topic, nothing changes: its section and the same-key edge back, weight 1 each
    assert walk[kansas, topic] == pytest.approx(0.5)
    np.testing.assert_allclose(walk.sum(axis=0), np.ones(graph.size), rtol=1e-6)


def test_a_concept_whose_words_hold_a_title_names_that_document() -> None:
    graph = build_graph(STATE_ROWS)
    walk = graph.walk.toarray()
    held = graph.concepts["ford county kansas"]
    assert walk[graph.topics["kansas"], held] == pytest.approx(TITLE_ROUTE / (TITLE_ROUTE + 1))
    assert walk[graph.topics["kansas"], held] > 0.7


def test_a_concept_names_a_document_by_its_bare_title_given_the_forms() -> None:
    rows = GraphRows(
        sections=[
            SectionRow("bio", "d-bio", (), {"west chicago high school": 0.6}),
            SectionRow("city", "d-city", ("west chicago illinois",), {"dupage county": 0.5}),
        ],
        covers=[],
        relations=[],
    )
    school = "west chicago high school"
    forms = title_forms({"west chicago illinois": ["West Chicago, Illinois"]})
    routed = build_graph(rows, title_links([school], forms))
    assert (
        routed.walk.toarray()[routed.topics["west chicago illinois"], routed.concepts[school]] > 0.7
    )
    # by default a concept names a document by the topic's key only
    keys_only = build_graph(rows)
    assert (
        keys_only.walk.toarray()[
            keys_only.topics["west chicago illinois"], keys_only.concepts[school]
        ]
        == 0
    )


def test_the_walk_goes_from_a_document_to_the_one_its_text_names() -> None:
    # "the state where Dodge City airport is": the state's article, which mentions the state
    # least, ranks next after the airport's own section, above the eight that mention it more
    graph = build_graph(STATE_ROWS)
    scores = personalized_pagerank(graph, restart_vector(graph, [seed("dodge city airport")]))
    section = dict(zip(graph.sections, scores[graph.first_section :], strict=True))
    others = max(section[f"other{i}"] for i in range(8))
    assert section["airport"] > section["state"] > 2 * others > 0


def test_a_key_naming_a_concept_and_a_topic_restarts_on_both() -> None:
    rows = GraphRows(sections=[SectionRow("s1", "d1", ("x",), {"x": 0.5})], covers=[], relations=[])
    graph = build_graph(rows)
    restart = restart_vector(graph, [seed("x")])
    assert restart[graph.concepts["x"]] == restart[graph.topics["x"]] == 0.5


# --- the planted two-hop corpus, in the real Neo4j -------------------------------------------


QUESTION = "In which year was the association that published the Journal of Psychotherapy "
QUESTION += "Integration founded?"
JOURNAL = Doc(
    "journal",
    "Journal of Psychotherapy Integration",
    "The Journal of Psychotherapy Integration is a quarterly peer-reviewed periodical edited by "
    "the Society for the Exploration of Psychotherapy Integration.",
    {
        "Journal of Psychotherapy Integration": 0.9,
        "Society for the Exploration of Psychotherapy Integration": 0.7,
        "journal": 0.3,
        "psychotherapy": 0.3,
    },
)
SOCIETY = Doc(
    "society",
    "Society for the Exploration of Psychotherapy Integration",
    "The Society for the Exploration of Psychotherapy Integration (SEPI) is an interdisciplinary "
    "organisation of clinicians, started in 1983 by a group of therapists.",
    {"Society for the Exploration of Psychotherapy Integration": 0.9, "clinician": 0.4},
)
DISTRACTOR = Doc(
    "distractor",
    "Psychotherapy association",
    "Which association published which psychotherapy journal, and the year each association was "
    "founded: the integration of psychotherapy journals into associations.",
    {"association": 0.8, "psychotherapy": 0.7, "journal": 0.6, "year": 0.3},
)
#: The generic words of the question are everywhere, as in a real corpus.
FILLERS = tuple(
    Doc(
        f"filler{i}",
        f"Clinic {i}",
        f"Clinic {i} runs a psychotherapy journal club; its association meets every year.",
        {f"clinic {i}": 0.9, "psychotherapy": 0.4, "journal": 0.4, "association": 0.3, "year": 0.2},
    )
    for i in range(6)
)
CORPUS = (JOURNAL, SOCIETY, DISTRACTOR, *FILLERS)


@pytest.fixture
async def planted(engine: KnowledgeEngine, graph_db, tenant: str) -> str:
    await plant(graph_db, tenant, CORPUS)
    await index(engine.chunks, tenant, CORPUS)
    return tenant


async def test_the_walk_ranks_the_bridge_section_above_the_lexical_distractor(
    engine: KnowledgeEngine, planted: str
) -> None:
    answer = await engine.ask(planted, QUESTION, 3, "graph-ppr")
    assert "journal of psychotherapy integration" in {s.key for s in answer.seeds}
    walked, _ = await engine.propagation.sections(planted, answer.seeds, 50)
    ranked = list(walked)
    assert ranked[0] == JOURNAL.context_id
    assert ranked.index(SOCIETY.context_id) < ranked.index(DISTRACTOR.context_id)
    # the plan weighs them so, and the bridge is among the evidence (the cosine still prefers
    # the distractor's words: see the next test)
    plan = answer.plan
    assert plan.weight(SOCIETY.context_id) > plan.weight(DISTRACTOR.context_id) > 0
    documents = [c.hit.document_id for c in answer.chunks]
    assert documents[0] == "journal" and "society" in documents, documents
    assert answer.method == GRAPH_PPR and answer.propagation == SCIPY
    assert answer.mode is Mode.ANCHORED
    assert invariant_violations(answer) == []
    assert all(c.hit.context_id in answer.plan.weights for c in answer.chunks)
    assert [s for s, _ in answer.stages.timings] == [
        "seeds",
        "paths",
        "propagate",
        "plan",
        "embed",
        "vector",
        "links",
    ]


async def test_vector_search_alone_prefers_the_distractor(
    engine: KnowledgeEngine, planted: str
) -> None:
    """What the walk corrects: the question's words are the distractor's."""
    answer = await engine.ask(planted, QUESTION, len(CORPUS), "vector")
    documents = [c.hit.document_id for c in answer.chunks]
    assert documents.index("distractor") < documents.index("society"), documents


async def test_the_graph_is_read_once_until_the_tenant_changes(
    engine: KnowledgeEngine, graph_db, planted: str
) -> None:
    propagation = engine.propagation
    first = await propagation.graph(planted)
    assert propagation.cached(planted)
    assert await propagation.graph(planted) is first
    consumers = KnowledgeConsumers(engine.gds, propagation)
    await consumers.on_graph_changed(Pass1Completed.create(tenant_id=planted, document_id="x"))
    assert not propagation.cached(planted)
    # a document added since is walked to
    society = "Society for the Exploration of Psychotherapy Integration"
    extra = Doc("extra", "Boston", "SEPI met in Boston.", {society: 0.5, "boston": 0.9})
    await plant(graph_db, planted, (extra,))
    again = await propagation.graph(planted)
    assert again is not first and extra.context_id in again.sections
    # tenants never share a graph
    assert JOURNAL.context_id not in (await propagation.graph(f"{planted}-other")).sections


async def test_concurrent_questions_share_one_read(engine: KnowledgeEngine, planted: str) -> None:
    reads = CountingReads(engine.reads)
    propagation = Propagation(reads)  # type: ignore[arg-type]
    graphs = await asyncio.gather(*(propagation.graph(planted) for _ in range(5)))
    assert reads.graph_reads == 1 and all(g is graphs[0] for g in graphs)


async def cached_within(propagation: Propagation, tenant: str, seconds: float) -> bool:
    for _ in range(round(seconds / 0.01)):
        if propagation.cached(tenant):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_changed_tenant_is_read_again_before_its_next_question(
    engine: KnowledgeEngine, planted: str
) -> None:
    reads = CountingReads(engine.reads)
    propagation = Propagation(reads, read_ahead_s=0.1)  # type: ignore[arg-type]
    consumers = KnowledgeConsumers(engine.gds, propagation)
    changed = Pass1Completed.create(tenant_id=planted, document_id="x")
    await consumers.on_graph_changed(changed)  # never read yet: read 0.1 s after the change
    await asyncio.sleep(0.05)
    await consumers.on_graph_changed(changed)  # a change within the wait postpones the read
    await asyncio.sleep(0.07)
    assert not propagation.cached(planted) and reads.graph_reads == 0
    # no question asks: the read happens in the background
    assert await cached_within(propagation, planted, 3.0)
    assert propagation.names_cached(planted) and reads.graph_reads == 1  # one for two changes
    # a deletion drops the read scheduled by an earlier change: nothing deleted is read ahead
    await consumers.on_graph_changed(changed)
    await consumers.on_graph_changed(TenantDeleted.create(tenant_id=planted))
    assert not await cached_within(propagation, planted, 3.0) and reads.graph_reads == 1
    # a stopping service drops the reads it scheduled
    await consumers.on_graph_changed(changed)
    await propagation.close()
    await asyncio.sleep(0.3)
    assert not propagation.cached(planted) and reads.graph_reads == 1


class SlowLoads:
    """A loader whose reads take `load_s` and return numbered versions; `release` lets a read
    that was asked to wait finish."""

    def __init__(self, load_s: float) -> None:
        self.load_s = load_s
        self.version = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def load(self, tenant: str) -> str:
        await asyncio.sleep(self.load_s)
        await self.gate.wait()
        self.version += 1
        return f"{tenant} v{self.version}"


async def settled(loads: _TenantLoads[str], tenant: str) -> str:
    for _ in range(200):
        if loads.cached(tenant):
            return await loads.get(tenant)
        await asyncio.sleep(0.01)
    raise AssertionError("the new value never landed")


async def test_a_slow_tenant_is_answered_from_its_previous_graph_while_the_new_one_loads() -> None:
    slow = SlowLoads(load_s=0.05)
    loads = _TenantLoads("test", 100, lambda _: 1, slow.load, stale_after_s=0.04)
    assert await loads.get("t") == "t v1"
    slow.gate.clear()
    loads.invalidate("t")
    # the question does not wait for the read: it gets the graph from before the change
    assert await asyncio.wait_for(loads.get("t"), 0.02) == "t v1"
    slow.gate.set()
    assert await settled(loads, "t") == "t v2"
    # after a deletion nothing from before it is served: the question waits for the read
    slow.gate.clear()
    loads.invalidate("t", removed=True)
    pending = asyncio.ensure_future(loads.get("t"))
    await asyncio.sleep(0.1)
    assert not pending.done()
    slow.gate.set()
    assert await pending == "t v3"


async def test_a_fast_tenant_always_waits_for_its_new_graph() -> None:
    fast = SlowLoads(load_s=0.0)
    loads = _TenantLoads("test", 100, lambda _: 1, fast.load, stale_after_s=0.04)
    assert await loads.get("t") == "t v1"
    loads.invalidate("t")
    assert await loads.get("t") == "t v2"


class CountingReads:
    def __init__(self, reads: KnowledgeReads) -> None:
        self._reads = reads
        self.graph_reads = 0

    async def graph(self, tenant: str) -> GraphRows:
        self.graph_reads += 1
        return await self._reads.graph(tenant)

    async def names(self, tenant: str) -> list[NameRow]:
        return await self._reads.names(tenant)


# --- GDS pageRank, on rows shaped like the plugin's ------------------------------------------


class RecordingReader:
    """Answers like GDS would: the plugin is present, projections are made, pageRank yields the
    recorded rows (community Neo4j here cannot run it)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self.calls.append((query, params))
        if "SHOW PROCEDURES" in query:
            return [{"found": 1}]
        if "gds.graph.project" in query:
            return [{"nodes": 12, "relationships": 30}]
        if PAGERANK_PROCEDURE in query:
            return self.rows
        return []


async def test_gds_pagerank_rows_become_the_plan(engine: KnowledgeEngine, planted: str) -> None:
    rows = [
        {"context_id": JOURNAL.context_id, "document_id": "journal", "score": 0.30},
        {"context_id": SOCIETY.context_id, "document_id": "society", "score": 0.12},
        {"context_id": DISTRACTOR.context_id, "document_id": "distractor", "score": 0.01},
    ]
    reader = RecordingReader(rows)
    engine.gds = GdsPaths(reader, "test")
    engine.gds_pagerank = GdsPageRank(reader, "test")
    answer = await engine.ask(planted, QUESTION, 2, "graph-ppr")
    assert answer.propagation == GDS_PAGERANK
    assert answer.plan.ordered() == [d.context_id for d in (JOURNAL, SOCIETY, DISTRACTOR)]
    assert answer.plan.weights[JOURNAL.context_id] == 1.0
    assert invariant_violations(answer) == []
    query, params = next(c for c in reader.calls if PAGERANK_PROCEDURE in c[0])
    assert params["tenant"] == planted and params["damping"] == DAMPING
    weights = dict(params["seeds"])
    assert weights["journal of psychotherapy integration"] == max(weights.values())
    assert all(w > 0 for w in weights.values())
    assert "sourceNodes: sources" in query and planted not in query
    # projected once per tenant, again after a change
    await engine.ask(planted, QUESTION, 2, "graph-ppr")
    assert sum("gds.graph.project" in q for q, _ in reader.calls) == 1
    engine.gds_pagerank.invalidate(planted)
    await engine.ask(planted, QUESTION, 2, "graph-ppr")
    projections = [p for q, p in reader.calls if "gds.graph.project" in q]
    assert len(projections) == 2
    # the concepts that name a document are projected one way, weighted as the scipy walk's
    society = canonical_key(SOCIETY.title)
    assert [society, society] in projections[0]["title_links"]
    assert projections[0]["title_route"] == TITLE_ROUTE
    project = next(q for q, _ in reader.calls if "gds.graph.project" in q)
    assert "'NAMES' AS type" in project and "undirectedRelationshipTypes: ['LINK']" in project
    assert projections[0]["graph"] == graph_name("test", planted, "propagation")
