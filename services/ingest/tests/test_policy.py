from pml_ingest.policy import decide
from pml_ingest.verifier import Verdict


def _v(
    context_id: str, *, strong: bool = False, kind: str = "REQUIRES", doc: str = "d1"
) -> Verdict:
    return Verdict(
        kind, "a", "b", f"a requires b ({context_id})", context_id, doc, 0.6, strong, "rules"
    )


def test_one_weak_evidence_is_not_enough() -> None:
    assert decide([_v("s1")]) == []


def test_the_same_section_twice_is_one_evidence() -> None:
    assert decide([_v("s1"), _v("s1")]) == []


def test_two_sections_make_a_relation_with_both_evidences() -> None:
    [relation] = decide([_v("s1"), _v("s2", doc="d2")])
    assert relation.context_ids == ["s1", "s2"]
    assert relation.document_ids == ["d1", "d2"]
    assert relation.multi_evidence and not relation.strong
    assert relation.confidence == 0.7


def test_one_strong_evidence_is_enough() -> None:
    [relation] = decide([_v("s1", strong=True)])
    assert relation.strong and not relation.multi_evidence


def test_types_and_directions_are_judged_separately() -> None:
    relations = decide([_v("s1"), _v("s2", kind="ENABLES")])
    assert relations == []
