"""Pass 2b: fine classification of concepts, deterministic by default.

A named entity takes the type of its NER label (both languages' label sets); a noun phrase
the type its head word suggests (the first word of a French compound "X de Y", else the last
word, as in English), else "concept". Nothing here is evidence or creates a relation
(seed 001 §4, Pass 2b).
"""

from __future__ import annotations

ENTITY_TYPES = {
    "PERSON": "person",
    "PER": "person",
    "NORP": "group",
    "ORG": "organization",
    "GPE": "place",
    "LOC": "place",
    "FAC": "place",
    "PRODUCT": "product",
    "EVENT": "event",
    "WORK_OF_ART": "work",
    "LAW": "regulation",
    "LANGUAGE": "language",
    "MISC": "named_thing",
}

_HEAD_WORDS = {
    "process": "process procedure workflow transformation execution management processus "
    "gestion validation approval approbation migration integration",
    "regulation": "policy regulation law standard norm directive rule requirement compliance "
    "politique reglementation loi norme regle exigence conformite",
    "system": "system platform service tool application software module api database "
    "systeme plateforme outil logiciel base",
    "business_document": "contract quotation proposal offer order invoice agreement "
    "contrat devis proposition offre commande facture accord",
    "risk": "risk threat vulnerability attack incident risque menace vulnerabilite attaque",
    "organization": "company organization organisation association university team department "
    "entreprise societe universite equipe",
}
#: Head word (canonical form) → fine type.
HEAD_TYPES = {word: kind for kind, text in _HEAD_WORDS.items() for word in text.split()}

DEFAULT_TYPE = "concept"
_FRENCH_LINKS = frozenset({"de", "du", "des", "d", "a", "au", "aux"})


def fine_type(key: str, entity_label: str) -> str:
    """The fine type of a concept from its key and the NER label it was seen with, if any."""
    if entity_label in ENTITY_TYPES:
        return ENTITY_TYPES[entity_label]
    parts = key.split()
    if not parts:
        return DEFAULT_TYPE
    french_compound = any(p in _FRENCH_LINKS for p in parts[1:-1])
    head = parts[0] if french_compound else parts[-1]
    return HEAD_TYPES.get(head, DEFAULT_TYPE)
