"""Linking a question to the tenant's concepts: its seeds, by key, alias, fuzzy and dense name.

Ingestion names a concept by `canonical_key(surface form)`; a question reaches it when some
span of the question has that key (an `EXACT` link, what Ask always did). Questions word
things otherwise than the text, so two more links are tried, against an index of the tenant's
concept and topic names (`NameIndex`, built once per tenant and dropped with the propagation
graph, `pml_search.propagation`):

- `ALIAS`: the span's words, function words and all, are those of a concept's name. A title
  made of function words loses them in its key ("It'll Be Me" has the key "ll", shared with
  every "we'll"); its alias keeps them ("it ll be me"), and so does its spacing ("Spider-Man"
  and "Spiderman" share the alias "spiderman" written without spaces). A title's alias also
  drops its qualifier: a question names "Frozen", whose article is "Frozen (2013 film)"
  (HotpotQA's titles are such), or "Rochester" for "Rochester, New York". A named span is
  linked to every key it names so, besides its own key; any other span only to titles (a
  question may write "the monster trucks" for the film "Monster Trucks (film)"). A span whose
  own key is a title gets no alias: the document it names exactly is the one meant ("Audrey
  Williams", not "Audrey Williams (archaeologist)").
- `FUZZY`: a named span of the question (a run of capitalised words, "Tikhaya Sosna") whose
  key is no concept is compared with every concept name by the cosine of their character
  trigrams weighted by inverse frequency (scipy.sparse, a few sparse rows per question); the
  best names above `FUZZY_MIN` are linked at their score ("Tikhaya Sosna" → "tikhaya sosna
  river", "Sathish Kalathil" → "sathish kalathi").
- `DENSE`: a named span that none of the above links is compared by meaning with the names of
  the tenant's entities and topics (the passage embedder's vectors of those names, computed
  when the index is built; `with_vectors`): the nearest name at `DENSE_MIN` or more is linked
  at its cosine. It finds what shares no spelling: a translation ("Allemagne" → Germany), an
  abbreviation ("NYC" → New York City). With Universal Sentence Encoder, names of one entity
  score 0.82–0.96 and distinct entities of one kind 0.44–0.59 ("Germany" and "France").

Entity types come from spaCy: ingestion records each concept's NER label (PERSON, ORG,
WORK_OF_ART...) and whether it is a heading (a topic). A named span of the question linked to
such an entity is what the question is about; the single common words inside it ("pop" inside
"Pop Idol", "station" inside "Bayswater Station") are linked too but marked `inside_entity`
and weighted down by `INSIDE_ENTITY_FACTOR`, so that a word rare in the corpus does not pull
the walk away from the entity around it. Likewise, in a question that names an entity, a
single lower-case common noun ("what station", "the craft", "the pop band") is marked
`common_word` and weighted down by `COMMON_WORD_FACTOR`: rare in a small corpus, it weighs like
a name by its document frequency alone and pulls the walk to the sections that happen to use
it. Each link says how it was made (`Link`), and Ask returns it with the seed.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from pml_common.concepts import canonical_key, singular, words

EXACT = "exact"
ALIAS = "alias"
FUZZY = "fuzzy"
DENSE = "dense"
#: Entity type of a noun phrase and of a heading (the NER label otherwise).
CONCEPT_TYPE = "CONCEPT"
TOPIC_TYPE = "TOPIC"
#: Longest question span looked up (ingestion keeps noun phrases of up to 6 words).
MAX_SPAN_WORDS = 6
#: Lowest trigram cosine of a fuzzy link, and fuzzy links kept per named span.
FUZZY_MIN = 0.7
FUZZY_PER_SPAN = 2
#: Lowest cosine of a dense link (one per named span).
DENSE_MIN = 0.8
#: Names embedded per tenant for dense links, topics first (at 512 floats: 40 MB).
DENSE_MAX_NAMES = 20_000
#: What a name vector weighs in the index's cache weight (its bytes over a stored trigram's).
DENSE_NAME_WEIGHT = 256
#: Weight of a seed whose words lie inside a named entity the question was linked to, and of
#: a single lower-case common noun of a question that names an entity.
INSIDE_ENTITY_FACTOR = 0.25
COMMON_WORD_FACTOR = 0.25
#: Lower-case words that may join the capitalised words of a name ("Bank of England").
NAME_CONNECTORS = frozenset(
    {"of", "the", "and", "de", "la", "le", "du", "des", "von", "van", "der", "den", "di", "da"}
    | {"del", "y", "for", "in", "on", "upon", "from", "to", "a", "an", "at", "with", "&"}
)

#: Connectors that join two names rather than words of one name.
COORDINATORS = frozenset({"and", "or", "y", "et", "und"})
# A title's qualifier: its disambiguation ("Frozen (2013 film)", "Richard Wright (author)"),
# or the place after a comma ("West Chicago, Illinois").
_QUALIFIER = re.compile(r"\s*(?:\([^()]*\)|,[^,]*)\s*$")
# A word of the question with its inner apostrophes, hyphens and dots ("It'll", "U.S.").
_TOKEN = re.compile(r"[^\W_]+(?:['’.\-][^\W_]+)*")


@dataclass(frozen=True)
class NameRow:
    """A concept or topic of the tenant, as the index needs it."""

    key: str
    name: str
    #: NER label from ingestion, `CONCEPT_TYPE` for a noun phrase, `TOPIC_TYPE` for a heading.
    entity_type: str


@dataclass(frozen=True)
class Link:
    """A concept key the question names, and how."""

    key: str
    how: str  # EXACT, ALIAS, FUZZY or DENSE
    score: float  # 1 for EXACT and ALIAS, the trigram cosine for FUZZY, the cosine for DENSE
    span: str  # the question's words
    start: int  # word offsets of the span in the question, end excluded
    end: int
    entity_type: str
    inside_entity: bool = False
    #: A single common word of the question beside the named entities it links.
    common_word: bool = False

    @property
    def factor(self) -> float:
        """How much of its specificity the seed keeps."""
        return seed_factor(self.score, self.inside_entity, self.common_word)


def seed_factor(score: float, inside_entity: bool, common_word: bool) -> float:
    """A link's score, cut for a word inside a named entity or a common word beside one."""
    factor = score * (INSIDE_ENTITY_FACTOR if inside_entity else 1.0)
    return factor * (COMMON_WORD_FACTOR if common_word else 1.0)


@dataclass(frozen=True)
class _Token:
    text: str
    start: int
    end: int


@dataclass
class Draft:
    """A question's links before the dense ones (`NameIndex.draft`)."""

    tokens: list[_Token]
    found: list[Link] = field(default_factory=list)
    #: word offsets of the named spans linked to an entity
    entities: list[tuple[int, int]] = field(default_factory=list)
    #: named spans nothing linked: (text, start, end)
    unlinked: list[tuple[str, int, int]] = field(default_factory=list)


def alias_of(text: str) -> str:
    """Every word of `text`, function words included, folded and singular."""
    return " ".join(singular(w) for w in words(text))


def _trigrams(text: str) -> list[str]:
    padded = f" {text} "
    return [padded[i : i + 3] for i in range(len(padded) - 2)]


def _is_entity(entity_type: str) -> bool:
    return entity_type != CONCEPT_TYPE


class NameIndex:
    """One tenant's concept and topic names: keys, aliases, a trigram matrix and, once given
    (`with_vectors`), the vectors of its entities' and topics' names."""

    def __init__(self, rows: Iterable[NameRow]) -> None:
        self.types: dict[str, str] = {}
        #: keys that are topics: the titles a lower-case span may name by alias
        self.titles: set[str] = set()
        names: dict[str, list[str]] = defaultdict(list)
        #: unit vectors of `dense_names`, one row each (see `with_vectors`)
        self._vectors = np.zeros((0, 0), dtype=np.float32)
        for row in rows:
            if not row.key:
                continue
            # A key that is both a concept and a topic keeps the concept's NER label.
            if self.types.get(row.key, TOPIC_TYPE) == TOPIC_TYPE:
                self.types[row.key] = row.entity_type
            names[row.key].append(row.name)
            if row.entity_type == TOPIC_TYPE:
                self.titles.add(row.key)
        self.keys = sorted(self.types)
        #: (concept, topic) pairs where the concept names a document (`title_links`): the walk's
        #: title routes, scipy's and GDS's alike, computed once with the index
        self.title_links = title_links(
            [k for k in self.keys if self.types[k] != TOPIC_TYPE],
            title_forms({k: names[k] for k in self.titles}),
        )
        #: concept key -> the topics of the documents it names (`title_links` by concept)
        named: dict[str, list[str]] = defaultdict(list)
        for key, topic in self.title_links:
            named[key].append(topic)
        self.named = dict(named)
        #: alias form -> the keys whose names have it (a name can be ambiguous: "Frozen").
        self.aliases: dict[str, list[str]] = defaultdict(list)
        for key in self.keys:
            for form in sorted({f for name in names[key] for f in _alias_forms(name)}):
                self.aliases[form].append(key)
        self._vocabulary: dict[str, int] = {}
        self._idf = np.zeros(0, dtype=np.float32)
        #: trigram -> the keys that hold it, by TF-IDF (each key's vector of unit length)
        self._grams = sparse.csr_array(self._trigram_matrix().T)
        #: the topics and entities a named span may be linked to by meaning, one name each
        dense = sorted(
            (k for k in self.keys if _is_entity(self.types[k])), key=lambda k: k not in self.titles
        )
        self.dense_keys = dense[:DENSE_MAX_NAMES]
        self.dense_names = [min(names[k], key=len) for k in self.dense_keys]

    @property
    def weight(self) -> int:
        """Its cost in a cache: names plus stored trigrams, and its name vectors (counted
        before they are computed: they may arrive after the index is cached)."""
        vectors = len(self.dense_names) * DENSE_NAME_WEIGHT
        links = 2 * len(self.title_links)  # as pairs, and by concept (`named`)
        return max(1, len(self.keys) + int(self._grams.nnz) + vectors + links)

    def with_vectors(self, vectors: np.ndarray) -> NameIndex:
        """Keeps the unit vectors of `dense_names` (row i: name i). In single precision: numpy
        has no BLAS product in half precision (25 times slower at 10,000 names)."""
        if vectors.shape[0] != len(self.dense_names):
            raise ValueError(f"{vectors.shape[0]} vectors for {len(self.dense_names)} names")
        self._vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        return self

    @property
    def has_vectors(self) -> bool:
        return self._vectors.shape[0] > 0

    def dense(self, vector: np.ndarray) -> tuple[str, float] | None:
        """The entity or topic whose name is nearest `vector` (a unit vector of a span), with
        its cosine, if at least `DENSE_MIN`."""
        if not self.has_vectors:
            return None
        scores = self._vectors @ vector.astype(np.float32)
        best = int(np.argmax(scores))
        score = float(scores[best])
        return (self.dense_keys[best], min(1.0, score)) if score >= DENSE_MIN else None

    def _trigram_matrix(self) -> sparse.csr_array:
        """Rows: keys; columns: trigrams; TF-IDF, each row of unit length."""
        rows: list[int] = []
        cols: list[int] = []
        for row, key in enumerate(self.keys):
            for gram in _trigrams(key):
                rows.append(row)
                cols.append(self._vocabulary.setdefault(gram, len(self._vocabulary)))
        shape = (len(self.keys), len(self._vocabulary))
        ones = np.ones(len(rows), dtype=np.float32)
        counts = sparse.csr_array((ones, (rows, cols)), shape=shape)
        counts.sum_duplicates()
        df = np.bincount(counts.indices, minlength=shape[1]).astype(np.float32)
        self._idf = np.log((1.0 + shape[0]) / (1.0 + df)).astype(np.float32) + 1.0
        return _unit_rows(sparse.csr_array(counts @ sparse.diags_array(self._idf)))

    def fuzzy(self, text: str, limit: int = FUZZY_PER_SPAN) -> list[tuple[str, float]]:
        """The keys whose trigrams are nearest the canonical form of `text`, with their cosine
        (at least `FUZZY_MIN`), best first."""
        key = canonical_key(text)
        grams = Counter(_trigrams(key)) if key else Counter()
        known = {self._vocabulary[g]: n for g, n in grams.items() if g in self._vocabulary}
        if not known:
            return []
        columns = np.fromiter(known, dtype=np.int64)
        weights = np.fromiter(known.values(), dtype=np.float32) * self._idf[columns]
        # Unit length over all its trigrams, known or not: unknown ones lower the cosine.
        unseen = sum(n for g, n in grams.items() if g not in self._vocabulary)
        norm = math.sqrt(float((weights**2).sum()) + unseen * float(self._idf.max()) ** 2)
        query = sparse.csr_array(
            (weights / norm, (np.zeros(len(columns), dtype=np.int64), columns)),
            shape=(1, len(self._vocabulary)),
        )
        # Only the keys that share a trigram get a score: a sparse row over the keys.
        scores = sparse.csr_array(query @ self._grams)
        order = np.argsort(-scores.data, kind="stable")[:limit]
        return [
            (self.keys[int(scores.indices[i])], float(scores.data[i]))
            for i in order
            if scores.data[i] >= FUZZY_MIN
        ]

    def link(
        self, question: str, span_vectors: Mapping[str, np.ndarray] | None = None
    ) -> list[Link]:
        """The question's links, one per key (its strongest), in question order;
        `span_vectors` are the unit vectors of its unlinked named spans (`Draft.unlinked`),
        for dense links."""
        return self.finish(self.draft(question), span_vectors or {})

    def draft(self, question: str) -> Draft:
        """Every link but the dense ones, and the named spans left for them: what Ask embeds
        between `draft` and `finish`, so that each span is looked up once."""
        tokens = _tokens(question)
        draft = Draft(tokens)
        for start, end in _named_spans(tokens):
            for link in self._named(question, tokens, start, end, draft.unlinked):
                draft.found.append(link)
                if _is_entity(link.entity_type):
                    draft.entities.append((link.start, link.end))
        # Every span that neither starts nor ends with a function word, by its key (the
        # n-grams of `ngram_keys`, with their place in the question), and the titles it names.
        keyed = [bool(canonical_key(t.text)) for t in tokens]
        for start in range(len(tokens)):
            for end in range(start + 1, min(len(tokens), start + MAX_SPAN_WORDS) + 1):
                if not (keyed[start] and keyed[end - 1]):
                    continue
                text = _text(question, tokens, start, end)
                key = canonical_key(text)
                if key in self.types:
                    draft.found.append(Link(key, EXACT, 1.0, text, start, end, self.types[key]))
                draft.found += [
                    Link(t, ALIAS, 1.0, text, start, end, self.types[t])
                    for t in self._aliases(text, key, titles_only=True)
                ]
        return draft

    def finish(self, draft: Draft, span_vectors: Mapping[str, np.ndarray]) -> list[Link]:
        """The draft's links with the dense links of its unlinked spans (those `span_vectors`
        holds), one per key (its strongest), in question order."""
        found, entities = list(draft.found), list(draft.entities)
        for text, start, end in draft.unlinked:
            nearest = self.dense(span_vectors[text]) if text in span_vectors else None
            if nearest is not None:
                key, score = nearest
                found.append(Link(key, DENSE, round(score, 4), text, start, end, self.types[key]))
                entities.append((start, end))
        linked = _strongest(_mark_inside(found, entities))
        return _mark_common(linked, draft.tokens) if entities else linked

    def _whole(self, question: str, tokens: Sequence[_Token], start: int, end: int) -> list[Link]:
        """The links of a named span as a whole: by its key and by its alias."""
        text = _text(question, tokens, start, end)
        key = canonical_key(text)
        whole = (
            [Link(key, EXACT, 1.0, text, start, end, self.types[key])] if key in self.types else []
        )
        return whole + [
            Link(t, ALIAS, 1.0, text, start, end, self.types[t])
            for t in self._aliases(text, key, titles_only=False)
        ]

    def _aliases(self, text: str, key: str, titles_only: bool) -> list[str]:
        """The keys `text` names by alias besides its own `key` (only titles if `titles_only`);
        none when `key` is a title: the document named exactly is the one meant, not its
        namesakes."""
        if key in self.titles:
            return []
        found = {t for form in _alias_forms(text) for t in self.aliases.get(form, ())} - {key}
        return sorted(t for t in found if t in self.titles or not titles_only)

    def _named(
        self,
        question: str,
        tokens: Sequence[_Token],
        start: int,
        end: int,
        unlinked: list[tuple[str, int, int]],
    ) -> list[Link]:
        """The links of a named span: by its key or alias as a whole; else those of its parts
        between connectors ("Christopher Nolan and Sathish Kalathil"); else fuzzy; else none,
        and the span is added to `unlinked` (for a dense link)."""
        whole = self._whole(question, tokens, start, end)
        if whole:
            return whole
        parts = _parts(tokens, start, end)
        if len(parts) > 1:
            return [
                link for s, e in parts for link in self._named(question, tokens, s, e, unlinked)
            ]
        text = _text(question, tokens, start, end)
        fuzzy = [
            Link(key, FUZZY, round(score, 4), text, start, end, self.types[key])
            for key, score in self.fuzzy(text)
        ]
        if not fuzzy:
            unlinked.append((text, start, end))
        return fuzzy


def title_forms(titles: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """How a concept's key may name a document (title key -> its names): each title's key,
    and its bare form (the key of its name without the qualifier: "West Chicago, Illinois" is
    also "west chicago", "Dear Brother (Hank Williams song)" also "dear brother") when that is
    no title's key and the bare form of no other title (a bare "Frozen" of two films names
    neither)."""
    forms = {key: key for key in titles}
    bare: dict[str, set[str]] = defaultdict(set)
    for key, names in titles.items():
        for name in names:
            form = canonical_key(_QUALIFIER.sub("", name))
            if form and form not in forms:
                bare[form].add(key)
    forms.update({form: next(iter(keys)) for form, keys in bare.items() if len(keys) == 1})
    return forms


def title_links(concepts: Iterable[str], forms: Mapping[str, str]) -> list[tuple[str, str]]:
    """(concept, topic) pairs where the concept's key names a document (`forms`: a title form
    -> its title's key, see `title_forms`): the whole key, else the longest runs of its words
    that are title forms, left to right, not overlapping ("north west iowa" names "iowa";
    "west chicago high school" names "west chicago" when that is a title, not also
    "chicago")."""
    longest = max((len(t.split()) for t in forms), default=0)
    links = []
    for key in concepts:
        if key in forms:
            links.append((key, forms[key]))
            continue
        words = key.split()
        taken = [False] * len(words)
        for size in range(min(longest, len(words) - 1), 0, -1):
            for start in range(len(words) - size + 1):
                run = " ".join(words[start : start + size])
                if run in forms and not any(taken[start : start + size]):
                    links.append((key, forms[run]))
                    taken[start : start + size] = [True] * size
    return links


def _tokens(question: str) -> list[_Token]:
    return [_Token(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(question)]


def _text(question: str, tokens: Sequence[_Token], start: int, end: int) -> str:
    return question[tokens[start].start : tokens[end - 1].end]


def _parts(tokens: Sequence[_Token], start: int, end: int) -> list[tuple[int, int]]:
    """A named span cut at its coordinating words: "Christopher Nolan and Sathish Kalathil"."""
    parts, first = [], start
    for i in range(start, end):
        if tokens[i].text.lower() in COORDINATORS:
            if i > first:
                parts.append((first, i))
            first = i + 1
    if end > first:
        parts.append((first, end))
    return parts


def _alias_forms(name: str) -> list[str]:
    """A name's words with function words ("it ll be me"), the same without spaces, and both
    without the name's qualifier: a disambiguation in brackets ("Frozen (2013 film)" is also
    "frozen") or a place after a comma ("Rochester, New York" is also "rochester")."""
    forms = []
    for text in (name, _QUALIFIER.sub("", name)):
        spaced = alias_of(text)
        if spaced:
            forms += [spaced, spaced.replace(" ", "")]
    return list(dict.fromkeys(forms))


def _unit_rows(matrix: sparse.csr_array) -> sparse.csr_array:
    norms = np.sqrt(np.asarray((matrix**2).sum(axis=1)).ravel())
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return sparse.csr_array(sparse.diags_array(scale) @ matrix).astype(np.float32)


def _capitalised(token: _Token) -> bool:
    return token.text[0].isupper()


def _named_spans(tokens: Sequence[_Token]) -> list[tuple[int, int]]:
    """Runs of capitalised words (with connectors and numbers between them), each as word
    offsets: the names a question writes ("Haymo of Faversham", "It'll Be Me", "Apollo 11").
    A run does not start on a function word ("Who", "The"), as a question's first word is
    capitalised whatever it is."""
    spans = []
    i = 0
    while i < len(tokens):
        if not _capitalised(tokens[i]) or not canonical_key(tokens[i].text):
            i += 1
            continue
        end = i + 1
        while end < len(tokens):
            token = tokens[end]
            if _capitalised(token) or token.text.isdigit():
                end += 1
                continue
            # connectors ("of", "from the") count when a capitalised word follows them
            after = end
            while after < len(tokens) and tokens[after].text.lower() in NAME_CONNECTORS:
                after += 1
            if after == end or after == len(tokens) or not _capitalised(tokens[after]):
                break
            end = after + 1
        spans.append((i, end))
        i = end
    return spans


def _mark_inside(links: Sequence[Link], entities: Sequence[tuple[int, int]]) -> list[Link]:
    """Links whose span lies strictly inside an entity span are marked `inside_entity`."""
    marked = []
    for link in links:
        inside = any(
            s <= link.start and link.end <= e and (link.start, link.end) != (s, e)
            for s, e in entities
        )
        if inside and link.key not in {k.key for k in links if (k.start, k.end) in entities}:
            link = Link(**{**link.__dict__, "inside_entity": True})
        marked.append(link)
    return marked


def _mark_common(links: Sequence[Link], tokens: Sequence[_Token]) -> list[Link]:
    """In a question that names an entity, its single lower-case words linked by key
    ("station", "craft", "pop" in "the pop band founded by one of the stars of Aisa Yeh
    Jahaan") are marked `common_word`: rare in a small corpus, they would otherwise weigh like
    names. The question's casing decides, not the concept's NER label: ingestion keeps the
    label a key was first seen with, and "stars" or "games" can carry ORG or WORK_OF_ART."""
    return [
        Link(**{**link.__dict__, "common_word": True})
        if link.how == EXACT
        and link.end - link.start == 1
        and " " not in link.key
        and not _capitalised(tokens[link.start])
        else link
        for link in links
    ]


def _strongest(links: Sequence[Link]) -> list[Link]:
    """One link per key: the one that keeps most of the seed (then the longest span); a key
    named both inside an entity and on its own keeps the link on its own."""
    best: dict[str, Link] = {}
    for link in links:
        kept = best.get(link.key)
        if kept is None or (link.factor, link.end - link.start) > (
            kept.factor,
            kept.end - kept.start,
        ):
            best[link.key] = link
    return sorted(best.values(), key=lambda x: (x.start, -x.end, x.key))
