from pml_common.concepts import (
    canonical_key,
    detect_language,
    is_stop_concept,
    ngram_keys,
    singular,
)


def test_english_surface_forms_share_a_key() -> None:
    assert canonical_key("The Security Requirements") == canonical_key("security requirement")
    assert canonical_key("companies") == "company"
    assert canonical_key("the University of Copenhagen") == "university of copenhagen"
    assert canonical_key("Hello Love's") == "hello love"
    assert canonical_key("processes") == "process"


def test_french_surface_forms_share_a_key() -> None:
    assert canonical_key("les Conditions Générales") == canonical_key("condition générale")
    assert canonical_key("l'entreprise") == "entreprise"
    assert canonical_key("les journaux") == "journal"
    assert canonical_key("des chevaux") == "cheval"
    assert canonical_key("Évaluation des risques") == "evaluation des risque"
    assert canonical_key("les jeux") == "jeu"


def test_words_that_look_plural_but_are_not_stay() -> None:
    for word in ("analysis", "class", "bus", "status"):
        assert singular(word) == word


def test_only_function_words_give_no_key() -> None:
    assert canonical_key("of the") == ""
    assert canonical_key("de la") == ""


def test_english_contractions_leave_no_word_behind() -> None:
    for text in ("I'll", "they're", "we’ve", "you'd", "I'm", "don't", "won't", "can't", "isn't"):
        assert canonical_key(text) == "", text
    assert canonical_key("we've planned the Sales Plan") == "planned the sale plan"
    assert canonical_key("O'Reilly Media") == "o reilly media"
    assert canonical_key("Rock 'n' Roll") == "rock roll"


def test_question_ngrams_include_the_concept_keys_of_documents() -> None:
    keys = ngram_keys("Who published the Journal of Mathematical Physics?")
    assert canonical_key("Journal of Mathematical Physics") in keys
    assert "mathematical physic" in keys
    assert all(k.split()[0] not in {"the", "of"} for k in keys)
    assert keys == list(dict.fromkeys(keys))


def test_language_detection() -> None:
    assert detect_language("The contract is signed by the customer and the vendor.") == "en"
    assert detect_language("Le contrat est signé par le client et le fournisseur.") == "fr"
    assert detect_language("Jan Philip Solovej") == "en"


def test_stop_concepts() -> None:
    assert is_stop_concept("introduction")
    assert is_stop_concept(canonical_key("Exemples"))
    assert is_stop_concept("1963")
    assert not is_stop_concept("contract")
