"""Pass 1 extraction with the real spaCy pipelines (English and French, from PyPI)."""

from pml_common.concepts import canonical_key, ngram_keys
from pml_ingest.extraction import ConceptExtractor, SectionInput

EXTRACTOR = ConceptExtractor()


def _concepts(text: str, language: str, path: str = "Doc") -> dict[str, tuple[str, str, float]]:
    [mentions] = EXTRACTOR.extract([SectionInput("c", path, text)], language)
    return {m.key: (m.name, m.concept_type, m.salience) for m in mentions}


def test_english_entities_and_noun_phrases() -> None:
    text = (
        "The Journal of Mathematical Physics is a peer-reviewed journal published monthly by "
        "the American Institute of Physics since January 1960. Its editor is Jan Philip Solovej."
    )
    found = _concepts(text, "en", "Journal of Mathematical Physics")
    assert found["journal of mathematical physic"][:2] == (
        "Journal of Mathematical Physics",
        "ENTITY",
    )
    assert found["jan philip solovej"][1] == "ENTITY"
    assert "peer reviewed journal" in found
    assert found["editor"][0] == "editor"  # display names lose their determiners
    assert not any("1960" in key or "january" in key for key in found)  # dates are values
    # the concept the title names is the section's most salient one
    best = max(found.items(), key=lambda item: item[1][2])[0]
    assert best == "journal of mathematical physic"
    # a question names it with the same key
    assert "journal of mathematical physic" in ngram_keys(
        "Who edits the Journal of Mathematical Physics?"
    )


def test_french_noun_phrases_keep_their_complement() -> None:
    found = _concepts("La gestion des devis prépare chaque offre pour le client.", "fr")
    assert {"gestion des devis", "offre", "client"} <= set(found)
    assert found[canonical_key("la gestion des devis")][0] == "gestion des devis"


def test_a_name_read_as_an_amount_stays_a_concept_and_amounts_do_not() -> None:
    text = (
        "Her first novel was published by Two Dollar Radio in September 2010. Two Hundred "
        "copies sold on the first day, at Five Dollars each."
    )
    found = _concepts(text, "en")
    assert found["two dollar radio"][:2] == ("Two Dollar Radio", "ENTITY")  # spaCy: MONEY
    assert "two hundred" not in found and "five dollar" not in found  # amounts stay values
