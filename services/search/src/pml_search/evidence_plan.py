"""From a question's concepts to the SectionContexts worth searching: the evidence plan (§5.2).

Seeds. The question is linked to the tenant's concepts and topics (`pml_search.seed_linking`:
its spans by key as ingestion keys concepts, by alias, or by fuzzy name); they are its seeds,
weighted by how specific they are: the inverse document frequency over the tenant's sections,
``ln(1 + N/df) / ln(1 + N)``, halved for a key that is part of a longer seed ("psychotherapy"
inside "journal of psychotherapy integration"), times what the link keeps (`Seed.factor`: a
fuzzy link's score; a word inside a named entity of the question, or a single common word
beside one, cut down). The `MAX_SEEDS` heaviest are kept (§5.2: top 10-20).

Plan. Every SectionContext gets a weight from three sources, each normalised to [0, 1]:

1. anchoring (hop 1): each seed's routes (the sections mentioning it, by salience, and the
   sections under a topic it names), times the seed's weight;
2. bridging (hop 2): the concepts of the best hop-1 sections that the question does not name
   (the bridge entities of a multi-hop question: "the association which published X" leads to
   the section of X, whose concepts name the association), weighted by the section's weight,
   their salience there and their own specificity, routed like seeds, at `BRIDGE_SHARE`;
3. reasoning: the evidence sections of the selected paths' edges at the path's score (plus
   `PATH_SHARE`), and the mentions of the paths' inner concepts.

Sections are ranked by the sum; the plan is the `MAX_PLAN_SECTIONS` heaviest. It filters the
vector search (§5.2 step 4, §8.5): nothing outside the graph's answer is searched as evidence,
and each chunk is then ranked by ``semantic + FUSION · plan weight``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pml_common.concepts import is_stop_concept
from pml_search.knowledge_reads import Bridge, ConceptRow, Route
from pml_search.paths import Path
from pml_search.seed_linking import EXACT, Link, seed_factor

MAX_SEEDS = 12
#: Weight of a seed contained in a longer seed.
SUBSUMED_FACTOR = 0.5
#: Routes followed per key (most salient mentions first).
ROUTES_PER_KEY = 40
#: Hop-1 sections whose concepts are followed, and bridge concepts kept.
BRIDGE_SECTIONS = 8
BRIDGE_CONCEPTS = 24
#: A concept in more sections than this is a hub (§8bis: degree > 20), not a bridge.
MAX_BRIDGE_SECTIONS = 20
BRIDGE_SHARE = 0.5
PATH_SHARE = 1.0
MAX_PLAN_SECTIONS = 200
#: graph-ppr: the sections the walk ranks that enter the plan, and how much a section's plan
#: weight adds to a chunk's cosine there (tuned on the dev sets, see docs/benchmarks.md).
PPR_SECTIONS = 200
PPR_FUSION = 1.0
#: How much a section's plan weight adds to a chunk's cosine similarity.
FUSION = 0.5


@dataclass(frozen=True)
class Seed:
    key: str
    name: str
    weight: float
    sections: int
    topic: bool
    #: Part of a longer seed of the same question (its weight was halved for it).
    subsumed: bool = False
    #: How the question named it (`pml_search.seed_linking.Link`); an exact key by default.
    link: str = EXACT
    link_score: float = 1.0
    span: str = ""
    entity_type: str = ""
    inside_entity: bool = False
    common_word: bool = False

    @property
    def factor(self) -> float:
        """What its link keeps of its weight: the link's score, cut inside a named entity or
        for a common word beside one (`seed_linking.seed_factor`)."""
        return seed_factor(self.link_score, self.inside_entity, self.common_word)


@dataclass
class EvidencePlan:
    """SectionContext id → weight in (0, 1], and each section's document."""

    weights: dict[str, float] = field(default_factory=dict)
    documents: dict[str, str] = field(default_factory=dict)
    #: How much a section's weight adds to the cosine of its chunks (`fused_score`).
    fusion: float = FUSION

    def ordered(self) -> list[str]:
        return sorted(self.weights, key=lambda c: (-self.weights[c], c))

    def weight(self, context_id: str) -> float:
        return self.weights.get(context_id, 0.0)

    def __bool__(self) -> bool:
        return bool(self.weights)


def specificity(sections: int, total_sections: int) -> float:
    """Inverse document frequency scaled to (0, 1]: 1 for a key of a single section."""
    total = max(total_sections, 1)
    df = max(sections, 1)
    return math.log1p(total / df) / math.log1p(total) if total > 1 else 1.0


def _contained(key: str, other: str) -> bool:
    return key != other and f" {key} " in f" {other} "


def seeds_of(
    rows: Iterable[ConceptRow], total_sections: int, links: Mapping[str, Link] | None = None
) -> list[Seed]:
    """The question's seeds, heaviest first (ties: longer key, then the key); `links` say
    how the question named each key (an exact key when absent)."""
    found = [r for r in rows if not is_stop_concept(r.key)]
    keys = [r.key for r in found]
    seeds = []
    for row in found:
        weight = specificity(row.sections, total_sections)
        subsumed = any(_contained(row.key, other) for other in keys)
        if subsumed:
            weight *= SUBSUMED_FACTOR
        seed = Seed(row.key, row.name, weight, row.sections, row.topic, subsumed)
        link = (links or {}).get(row.key)
        if link is not None:
            seed = replace(
                seed,
                link=link.how,
                link_score=link.score,
                span=link.span,
                entity_type=link.entity_type,
                inside_entity=link.inside_entity,
                common_word=link.common_word,
            )
            seed = replace(seed, weight=weight * seed.factor)
        seeds.append(seed)
    seeds.sort(key=lambda s: (-s.weight, -len(s.key), s.key))
    return seeds[:MAX_SEEDS]


def _normalised(scores: Mapping[str, float]) -> dict[str, float]:
    top = max(scores.values(), default=0.0)
    return {k: v / top for k, v in scores.items()} if top > 0 else {}


def anchor_scores(
    routes: Iterable[Route], key_weights: Mapping[str, float], documents: dict[str, str]
) -> dict[str, float]:
    """Σ key weight × route weight per section, normalised to a maximum of 1."""
    scores: dict[str, float] = defaultdict(float)
    for route in routes:
        weight = key_weights.get(route.key, 0.0)
        if weight > 0:
            scores[route.context_id] += weight * route.weight
            documents[route.context_id] = route.document_id
    return _normalised(scores)


def bridge_keys(
    hop1: Mapping[str, float],
    bridges: Iterable[Bridge],
    seeds: Sequence[Seed],
    total_sections: int,
) -> dict[str, float]:
    """Concepts of the best hop-1 sections that the question does not name, with the strength
    they are followed at: max over sections of section weight × salience, × specificity."""
    named = {s.key for s in seeds}
    strength: dict[str, float] = {}
    for bridge in bridges:
        if bridge.key in named or is_stop_concept(bridge.key):
            continue
        if any(_contained(bridge.key, k) or _contained(k, bridge.key) for k in named):
            continue
        value = max(
            (hop1.get(c, 0.0) * salience for c, salience in bridge.seen_in.items()), default=0.0
        )
        value *= specificity(bridge.sections, total_sections)
        if value > 0:
            strength[bridge.key] = value
    best = sorted(strength.items(), key=lambda kv: (-kv[1], kv[0]))[:BRIDGE_CONCEPTS]
    return dict(best)


def top_sections(scores: Mapping[str, float], n: int) -> list[str]:
    return [c for c, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def combine(
    hop1: Mapping[str, float],
    hop2: Mapping[str, float],
    paths: Sequence[Path],
    path_routes: Mapping[str, float],
    documents: dict[str, str],
) -> EvidencePlan:
    """The plan: anchoring + BRIDGE_SHARE × bridging + the selected paths' evidence."""
    raw: dict[str, float] = defaultdict(float)
    for context_id, value in hop1.items():
        raw[context_id] += value
    for context_id, value in hop2.items():
        raw[context_id] += BRIDGE_SHARE * value
    for context_id, value in path_routes.items():
        raw[context_id] += BRIDGE_SHARE * value
    _add_path_evidence(raw, paths, documents)
    return _plan_of(raw, documents, MAX_PLAN_SECTIONS)


def propagated(
    walked: Mapping[str, float], documents: dict[str, str], paths: Sequence[Path]
) -> EvidencePlan:
    """graph-ppr's plan: the sections by the square root of their walk score normalised to a
    maximum of 1 (walk scores fall by orders of magnitude per hop; the root keeps the second
    hop within reach of the cosine), plus the selected paths' evidence."""
    raw: dict[str, float] = defaultdict(float)
    for context_id, value in _normalised(walked).items():
        raw[context_id] += math.sqrt(value)
    _add_path_evidence(raw, paths, documents)
    plan = _plan_of(raw, documents, PPR_SECTIONS)
    plan.fusion = PPR_FUSION
    return plan


def _add_path_evidence(
    raw: dict[str, float], paths: Sequence[Path], documents: dict[str, str]
) -> None:
    """Each evidence section of a selected path's edges gets `PATH_SHARE` × the path's score."""
    for path in paths:
        for edge in path.edges:
            for evidence in edge.evidence:
                raw[evidence.context_id] += PATH_SHARE * path.score
                if evidence.document_id:
                    documents.setdefault(evidence.context_id, evidence.document_id)


def _plan_of(raw: Mapping[str, float], documents: Mapping[str, str], size: int) -> EvidencePlan:
    """The `size` heaviest sections, normalised to a maximum weight of 1."""
    weights = _normalised(raw)
    kept = top_sections(weights, size)
    return EvidencePlan(
        weights={c: round(weights[c], 6) for c in kept},
        documents={c: documents[c] for c in kept if c in documents},
    )


def fused_score(semantic: float, plan_weight: float, fusion: float = FUSION) -> float:
    """A chunk's rank score: its cosine similarity raised by its section's plan weight."""
    return semantic + fusion * plan_weight
