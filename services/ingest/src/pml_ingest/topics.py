"""Pass 2a: structural topics of a document and what they cover (seed 001 §4, deterministic).

Topics come from the document's structure only: its root heading (H1, or the title) and the
headings one level below it (H2, or top-level numbering "2 Scope"), numbering stripped, named
by `canonical_key` so that the same heading in two documents is one topic. Generic headings
("Introduction", "Notes"...: stop-concepts) are no topic. At most `MAX_TOPICS` per document:
the root, then the largest by text.

- `HAS_TOPIC.salience` = share of the document's text in the sections attached to the topic.
- A section is attached to the topics named in its heading trail.
- `COVERS` (topic → concept): the concept is MENTIONED_IN a section attached to the topic, with
  salience >= `min_salience`, and is no stop-concept; `confidence` = its best such salience.

Topics are scope: nothing here links two concepts, and nothing here is evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pml_common.concepts import canonical_key, is_stop_concept
from pml_ingest.chunker import strip_numbering

MAX_TOPICS = 15
#: Heading levels that give topics: the root (1) and the level below it (2).
TOPIC_LEVELS = 2


@dataclass(frozen=True)
class SectionOutline:
    context_id: str
    trail: tuple[str, ...]
    length: int


@dataclass(frozen=True)
class Topic:
    topic_id: str
    name: str
    salience: float
    context_ids: tuple[str, ...]


@dataclass(frozen=True)
class Cover:
    topic_id: str
    concept_key: str
    confidence: float


def topic_name(heading: str) -> str:
    return strip_numbering(heading)


def document_topics(sections: Sequence[SectionOutline]) -> list[Topic]:
    """The document's topics, root first."""
    total = sum(s.length for s in sections) or 1
    names: dict[str, str] = {}
    attached: dict[str, list[SectionOutline]] = {}
    for section in sections:
        for heading in section.trail[:TOPIC_LEVELS]:
            if heading.startswith("¶"):
                continue
            name = topic_name(heading)
            topic_id = canonical_key(name)
            if is_stop_concept(topic_id):
                continue
            names.setdefault(topic_id, name)
            members = attached.setdefault(topic_id, [])
            if section not in members:
                members.append(section)
    topics = [
        Topic(
            topic_id=tid,
            name=names[tid],
            salience=round(min(1.0, sum(s.length for s in members) / total), 4),
            context_ids=tuple(s.context_id for s in members),
        )
        for tid, members in attached.items()
    ]
    if len(topics) <= MAX_TOPICS:
        return topics
    root, rest = topics[0], sorted(topics[1:], key=lambda t: -t.salience)
    return [root, *rest[: MAX_TOPICS - 1]]


def covers(
    topics: Sequence[Topic],
    mentions: Mapping[str, Sequence[tuple[str, float]]],
    min_salience: float,
) -> list[Cover]:
    """COVERS of each topic; `mentions` maps a context id to its (concept key, salience)."""
    result: list[Cover] = []
    for topic in topics:
        best: dict[str, float] = {}
        for context_id in topic.context_ids:
            for key, value in mentions.get(context_id, ()):
                if value < min_salience or is_stop_concept(key) or key == topic.topic_id:
                    continue
                best[key] = max(best.get(key, 0.0), value)
        result.extend(Cover(topic.topic_id, key, value) for key, value in sorted(best.items()))
    return result
