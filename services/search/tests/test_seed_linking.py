"""Linking a question to the tenant's concepts (`pml_search.seed_linking`): by key, alias and
fuzzy name, named entities before the common words inside them; then, against the real Neo4j,
a question that words an entity otherwise than its document still seeds it and reaches its
section, and a rare common word inside a named entity does not pull the walk away from it.
"""

from __future__ import annotations

import neo4j
import pytest

from pml.v1 import knowledge_pb2
from pml_common.events import Pass1Completed
from pml_search.evidence_plan import seeds_of
from pml_search.knowledge import KnowledgeEngine, invariant_violations
from pml_search.knowledge_consumers import KnowledgeConsumers
from pml_search.knowledge_reads import ConceptRow
from pml_search.knowledge_service import answer_proto
from pml_search.propagation import restart_weights
from pml_search.seed_linking import (
    ALIAS,
    COMMON_WORD_FACTOR,
    CONCEPT_TYPE,
    EXACT,
    FUZZY,
    FUZZY_MIN,
    INSIDE_ENTITY_FACTOR,
    TOPIC_TYPE,
    NameIndex,
    NameRow,
)

from .planted import Doc, index, plant

# --- the index alone ------------------------------------------------------------------------

NAMES = NameIndex(
    [
        NameRow("ll", "It'll Be Me", TOPIC_TYPE),
        NameRow("ll", "'ll", CONCEPT_TYPE),
        NameRow("tikhaya sosna river", "Tikhaya Sosna River", "LOC"),
        NameRow("pop idol", "Pop Idol", "WORK_OF_ART"),
        NameRow("pop", "pop", CONCEPT_TYPE),
        NameRow("christopher nolan", "Christopher Nolan", "PERSON"),
        NameRow("nolan", "Nolan", "PERSON"),
        NameRow("sathish kalathi", "Sathish Kalathi", "PERSON"),
        NameRow("film director", "film directors", CONCEPT_TYPE),
        NameRow("spiderman", "Spiderman", "PERSON"),
        NameRow("river", "river", CONCEPT_TYPE),
        NameRow("frozen 2013 film", "Frozen (2013 film)", TOPIC_TYPE),
        NameRow("frozen", "frozen", CONCEPT_TYPE),
        NameRow("monster truck film", "Monster Trucks (film)", TOPIC_TYPE),
        NameRow("monster truck", "monster trucks", CONCEPT_TYPE),
    ]
)


def links_of(question: str) -> dict[str, tuple[str, str, bool]]:
    return {x.key: (x.how, x.span, x.inside_entity) for x in NAMES.link(question)}


def test_an_exact_key_is_linked_with_the_words_that_name_it() -> None:
    assert links_of("Who are the film directors of it?") == {
        "film director": (EXACT, "film directors", False)
    }


def test_a_name_written_with_other_spacing_is_linked_by_alias() -> None:
    assert links_of("Who drew Spider-Man?")["spiderman"] == (ALIAS, "Spider-Man", False)


def test_a_title_is_linked_without_its_disambiguation_besides_the_key() -> None:
    # a named span: its own key and the article whose title it is
    links = links_of("Who sang in Frozen?")
    assert links["frozen"] == (EXACT, "Frozen", False)
    assert links["frozen 2013 film"] == (ALIAS, "Frozen", False)
    # the question may write a title in lower case: titles are linked from any span
    links = links_of("Where are the monster trucks set?")
    assert links["monster truck film"] == (ALIAS, "monster trucks", False)
    assert links["monster truck"] == (EXACT, "monster trucks", False)
    # but only titles: a concept's name is no alias of a lower-case span
    assert "spiderman" not in links_of("Who drew spider-man?")


def test_a_name_that_is_not_a_key_is_linked_to_the_nearest_names() -> None:
    (link,) = [x for x in NAMES.link("Where does the Tikhaya Sosna flow?") if x.how == FUZZY]
    assert link.key == "tikhaya sosna river" and link.span == "Tikhaya Sosna"
    assert FUZZY_MIN <= link.score < 1.0 and link.entity_type == "LOC"
    # nothing close enough: no link (the words alone are no concept either)
    assert NAMES.link("Where does the Volga flow?") == []


def test_two_names_joined_by_a_connector_are_linked_apart() -> None:
    links = links_of("Are Christopher Nolan and Sathish Kalathil both film directors?")
    assert links["christopher nolan"] == (EXACT, "Christopher Nolan", False)
    assert links["sathish kalathi"][:2] == (FUZZY, "Sathish Kalathil")
    assert links["nolan"] == (EXACT, "Nolan", True)  # inside the named person


def test_a_common_word_is_cut_only_inside_a_named_entity() -> None:
    assert links_of("Who won Pop Idol?")["pop"] == (EXACT, "Pop", True)
    # the same word on its own elsewhere in the question keeps its link whole
    assert links_of("Who won Pop Idol, a pop contest?")["pop"] == (EXACT, "pop", False)
    # a capitalised run linked to no entity cuts nothing
    assert links_of("Is Pop Art art?")["pop"] == (EXACT, "Pop", False)


def test_a_single_common_word_beside_a_named_entity_is_cut() -> None:
    links = {x.key: x for x in NAMES.link("Which pop river did Christopher Nolan film?")}
    assert links["pop"].common_word and links["river"].common_word
    assert links["pop"].factor == pytest.approx(COMMON_WORD_FACTOR)
    assert not links["christopher nolan"].common_word
    # without a named entity in the question, the same words are what it is about
    assert not any(x.common_word for x in NAMES.link("Which pop river is longest?"))


def test_a_first_word_that_is_a_function_word_starts_no_name() -> None:
    assert links_of("Which river is longest?") == {"river": (EXACT, "river", False)}


def test_a_link_sets_the_seed_weight_and_its_restart() -> None:
    links = {x.key: x for x in NAMES.link("Who won Pop Idol, where the Tikhaya Sosna flows?")}
    rows = [
        ConceptRow("pop idol", "Pop Idol", "ENTITY", 4, 0, False),
        ConceptRow("pop", "pop", "CONCEPT", 1, 0, False),
        ConceptRow("tikhaya sosna river", "Tikhaya Sosna River", "ENTITY", 4, 0, False),
    ]
    seeds = {s.key: s for s in seeds_of(rows, 100, links)}
    plain = {s.key: s for s in seeds_of(rows, 100)}
    fuzzy = links["tikhaya sosna river"]
    assert seeds["tikhaya sosna river"].weight == pytest.approx(
        plain["tikhaya sosna river"].weight * fuzzy.score
    )
    assert seeds["pop"].inside_entity and seeds["pop"].weight == pytest.approx(
        plain["pop"].weight * INSIDE_ENTITY_FACTOR
    )
    restarts = dict(restart_weights(seeds.values()))
    assert restarts["pop idol"] > restarts["pop"]  # 1/4 against 1/1 x 1/2 x the cut
    proto = answer_proto_seeds(list(seeds.values()))
    by_key = {s.key: s for s in proto}
    assert by_key["tikhaya sosna river"].link == FUZZY
    assert by_key["tikhaya sosna river"].link_score == pytest.approx(fuzzy.score)
    assert by_key["tikhaya sosna river"].span == "Tikhaya Sosna"
    assert by_key["tikhaya sosna river"].entity_type == "LOC"
    assert by_key["pop"].inside_entity and by_key["pop idol"].entity_type == "WORK_OF_ART"


def answer_proto_seeds(seeds: list) -> list[knowledge_pb2.SeedConcept]:  # type: ignore[type-arg]
    from pml_search.evidence_plan import EvidencePlan
    from pml_search.knowledge import Answer, Stages
    from pml_search.paths import Mode

    answer = Answer(Mode.ANCHORED, "graph-ppr", seeds, [], EvidencePlan(), [], "", Stages())
    return list(answer_proto(answer).seeds)


# --- planted corpora in the real Neo4j ------------------------------------------------------


RIVER = Doc(
    "river",
    "Tikhaya Sosna River",
    "The Tikhaya Sosna River is a left tributary of the Don; it rises near Alexeyevka.",
    {"Tikhaya Sosna River": 0.9, "Don": 0.5, "Alexeyevka": 0.4},
    {"Tikhaya Sosna River": "LOC", "Don": "LOC", "Alexeyevka": "GPE"},
)
#: Documents sharing the question's other words ("river", "flow", "town") and nothing else.
RIVER_FILLERS = tuple(
    Doc(
        f"stream{i}",
        f"Stream {i}",
        f"Stream {i} is a river; the town on the river watches it flow every year.",
        {f"stream {i}": 0.9, "river": 0.6, "town": 0.5, "flow": 0.3},
        {f"stream {i}": "LOC"},
    )
    for i in range(5)
)
WORDED_OTHERWISE = "Which town does the Tikhaya Sosna flow through?"

#: "Pop Idol" in two documents (less specific than a word of one), "pop" in one section only.
IDOL = tuple(
    Doc(
        f"idol{i}",
        f"Idol contestant {i}",
        f"Contestant {i} sang on the second series of Pop Idol and finished in place {i}.",
        {"Pop Idol": 0.8, f"contestant {i}": 0.9},
        {"Pop Idol": "WORK_OF_ART", f"contestant {i}": "PERSON"},
    )
    for i in range(2)
)
POP = Doc(
    "pop",
    "Bubblegum",
    "Bubblegum is a style of pop for pre-teens and teenagers, upbeat and commercial.",
    {"bubblegum": 0.9, "pop": 0.8, "teenager": 0.4},
)
ENTITY_QUESTION = "Who sang on the second series of Pop Idol?"


async def planted(engine: KnowledgeEngine, driver: neo4j.AsyncDriver, tenant: str, docs) -> str:  # type: ignore[no-untyped-def]
    await plant(driver, tenant, docs)
    await index(engine.chunks, tenant, docs)
    return tenant


@pytest.mark.parametrize("method", ["graph-ppr", "graph-first"])
async def test_an_entity_worded_otherwise_still_seeds_and_reaches_its_section(
    engine: KnowledgeEngine, graph_db, tenant: str, method: str
) -> None:
    docs = (RIVER, *RIVER_FILLERS)
    await planted(engine, graph_db, tenant, docs)
    answer = await engine.ask(tenant, WORDED_OTHERWISE, 3, method)
    seeds = {s.key: s for s in answer.seeds}
    river = seeds["tikhaya sosna river"]
    assert river.link == FUZZY and river.span == "Tikhaya Sosna" and river.entity_type == "LOC"
    assert answer.seeds[0].key == "tikhaya sosna river"
    assert answer.plan.ordered()[0] == RIVER.context_id
    assert answer.chunks[0].hit.document_id == "river"
    assert invariant_violations(answer) == []


async def test_a_common_word_inside_a_named_entity_does_not_outweigh_it(
    engine: KnowledgeEngine, graph_db, tenant: str
) -> None:
    docs = (*IDOL, POP)
    await planted(engine, graph_db, tenant, docs)
    answer = await engine.ask(tenant, ENTITY_QUESTION, 2, "graph-ppr")
    seeds = {s.key: s for s in answer.seeds}
    assert seeds["pop"].inside_entity and not seeds["pop idol"].inside_entity
    assert seeds["pop idol"].entity_type == "WORK_OF_ART"
    # "pop" is in one section, "pop idol" in two: by rarity alone the word would lead (its
    # restart 1 x 1/2 inside a longer seed, against 1/2 for the entity)
    restarts = dict(restart_weights(answer.seeds))
    assert restarts["pop idol"] > restarts["pop"]
    walked, _ = await engine.propagation.sections(tenant, answer.seeds, 10)
    ranked = list(walked)
    idols = {d.context_id for d in IDOL}
    assert set(ranked[:2]) == idols and ranked[2] == POP.context_id, ranked
    assert {c.hit.document_id for c in answer.chunks} == {d.doc_id for d in IDOL}


async def test_the_names_are_read_once_until_the_tenant_changes(
    engine: KnowledgeEngine, graph_db, tenant: str
) -> None:
    await planted(engine, graph_db, tenant, (RIVER,))
    propagation = engine.propagation
    first = await propagation.names(tenant)
    assert propagation.names_cached(tenant) and await propagation.names(tenant) is first
    await KnowledgeConsumers(engine.gds, propagation).on_graph_changed(
        Pass1Completed.create(tenant_id=tenant, document_id="x")
    )
    assert not propagation.names_cached(tenant)
    await plant(graph_db, tenant, (POP,))
    again = await propagation.names(tenant)
    assert again is not first and "bubblegum" in again.types and "bubblegum" not in first.types
    # tenants never share names
    assert "bubblegum" not in (await propagation.names(f"{tenant}-other")).types
