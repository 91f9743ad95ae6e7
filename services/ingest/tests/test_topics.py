from pml_ingest.classification import fine_type
from pml_ingest.topics import SectionOutline, covers, document_topics


def _sections() -> list[SectionOutline]:
    return [
        SectionOutline("c0", ("Sales Guide",), 100),
        SectionOutline("c1", ("Sales Guide", "1 Quotations"), 200),
        SectionOutline("c2", ("Sales Guide", "1 Quotations", "1.1 Approval"), 100),
        SectionOutline("c3", ("Sales Guide", "Introduction"), 100),
        SectionOutline("c4", ("Sales Guide", "2 Contracts", "¶1"), 100),
    ]


def test_topics_come_from_h1_and_h2_without_numbering_or_stop_headings() -> None:
    topics = document_topics(_sections())
    assert [t.topic_id for t in topics] == ["sale guide", "quotation", "contract"]
    assert [t.name for t in topics] == ["Sales Guide", "Quotations", "Contracts"]
    root, quotations, contracts = topics
    assert root.salience == 1.0
    assert quotations.salience == 0.5
    assert quotations.context_ids == ("c1", "c2")
    assert contracts.context_ids == ("c4",)


def test_covers_needs_salience_and_no_stop_concept() -> None:
    topics = document_topics(_sections())
    mentions = {
        "c1": [("solution quotation", 0.8), ("discount", 0.1), ("example", 0.9)],
        "c2": [("solution quotation", 0.4), ("approval workflow", 0.35)],
        "c4": [("service contract", 0.6)],
    }
    pairs = {(c.topic_id, c.concept_key, c.confidence) for c in covers(topics, mentions, 0.3)}
    assert ("quotation", "solution quotation", 0.8) in pairs
    assert ("quotation", "approval workflow", 0.35) in pairs
    assert ("contract", "service contract", 0.6) in pairs
    assert not any(key in {"discount", "example"} for _, key, _ in pairs)
    # a topic covers what its sections mention, not what other topics' sections mention
    assert ("contract", "solution quotation", 0.8) not in pairs


def test_fine_types() -> None:
    assert fine_type("jan philip solovej", "PERSON") == "person"
    assert fine_type("paris", "LOC") == "place"
    assert fine_type("approval workflow", "") == "process"
    assert fine_type("contrat de service", "") == "business_document"
    assert fine_type("blue sky", "") == "concept"
