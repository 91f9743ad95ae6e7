"""Linking a question to the tenant's concepts (`pml_search.seed_linking`): by key, alias,
fuzzy and dense name, named entities before the common words inside them; then, against the
real Neo4j and the passage embedder, a question that words an entity otherwise than its
document (a misspelling, another language) still seeds it and reaches its section, and a rare
common word inside a named entity does not pull the walk away from it.
"""

from __future__ import annotations

import neo4j
import numpy as np
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
    DENSE,
    DENSE_MIN,
    EXACT,
    FUZZY,
    FUZZY_MIN,
    INSIDE_ENTITY_FACTOR,
    TOPIC_TYPE,
    NameIndex,
    NameRow,
    title_forms,
    title_links,
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
        NameRow("rochester new york", "Rochester, New York", TOPIC_TYPE),
        NameRow("audrey william", "Audrey Williams", TOPIC_TYPE),
        NameRow("audrey william", "Audrey Williams", "PERSON"),
        NameRow("audrey william archaeologist", "Audrey Williams (archaeologist)", TOPIC_TYPE),
    ]
)


def links_of(question: str) -> dict[str, tuple[str, str, bool]]:
    return {x.key: (x.how, x.span, x.inside_entity) for x in NAMES.link(question)}


def unlinked(names: NameIndex, question: str) -> list[str]:
    """The named spans of `question` that no key, alias or fuzzy name links."""
    return [text for text, _, _ in names.draft(question).unlinked]


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
    # a place is named without its state
    assert links_of("Which part of the state is Rochester in?")["rochester new york"] == (
        ALIAS,
        "Rochester",
        False,
    )
    # but only titles: a concept's name is no alias of a lower-case span
    assert "spiderman" not in links_of("Who drew spider-man?")


def test_a_title_named_exactly_links_no_namesake_by_alias() -> None:
    # "Audrey Williams" is a title: the document it names, not "Audrey Williams (archaeologist)"
    for question in ("Who was Audrey Williams married to?", "who was audrey williams?"):
        links = links_of(question)
        assert list(links) == ["audrey william"] and links["audrey william"][0] == EXACT
    # a key that is no title still reaches the title it is the bare form of
    assert links_of("Who sang in Frozen?")["frozen 2013 film"] == (ALIAS, "Frozen", False)


def test_title_forms_are_the_keys_and_the_bare_titles_that_name_one_document() -> None:
    forms = title_forms(
        {
            "west chicago illinois": ["West Chicago, Illinois"],
            "dear brother hank william song": ["Dear Brother (Hank Williams song)"],
            "frozen 2013 film": ["Frozen (2013 film)"],
            "frozen 1997 film": ["Frozen (1997 film)"],
            "iowa": ["Iowa"],
            "iowa film": ["Iowa (film)"],
        }
    )
    assert forms["west chicago"] == "west chicago illinois"  # the place without its state
    assert forms["dear brother"] == "dear brother hank william song"
    assert "frozen" not in forms  # the bare title of two documents names neither
    assert forms["iowa"] == "iowa"  # a title's own key is never another title's bare form
    assert forms["iowa film"] == "iowa film"


def test_title_links_find_the_documents_a_concept_names() -> None:
    forms = title_forms(
        {t: [t.title()] for t in ("iowa", "west chicago", "chicago", "kansas")}
        | {"dodge city kansas": ["Dodge City, Kansas"]}
    )
    concepts = ["kansas", "north west iowa", "west chicago high school", "river", "iowa kansas"]
    assert title_links(concepts, forms) == [
        ("kansas", "kansas"),  # the same key
        ("north west iowa", "iowa"),  # a run of its words
        ("west chicago high school", "west chicago"),  # the longest run, not also "chicago"
        ("iowa kansas", "iowa"),  # two runs that do not overlap
        ("iowa kansas", "kansas"),
    ]
    # a bare title names its document; a part of one names nothing
    assert title_links(["dodge city", "dodge"], forms) == [("dodge city", "dodge city kansas")]
    # the index keeps the pairs of its concepts (not of its topics, which name themselves)
    assert ("audrey william", "audrey william") in NAMES.title_links
    assert ("frozen", "frozen 2013 film") in NAMES.title_links  # bare, of one title here
    assert all(concept != "audrey william archaeologist" for concept, _ in NAMES.title_links)


def test_a_name_that_is_not_a_key_is_linked_to_the_nearest_names() -> None:
    (link,) = [x for x in NAMES.link("Where does the Tikhaya Sosna flow?") if x.how == FUZZY]
    assert link.key == "tikhaya sosna river" and link.span == "Tikhaya Sosna"
    assert FUZZY_MIN <= link.score < 1.0 and link.entity_type == "LOC"
    # nothing close enough: no link (the words alone are no concept either)
    assert NAMES.link("Where does the Volga flow?") == []


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_a_name_nothing_else_links_is_linked_by_meaning() -> None:
    names = NameIndex(
        [
            NameRow("germany", "Germany", "GPE"),
            NameRow("france", "France", "GPE"),
            NameRow("rhine", "Rhine", "LOC"),
            NameRow("river", "river", CONCEPT_TYPE),  # a noun phrase: never a dense target
        ]
    )
    assert names.dense_names == ["France", "Germany", "Rhine"]
    question = "Which river crosses Allemagne and the Rhine?"
    # the key links "Rhine" and "river"; "Allemagne" no key, alias or trigram links
    assert unlinked(names, question) == ["Allemagne"]
    assert DENSE not in {x.how for x in names.link(question)}  # no vectors yet
    names.with_vectors(np.stack([unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1)]))
    links = {x.key: x for x in names.link(question, {"Allemagne": unit(0.1, 0.99, 0)})}
    germany = links["germany"]
    assert (germany.how, germany.span, germany.entity_type) == (DENSE, "Allemagne", "GPE")
    assert germany.score == pytest.approx(0.995, abs=1e-3)
    assert germany.factor == pytest.approx(germany.score)
    assert links["rhine"].how == EXACT and "france" not in links
    # nearest name below DENSE_MIN: no link
    far = unit(0.7, 0.7, 0.1)
    assert float(far @ unit(0, 1, 0)) < DENSE_MIN
    assert "germany" not in {x.key for x in names.link(question, {"Allemagne": far})}
    with pytest.raises(ValueError, match="2 vectors for 3 names"):
        names.with_vectors(np.zeros((2, 3), dtype=np.float32))


def test_only_what_no_other_link_reaches_is_left_to_dense_links() -> None:
    # linked by key, by alias, by trigrams: nothing to embed
    assert unlinked(NAMES, "Who won Pop Idol and drew Spider-Man?") == []
    assert unlinked(NAMES, "Where does the Tikhaya Sosna flow?") == []
    # names joined by a connector are looked up apart: only the part nothing links is left
    question = "Are Christopher Nolan and Rainer Werner Fassbinder both film directors?"
    assert unlinked(NAMES, question) == ["Rainer Werner Fassbinder"]


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


def fillers(kind: str, sentence: str, shared: dict[str, float], label: str) -> tuple[Doc, ...]:
    """Five documents "<Kind> i", each an entity of `label` saying `sentence` after its name
    and mentioning the `shared` concepts."""
    return tuple(
        Doc(
            f"{kind}{i}",
            f"{kind.title()} {i}",
            f"{kind.title()} {i} {sentence}",
            {f"{kind} {i}": 0.9, **shared},
            {f"{kind} {i}": label},
        )
        for i in range(5)
    )


#: Documents sharing the question's other words ("river", "flow", "town") and nothing else.
RIVER_FILLERS = fillers(
    "stream",
    "is a river; the town on the river watches it flow every year.",
    {"river": 0.6, "town": 0.5, "flow": 0.3},
    "LOC",
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


GERMANY = Doc(
    "germany",
    "Germany",
    "Germany is a country in Central Europe; the Rhine and the Elbe cross it.",
    {"Germany": 0.9, "Rhine": 0.5, "Elbe": 0.5, "country": 0.3},
    {"Germany": "GPE", "Rhine": "LOC", "Elbe": "LOC"},
)
#: Documents about countries and rivers that name no country of the question.
COUNTRY_FILLERS = fillers(
    "country",
    "is a country whose rivers cross it from the mountains to the sea.",
    {"country": 0.6, "river": 0.5},
    "GPE",
)


@pytest.mark.parametrize("method", ["graph-ppr", "graph-first"])
async def test_an_entity_named_in_another_language_seeds_it_by_meaning(
    engine: KnowledgeEngine, graph_db, tenant: str, method: str
) -> None:
    await planted(engine, graph_db, tenant, (GERMANY, *COUNTRY_FILLERS))
    answer = await engine.ask(tenant, "Which rivers cross Allemagne?", 3, method)
    seeds = {s.key: s for s in answer.seeds}
    germany = seeds["germany"]
    assert germany.link == DENSE and germany.span == "Allemagne"
    assert DENSE_MIN <= germany.link_score <= 1.0 and germany.entity_type == "GPE"
    assert answer.seeds[0].key == "germany"
    assert answer.chunks[0].hit.document_id == "germany"
    assert invariant_violations(answer) == []
    proto = {s.key: s for s in answer_proto_seeds(answer.seeds)}
    assert proto["germany"].link == DENSE and proto["germany"].span == "Allemagne"


async def test_a_large_tenants_names_are_embedded_in_the_background(
    engine: KnowledgeEngine, graph_db, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pml_search.propagation.DENSE_SYNC_NAMES", 0)
    await planted(engine, graph_db, tenant, (GERMANY, *COUNTRY_FILLERS))
    names = await engine.propagation.names(tenant)
    assert unlinked(names, "Which rivers cross Allemagne?") == ["Allemagne"]
    await engine.propagation.settle()
    assert names.has_vectors and await engine.propagation.names(tenant) is names
    answer = await engine.ask(tenant, "Which rivers cross Allemagne?", 3, "graph-ppr")
    assert {s.key: s.link for s in answer.seeds}["germany"] == DENSE


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
