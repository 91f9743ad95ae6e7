"""The verifiers: exact quotes found by normalised matching, or ABSTAIN.

The LLM verifier is tested against a local fake OpenAI-compatible endpoint (the only mock:
no model runs here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pml_ingest.verifier import (
    Concept,
    LlmVerifier,
    RuleVerifier,
    SectionEvidence,
    Verdict,
    accept,
    quote_found,
)

QUOTATION = Concept("solution quotation management", "Solution Quotation Management")
CONTRACT = Concept("service contract execution", "Service Contract Execution")
TEXT = (
    "Sales teams prepare offers. Service Contract Execution requires Solution Quotation "
    "Management to have approved the offer. Nothing else happens."
)
SECTION = SectionEvidence("sec:d1:abc", "d1", "Guide / Process", TEXT)


def test_quote_matching_ignores_case_accents_punctuation_and_spacing() -> None:
    text = "La  transformation d’une Proposition, en contrat exécutable."
    assert quote_found(text, "transformation d'une proposition en contrat executable")
    assert quote_found(text, "PROPOSITION en   contrat")
    assert not quote_found(text, "proposition vers contrat")
    assert not quote_found(text, "   ")


async def test_rule_verifier_quotes_the_sentence_with_a_cue() -> None:
    verdict = await RuleVerifier().verify(QUOTATION, CONTRACT, SECTION)
    assert verdict is not None
    assert verdict.relation_type == "REQUIRES"
    assert (verdict.source, verdict.target) == (CONTRACT.key, QUOTATION.key)
    assert verdict.quote in TEXT
    assert verdict.context_id == SECTION.context_id
    assert not verdict.strong


async def test_rule_verifier_reads_passive_and_french_cues() -> None:
    passive = SectionEvidence(
        "sec:d:1",
        "d",
        "P",
        "Solution quotation management is required by service contract execution.",
    )
    verdict = await RuleVerifier().verify(QUOTATION, CONTRACT, passive)
    assert verdict is not None and (verdict.source, verdict.target) == (CONTRACT.key, QUOTATION.key)
    fr = SectionEvidence(
        "sec:d:2", "d", "Règles", "Le contrat de service nécessite la validation du devis."
    )
    a, b = Concept("contrat de service", "contrat de service"), Concept("validation du devis", "v")
    verdict = await RuleVerifier().verify(a, b, fr)
    assert verdict is not None and verdict.relation_type == "REQUIRES"
    assert verdict.source == a.key


async def test_rule_verifier_abstains_without_cue_or_in_different_sentences() -> None:
    no_cue = SectionEvidence(
        "s", "d", "P", "Service contract execution and solution quotation management are topics."
    )
    assert await RuleVerifier().verify(QUOTATION, CONTRACT, no_cue) is None
    apart = SectionEvidence(
        "s", "d", "P", "Service contract execution requires care. Solution quotation management."
    )
    assert await RuleVerifier().verify(QUOTATION, CONTRACT, apart) is None
    far = SectionEvidence(
        "s",
        "d",
        "P",
        "Service contract execution requires, for many long and complicated historical "
        "reasons, solution quotation management.",
    )
    assert await RuleVerifier().verify(QUOTATION, CONTRACT, far) is None


async def test_a_norm_is_a_strong_source() -> None:
    norm = SectionEvidence(
        "s",
        "d",
        "Policy",
        "Service contract execution shall require solution quotation management.",
    )
    verdict = await RuleVerifier().verify(QUOTATION, CONTRACT, norm)
    assert verdict is not None and verdict.strong


def test_the_gate_rejects_quotes_not_in_the_text_unknown_types_and_other_ends() -> None:
    good = Verdict(
        "REQUIRES",
        CONTRACT.key,
        QUOTATION.key,
        "Service Contract Execution requires Solution Quotation Management",
        SECTION.context_id,
        "d1",
        0.6,
        False,
        "x",
    )
    assert accept(good, QUOTATION, CONTRACT, SECTION)
    invented = Verdict(
        "REQUIRES",
        CONTRACT.key,
        QUOTATION.key,
        "Service contract execution always needs solution quotation management",
        "s",
        "d1",
        0.9,
        False,
        "x",
    )
    assert not accept(invented, QUOTATION, CONTRACT, SECTION)
    assert not accept(
        Verdict("RELATED_TO", *(good.source, good.target, good.quote, "s", "d1", 1, False, "x")),
        QUOTATION,
        CONTRACT,
        SECTION,
    )
    unnamed = Verdict(
        "REQUIRES", CONTRACT.key, QUOTATION.key, "Nothing else happens", "s", "d1", 0.9, False, "x"
    )
    assert not accept(unnamed, QUOTATION, CONTRACT, SECTION)
    assert not accept(None, QUOTATION, CONTRACT, SECTION)


# --- the LLM verifier against a fake OpenAI-compatible endpoint -------------------------------


def _endpoint(answer: str, seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": answer}}]})

    return httpx.MockTransport(handle)


@pytest.fixture
def llm() -> Callable[[str], tuple[LlmVerifier, list[dict[str, Any]]]]:
    def make(answer: str) -> tuple[LlmVerifier, list[dict[str, Any]]]:
        seen: list[dict[str, Any]] = []
        client = httpx.AsyncClient(transport=_endpoint(answer, seen))
        return LlmVerifier("http://fake/v1", "m", "k", client=client), seen

    return make


async def test_llm_proposal_with_a_quote_from_the_text_is_accepted(llm) -> None:
    answer = json.dumps(
        {
            "relation_type": "REQUIRES",
            "direction": "B->A",
            "evidence_span": "Service Contract Execution requires Solution Quotation Management",
            "confidence": 0.85,
        }
    )
    verifier, seen = llm(f"Here is my answer: {answer}")
    verdict = await verifier.verify(QUOTATION, CONTRACT, SECTION)
    assert verdict is not None
    assert (verdict.source, verdict.target) == (CONTRACT.key, QUOTATION.key)
    assert verdict.confidence == 0.85 and verdict.verifier == "llm"
    assert seen[0]["model"] == "m" and TEXT in seen[0]["messages"][1]["content"]


async def test_llm_invented_quote_is_rejected(llm) -> None:
    answer = json.dumps(
        {
            "relation_type": "REQUIRES",
            "direction": "B->A",
            "evidence_span": "Service Contract Execution is impossible without Solution Quotation Management",
        }
    )
    verifier, _ = llm(answer)
    assert await verifier.verify(QUOTATION, CONTRACT, SECTION) is None


async def test_llm_abstain_and_garbage_give_abstain(llm) -> None:
    for answer in ('{"abstain": true}', "ABSTAIN", "not json {", '{"relation_type": "REQUIRES"}'):
        verifier, _ = llm(answer)
        assert await verifier.verify(QUOTATION, CONTRACT, SECTION) is None


async def test_a_mention_inside_a_longer_name_is_no_mention() -> None:
    text = (
        "The Journal of Applied Physics is a type of scientific journal. "
        "Applied Physics is part of the University of Wisconsin Press."
    )
    section = SectionEvidence("s", "d", "P", text)
    physics, journal = Concept("physic", "Physics"), Concept("scientific journal", "journal")
    assert await RuleVerifier().verify(physics, journal, section) is None
    wisconsin = Concept("wisconsin", "Wisconsin")
    assert await RuleVerifier().verify(Concept("applied physic", "x"), wisconsin, section) is None
    whole = Concept("journal of applied physic", "Journal of Applied Physics")
    verdict = await RuleVerifier().verify(whole, journal, section)
    assert verdict is not None and verdict.relation_type == "EXAMPLE_OF"


async def test_a_bare_copula_is_no_relation_cue() -> None:
    section = SectionEvidence("s", "d", "P", "Glory is a 1989 American war film.")
    assert (
        await RuleVerifier().verify(Concept("glory", "Glory"), Concept("american", "x"), section)
        is None
    )


async def test_a_contraction_keeps_the_case_of_the_sentence_readable() -> None:
    # "I'll" is one folded word: read as two written words it misaligned the sentence's case
    # with its words, and without case "Service Contract Execution" inside a longer name
    # ("Journal of Service Contract Execution") was taken for the concept itself.
    text = (
        "I'll say it: Journal of Service Contract Execution requires Solution Quotation Management."
    )
    section = SectionEvidence("sec:d:1", "d", "P", text)
    assert await RuleVerifier().verify(QUOTATION, CONTRACT, section) is None
    plain = SectionEvidence("sec:d:1", "d", "P", text.replace("Journal of ", ""))
    verdict = await RuleVerifier().verify(QUOTATION, CONTRACT, plain)
    assert verdict is not None and verdict.relation_type == "REQUIRES"
