"""The multi-evidence policy of Pass 3 (seed 001 §4).

Verdicts for one pair are grouped by (type, source, target); a group becomes a relation when
one of its evidences is a strong source (a norm or definition: "shall", "must", "is defined
as", a glossary section...) or when it has at least `MIN_INDEPENDENT` evidences from different
sections. Otherwise nothing is written: without enough anchoring a relation is decoration, not
knowledge. Confidence grows with the evidence: the best verdict's confidence plus
`PER_EXTRA_EVIDENCE` per further section, at most `MAX_CONFIDENCE`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pml_ingest.verifier import Verdict

MIN_INDEPENDENT = 2
PER_EXTRA_EVIDENCE = 0.1
MAX_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Relation:
    relation_type: str
    source: str
    target: str
    evidence: tuple[Verdict, ...]  # one per section, in the order found
    confidence: float
    strong: bool
    multi_evidence: bool

    @property
    def context_ids(self) -> list[str]:
        return [v.context_id for v in self.evidence]

    @property
    def document_ids(self) -> list[str]:
        return list(dict.fromkeys(v.document_id for v in self.evidence))


def decide(verdicts: Iterable[Verdict]) -> list[Relation]:
    """Relations that the verdicts support under the policy (possibly none)."""
    groups: dict[tuple[str, str, str], dict[str, Verdict]] = {}
    for verdict in verdicts:
        group = groups.setdefault((verdict.relation_type, verdict.source, verdict.target), {})
        group.setdefault(verdict.context_id, verdict)  # one evidence per section
    relations = []
    for (relation_type, source, target), by_section in groups.items():
        evidence = tuple(by_section.values())
        strong = any(v.strong for v in evidence)
        if not strong and len(evidence) < MIN_INDEPENDENT:
            continue
        best = max(v.confidence for v in evidence)
        confidence = min(MAX_CONFIDENCE, best + PER_EXTRA_EVIDENCE * (len(evidence) - 1))
        relations.append(
            Relation(
                relation_type=relation_type,
                source=source,
                target=target,
                evidence=evidence,
                confidence=round(confidence, 4),
                strong=strong,
                multi_evidence=len(evidence) >= MIN_INDEPENDENT,
            )
        )
    return relations
