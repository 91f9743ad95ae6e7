import hashlib

import pytest

from pml_common.context_id import document_of, make_context_id, normalise_section_path


def test_context_id_follows_the_seed_formula() -> None:
    path = "1.2 Security Architecture"
    expected_hash = hashlib.sha256(b"Joule_L0_f8e565db:1.2_security_architecture").hexdigest()[:12]
    assert make_context_id("Joule_L0_f8e565db", path) == f"sec:Joule_L0_f8e565db:{expected_hash}"


def test_path_normalisation_makes_equal_paths_equal_ids() -> None:
    assert normalise_section_path("  1.2 Security  ") == "1.2_security"
    assert make_context_id("d", "1.2 Security") == make_context_id("d", " 1.2 SECURITY ")
    assert make_context_id("d", "1.2 Security") != make_context_id("d", "1.3 Security")
    assert make_context_id("d1", "Intro") != make_context_id("d2", "Intro")


def test_document_of_inverts_the_format_even_with_colons_in_ids() -> None:
    assert document_of(make_context_id("tenant:doc:7", "A / B")) == "tenant:doc:7"
    with pytest.raises(ValueError):
        document_of("chunk-12")
