"""Pass 3 verification: a relation between two concepts stands only on an exact quote.

A verifier looks at one candidate pair in one section and returns a `Verdict` (relation type,
direction, the quote, confidence) or `None` (ABSTAIN). Whatever proposed it, a verdict goes
through `accept()`: its type must be in the whitelist of seed §11, its quote must be found in
the section text by normalised matching (`quote_found`: case, diacritics, punctuation and
spacing ignored, word order and words exact) and must name both concepts. So an LLM may
propose, never decide.

- `RuleVerifier` (the default, no LLM): a sentence of the section naming both concepts with a
  relation cue between them (`CUES`, English and French), at most `MAX_FILLER` other words in
  between, neither mention being only part of a longer name ("Physics" in "Journal of Applied
  Physics"); the quote is that sentence, verbatim. A bare copula ("X is a Y") is no cue: in
  encyclopedic text it mostly links a subject to an adjective of its description.
- `LlmVerifier`: asks an OpenAI-compatible chat endpoint for a JSON proposal or ABSTAIN.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import structlog

from pml_common.concepts import FUNCTION_WORDS, singular, words
from pml_common.knowledge_graph import SEMANTIC_RELATION_TYPES
from pml_common.settings import Settings

log = structlog.get_logger(__name__)

#: Words besides the cue allowed between the two mentions.
MAX_FILLER = 3
#: Longest quote kept (characters).
MAX_QUOTE_CHARS = 600
RULE_CONFIDENCE = 0.6
STRONG_CONFIDENCE = 0.8

# (cue, relation type, reversed): "A <cue> B" is TYPE(A→B), or TYPE(B→A) when reversed.
CUES: tuple[tuple[str, str, bool], ...] = (
    ("requires", "REQUIRES", False),
    ("require", "REQUIRES", False),
    ("needs", "REQUIRES", False),
    ("is required by", "REQUIRES", True),
    ("are required by", "REQUIRES", True),
    ("nécessite", "REQUIRES", False),
    ("exige", "REQUIRES", False),
    ("requiert", "REQUIRES", False),
    ("a besoin de", "REQUIRES", False),
    ("enables", "ENABLES", False),
    ("enable", "ENABLES", False),
    ("allows", "ENABLES", False),
    ("makes possible", "ENABLES", False),
    ("is enabled by", "ENABLES", True),
    ("permet", "ENABLES", False),
    ("rend possible", "ENABLES", False),
    ("prevents", "PREVENTS", False),
    ("prevent", "PREVENTS", False),
    ("is prevented by", "PREVENTS", True),
    ("empêche", "PREVENTS", False),
    ("causes", "CAUSES", False),
    ("caused", "CAUSES", False),
    ("leads to", "CAUSES", False),
    ("led to", "CAUSES", False),
    ("results in", "CAUSES", False),
    ("resulted in", "CAUSES", False),
    ("is caused by", "CAUSES", True),
    ("was caused by", "CAUSES", True),
    ("provoque", "CAUSES", False),
    ("entraîne", "CAUSES", False),
    ("applies to", "APPLIES_TO", False),
    ("apply to", "APPLIES_TO", False),
    ("is applicable to", "APPLIES_TO", False),
    ("s'applique à", "APPLIES_TO", False),
    ("depends on", "DEPENDS_ON", False),
    ("depend on", "DEPENDS_ON", False),
    ("relies on", "DEPENDS_ON", False),
    ("dépend de", "DEPENDS_ON", False),
    ("repose sur", "DEPENDS_ON", False),
    ("is part of", "PART_OF", False),
    ("was part of", "PART_OF", False),
    ("part of", "PART_OF", False),
    ("belongs to", "PART_OF", False),
    ("is a member of", "PART_OF", False),
    ("member of", "PART_OF", False),
    ("is located in", "PART_OF", False),
    ("located in", "PART_OF", False),
    ("is a subsidiary of", "PART_OF", False),
    ("is a division of", "PART_OF", False),
    ("includes", "PART_OF", True),
    ("contains", "PART_OF", True),
    ("consists of", "PART_OF", True),
    ("fait partie de", "PART_OF", False),
    ("appartient à", "PART_OF", False),
    ("est situé dans", "PART_OF", False),
    ("se trouve dans", "PART_OF", False),
    ("comprend", "PART_OF", True),
    ("contient", "PART_OF", True),
    ("mitigates", "MITIGATES", False),
    ("reduces", "MITIGATES", False),
    ("is mitigated by", "MITIGATES", True),
    ("atténue", "MITIGATES", False),
    ("réduit", "MITIGATES", False),
    ("conflicts with", "CONFLICTS_WITH", False),
    ("contradicts", "CONFLICTS_WITH", False),
    ("is incompatible with", "CONFLICTS_WITH", False),
    ("entre en conflit avec", "CONFLICTS_WITH", False),
    ("est incompatible avec", "CONFLICTS_WITH", False),
    ("contredit", "CONFLICTS_WITH", False),
    ("defines", "DEFINES", False),
    ("is defined by", "DEFINES", True),
    ("définit", "DEFINES", False),
    ("est défini par", "DEFINES", True),
    ("is an example of", "EXAMPLE_OF", False),
    ("is a type of", "EXAMPLE_OF", False),
    ("is a kind of", "EXAMPLE_OF", False),
    ("is a form of", "EXAMPLE_OF", False),
    ("such as", "EXAMPLE_OF", True),
    ("est un exemple de", "EXAMPLE_OF", False),
    ("est un type de", "EXAMPLE_OF", False),
    ("tel que", "EXAMPLE_OF", True),
    ("is governed by", "GOVERNED_BY", False),
    ("governed by", "GOVERNED_BY", False),
    ("is regulated by", "GOVERNED_BY", False),
    ("regulated by", "GOVERNED_BY", False),
    ("is subject to", "GOVERNED_BY", False),
    ("est régi par", "GOVERNED_BY", False),
    ("régi par", "GOVERNED_BY", False),
    ("est encadré par", "GOVERNED_BY", False),
    ("est soumis à", "GOVERNED_BY", False),
)

#: A quote with one of these is a strong source (a norm or a definition, seed §4).
STRONG_MARKERS = (
    "shall",
    "must",
    "is defined as",
    "are defined as",
    "doit",
    "doivent",
    "est défini comme",
    "se définit comme",
)
#: A section under one of these headings is a strong source (glossary, norm).
STRONG_HEADINGS = ("glossary", "definition", "glossaire", "norme", "standard", "specification")

_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)")
_RAW_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_OWNED = re.compile(r"['’]s\b")
_ELIDED = re.compile(r"\b(?:[Qq]u|[LlDdJjMmNnTtCcSs])['’]")
#: Words that join a name to its complement ("of", "de"...).
_NAME_LINKS = frozenset({"of", "de", "du", "des", "d"})


def _keyed(text: str) -> list[str]:
    return [singular(w) for w in words(text)]


def _cased_words(sentence: str) -> list[str]:
    """The sentence's words as written (possessives and elisions dropped like `fold` does),
    one per folded word, so that index i here is index i of `_keyed(sentence)`."""
    cased: list[str] = []
    for raw in _RAW_WORD.findall(_ELIDED.sub(" ", _OWNED.sub("", sentence))):
        cased.extend([raw] * len(words(raw)))
    return cased


def _embedded(cased: Sequence[str], keyed: Sequence[str], start: int, end: int) -> bool:
    """Whether words [start, end) are only part of a longer name: "Physics" inside "Journal of
    Applied Physics", "Wisconsin" inside "University of Wisconsin Press"."""
    before = start - 1
    if before >= 0 and keyed[before] in _NAME_LINKS:
        before -= 1  # "... of X": look at the word the link hangs from
    if before >= 0 and _is_name_word(cased[before], keyed[before]) and before + 1 < start:
        return True  # "Journal of | Physics"
    if start > 0 and _is_name_word(cased[start - 1], keyed[start - 1]) and start - 1 > 0:
        return True  # "Applied | Physics" (a sentence's first word is capitalised anyway)
    after = end
    if after < len(keyed) and keyed[after] in _NAME_LINKS:
        after += 1
    return after < len(keyed) and after > end and _is_name_word(cased[after], keyed[after])


def _is_name_word(cased: str, keyed: str) -> bool:
    return cased[:1].isupper() and keyed not in FUNCTION_WORDS


_CUE_WORDS = sorted(
    ((tuple(_keyed(cue)), rtype, rev) for cue, rtype, rev in CUES), key=lambda c: -len(c[0])
)
_STRONG_WORDS = [tuple(_keyed(m)) for m in STRONG_MARKERS]


@dataclass(frozen=True)
class Concept:
    key: str
    name: str


@dataclass(frozen=True)
class SectionEvidence:
    """A section two candidate concepts are both mentioned in."""

    context_id: str
    document_id: str
    section_path: str
    text: str


@dataclass(frozen=True)
class Verdict:
    relation_type: str
    source: str  # concept key
    target: str
    quote: str
    context_id: str
    document_id: str
    confidence: float
    strong: bool
    verifier: str


class Verifier(Protocol):
    name: str

    async def verify(self, a: Concept, b: Concept, section: SectionEvidence) -> Verdict | None:
        """A verdict for the pair in this section, or None (ABSTAIN)."""
        ...


# --- matching -------------------------------------------------------------------------------


def normalised(text: str) -> str:
    """Text as matched: folded words joined by single spaces, padded with one on each side."""
    return " " + " ".join(words(text)) + " "


def quote_found(section_text: str, quote: str) -> bool:
    """Whether `quote` occurs in the section text, up to case, accents, punctuation, spaces."""
    needle = normalised(quote)
    return needle.strip() != "" and needle in normalised(section_text)


def _find(haystack: Sequence[str], needle: Sequence[str]) -> list[int]:
    n = len(needle)
    if n == 0:
        return []
    first, whole = needle[0], tuple(needle)
    return [
        i
        for i in range(len(haystack) - n + 1)
        if haystack[i] == first and tuple(haystack[i : i + n]) == whole
    ]


def names_concept(text: str, key: str) -> bool:
    return bool(_find(_keyed(text), key.split()))


def is_strong(quote: str, section_path: str) -> bool:
    tokens = _keyed(quote)
    if any(_find(tokens, marker) for marker in _STRONG_WORDS):
        return True
    heading = " ".join(words(section_path))
    return any(h in heading for h in STRONG_HEADINGS)


def accept(verdict: Verdict | None, a: Concept, b: Concept, section: SectionEvidence) -> bool:
    """The one gate every proposal passes: whitelisted type, ends are the pair, and a quote
    found in the section text that names both concepts."""
    if verdict is None:
        return False
    return (
        verdict.relation_type in SEMANTIC_RELATION_TYPES
        and {verdict.source, verdict.target} == {a.key, b.key}
        and verdict.source != verdict.target
        and 0 < len(verdict.quote) <= MAX_QUOTE_CHARS
        and quote_found(section.text, verdict.quote)
        and names_concept(verdict.quote, a.key)
        and names_concept(verdict.quote, b.key)
    )


def sentences(text: str) -> list[str]:
    return [m.group(0).strip() for m in _SENTENCE.finditer(text) if m.group(0).strip()]


# --- the default verifier -----------------------------------------------------------------


def cue_between(gap: Sequence[str]) -> tuple[str, bool] | None:
    """(relation type, reversed) of the longest cue in the words between two mentions."""
    for cue, relation_type, reverse in _CUE_WORDS:
        if len(gap) - len(cue) <= MAX_FILLER and _find(gap, cue):
            return relation_type, reverse
    return None


def _tokenized(sentence: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The sentence's keyed words and, index for index, its words as written (the keyed ones
    again when the two do not align: unusual scripts have no case to rely on)."""
    tokens = tuple(_keyed(sentence))
    cased = tuple(_cased_words(sentence))
    return tokens, cased if len(cased) == len(tokens) else tokens


#: Sentences whose words one verifier keeps (a pair's sections are read sentence by sentence,
#: and the sections of a batch are shared by many pairs).
SENTENCE_CACHE = 16384


class RuleVerifier:
    """Deterministic: a sentence naming both concepts with a relation cue between them."""

    name = "rules"

    def __init__(self) -> None:
        # Tokenising is most of the work, and a pure function of the sentence: once per sentence.
        self._tokenized = functools.lru_cache(maxsize=SENTENCE_CACHE)(_tokenized)

    async def verify(self, a: Concept, b: Concept, section: SectionEvidence) -> Verdict | None:
        for sentence in sentences(section.text):
            verdict = self._in_sentence(a, b, sentence, section)
            if accept(verdict, a, b, section):
                return verdict
        return None

    def _in_sentence(
        self, a: Concept, b: Concept, sentence: str, section: SectionEvidence
    ) -> Verdict | None:
        tokens, cased = self._tokenized(sentence)
        a_words, b_words = a.key.split(), b.key.split()
        a_at = [
            i for i in _find(tokens, a_words) if not _embedded(cased, tokens, i, i + len(a_words))
        ]
        b_at = [
            i for i in _find(tokens, b_words) if not _embedded(cased, tokens, i, i + len(b_words))
        ]
        for ia in a_at:
            for ib in b_at:
                if ia < ib:
                    first, second, lo, hi = a, b, ia + len(a_words), ib
                else:
                    first, second, lo, hi = b, a, ib + len(b_words), ia
                if lo > hi:
                    continue  # the mentions overlap
                found = cue_between(tokens[lo:hi])
                if found is None:
                    continue
                relation_type, reverse = found
                source, target = (second, first) if reverse else (first, second)
                strong = is_strong(sentence, section.section_path)
                return Verdict(
                    relation_type=relation_type,
                    source=source.key,
                    target=target.key,
                    quote=sentence[:MAX_QUOTE_CHARS],
                    context_id=section.context_id,
                    document_id=section.document_id,
                    confidence=STRONG_CONFIDENCE if strong else RULE_CONFIDENCE,
                    strong=strong,
                    verifier=self.name,
                )
        return None


# --- the optional LLM verifier ------------------------------------------------------------

_SYSTEM = (
    "You verify whether a text states a relation between two concepts. Relation types: "
    + ", ".join(sorted(SEMANTIC_RELATION_TYPES))
    + '. Answer with one JSON object: {"relation_type": TYPE, "direction": "A->B" or "B->A", '
    '"evidence_span": an exact short quote of the text that states it, "confidence": 0..1}, '
    'or {"abstain": true} when the text does not state such a relation explicitly.'
)


class LlmVerifier:
    """Proposals from an OpenAI-compatible `/chat/completions` endpoint, checked by `accept`."""

    name = "llm"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> LlmVerifier:
        key = settings.llm_verifier_api_key
        return cls(
            settings.llm_verifier_url,
            settings.llm_verifier_model,
            key.get_secret_value() if key else None,
            settings.llm_verifier_timeout_s,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def verify(self, a: Concept, b: Concept, section: SectionEvidence) -> Verdict | None:
        prompt = f"A: {a.name}\nB: {b.name}\nText:\n{section.text}"
        response = await self._client.post(
            self._url,
            headers=self._headers,
            json={
                "model": self._model,
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": prompt},
                ],
            },
        )
        response.raise_for_status()
        proposal = _proposal(response.json())
        verdict = self._verdict(proposal, a, b, section) if proposal else None
        if verdict is not None and not accept(verdict, a, b, section):
            log.info(
                "pass3.llm_proposal_rejected",
                context_id=section.context_id,
                relation_type=verdict.relation_type,
                quote=verdict.quote[:200],
            )
            return None
        return verdict

    def _verdict(
        self, proposal: dict[str, Any], a: Concept, b: Concept, section: SectionEvidence
    ) -> Verdict | None:
        relation_type = str(proposal.get("relation_type", "")).upper()
        quote = str(proposal.get("evidence_span", "")).strip()
        direction = str(proposal.get("direction", "A->B")).replace("→", "->").replace(" ", "")
        if not relation_type or not quote:
            return None
        source, target = (b, a) if direction.upper() == "B->A" else (a, b)
        try:
            confidence = float(proposal.get("confidence", RULE_CONFIDENCE))
        except (TypeError, ValueError):
            confidence = RULE_CONFIDENCE
        return Verdict(
            relation_type=relation_type,
            source=source.key,
            target=target.key,
            quote=quote,
            context_id=section.context_id,
            document_id=section.document_id,
            confidence=max(0.0, min(1.0, confidence)),
            strong=is_strong(quote, section.section_path),
            verifier=self.name,
        )


def _proposal(body: Any) -> dict[str, Any] | None:
    """The JSON object of the model's answer; None for ABSTAIN or anything unreadable."""
    try:
        content = str(body["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError):
        return None
    start, end = content.find("{"), content.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(content[start : end + 1])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("abstain"):
        return None
    return data


def build_verifier(settings: Settings) -> RuleVerifier | LlmVerifier:
    if settings.pass3_verifier == "llm":
        return LlmVerifier.from_settings(settings)
    return RuleVerifier()
