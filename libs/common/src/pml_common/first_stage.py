"""The first stage of tool ranking: lexical (BM25) and dense relevance, fused.

Every ranking of tools starts here: search's `Search` and `SearchTools`, the scorer's served
score and the trainer's comparison of a candidate model with "no learning at all". The fused
relevance is the `semantic` term of seed 000's ``semantic × reliability``.

Lexical side: BM25 (bm25s, k1 = 1.2, b = 0.75) over a tool's name, server, description and
input-schema field names. Tokens: identifiers are split at snake/kebab/camel boundaries
("getWalletBalance" → get, wallet, balance), lower-cased, English stop words dropped, English
words stemmed (Snowball); runs of Chinese, Japanese or Korean characters become overlapping
character bigrams (a single character stays a unigram), the usual way to index CJK text
without a dictionary. One tokenizer serves documents and queries.

Dense side: the tool embedder (`PML_TOOL_EMBEDDER`, by default Universal Sentence Encoder,
multilingual-e5-small and all-MiniLM-L6-v2 side by side) gives one cosine similarity per model.

Fusion: every retriever's scores are min-max normalised over the tenant's catalog for the
query (so each lies in [0, 1] whatever the model's cosine range: e5's cosines crowd into
0.7–0.9, USE's spread over 0–0.8), then weighted: USE 0.2, e5 0.3, MiniLM 0.3, BM25 0.2 by
default (`DENSE_WEIGHTS`, by the number of models; two: 0.35 and 0.40, BM25 0.25; one dense
model alone: 0.7, BM25 0.3). A catalog of one entry keeps the raw cosine.

Scripts: a tool whose description is written in another script than the request (a Chinese
description read for an English request, or the reverse) is misjudged by the retrievers that
cannot read across scripts: BM25 (no shared tokens), MiniLM (English only) and, measured, e5
(multilingual, but it loses most of what it finds across scripts). Its relevance is
therefore the mean of its fused relevance and the relevance of the models that do read across
(USE; each model says, `embedding.part_reach`), their weights scaled to sum to one
(`FOREIGN_SCRIPT_SHARE`). With 40 of MetaTool's 199 descriptions translated into Chinese, the
two-tool tasks' recall@5 goes from 0.7113 to 0.7304 (another 40: 0.6348 to 0.7022; 0.7294
all in English); ETOM's multi-step tasks with 40 of their tools' descriptions in Chinese,
0.8199 to 0.8268 (docs/benchmarks.md, "Descriptions in another script"). A request in
another script than most of the catalog has every tool judged so, those in its own script
too: BM25 and the one-script models would otherwise fill its top with them (a Chinese request
over ETOM with 40 Chinese descriptions: recall@5 0.4765 → 0.5244; "Requests in another
language"). A model that reads English only (MiniLM; `Reach`) has no say for a request in
another script, its weight shared among the other retrievers in proportion. A text's script
is the one most of its words are written in (`script`); a request in Latin script over a
catalog all in it ranks exactly as without these rules.

Sub-goals: a request that chains steps ("check my balance, then send 0.05 ETH") is also
split into its sentences and "then / after that / finally / next" clauses, in English,
Chinese (然后, 接着, 最后, ...) or Japanese (at most `MAX_SUB_GOALS`, each of three words or
more, a Chinese word counted as 1.5 characters); each tool's relevance becomes
``0.5·relevance(request) + 0.5·max over sub-goals of relevance(sub-goal)``, so every step
finds its tool instead of the most-mentioned one filling the top. A one-clause request ranks
as before. The weights and this share were chosen on the development sets only
(`tools-metatool`, `tools-etom`); see docs/benchmarks.md, "First stage".
"""

from __future__ import annotations

import itertools
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

#: Weights of the dense relevances (one per model of the tool embedder); the rest is lexical.
DENSE_WEIGHTS: dict[int, tuple[float, ...]] = {1: (0.7,), 2: (0.35, 0.40), 3: (0.2, 0.3, 0.3)}

#: Share of the cross-script models' relevance alone in the relevance of a tool written in
#: another script than the request (the rest is its ordinary fused relevance). Chosen on the
#: Chinese probes of MetaTool and ETOM (docs/benchmarks.md): the best or within 0.2 point of it
#: on the two MetaTool ones, 0.2 below the best on ETOM's.
FOREIGN_SCRIPT_SHARE = 0.5

#: Sub-goals of one request read at most (each costs one more embedding).
MAX_SUB_GOALS = 6
#: Share of the best sub-goal's relevance in a chained request's relevance.
SUB_GOAL_SHARE = 0.5
#: Sub-goals are looked for in the start of a request only, as the embedder reads it.
SUB_GOAL_CHARS = 2_000
_SUB_GOAL_BREAK = re.compile(
    r"(?<=[.?!;])\s+"
    r"|,?\s+(?:and\s+)?(?:then|after that|afterwards|finally|next"
    r"|once (?:you have|that is done)[^,]*,)\s+"
    # Chinese and Japanese: a full-width sentence end needs no space after it; the words for
    # "then" mark a step wherever they stand, those that can also mean "last" or "again" (最后,
    # 再) only after a comma.
    r"|(?<=[。！？；])\s*"
    r"|[，,、]?\s*(?:然后|接着|随后|紧接着|それから|その後|次に)"
    r"|[，,、]\s*(?:之后|此后|最后|最终|再|最後に)",
    re.IGNORECASE,
)
#: Letters of the scripts written without spaces between words (Japanese kana, Chinese).
_UNSPACED_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNSPACED_RUN = re.compile(f"[{_UNSPACED_CHARS}]+")
#: A Chinese word's mean length in characters: how a clause without spaces is counted in words.
CHARS_PER_UNSPACED_WORD = 1.5
#: Words a sub-goal has at least (fewer is a fragment: "thanks", "and finally").
SUB_GOAL_WORDS = 3

#: The retrievers a request may name: both fused (the default), or one alone for comparison.
HYBRID = "hybrid"
DENSE = "dense"
LEXICAL = "lexical"
RETRIEVERS = (HYBRID, DENSE, LEXICAL)
BM25_K1 = 1.2
BM25_B = 0.75

_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: Those and Korean Hangul, which is written with spaces.
_CJK_CHARS = _UNSPACED_CHARS + "\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK_CHARS}]+")
LATIN = "latin"
CJK = "cjk"


class Reach(Enum):
    """How far a model of the tool embedder reads (each model says, `embedding.part_reach`)."""

    #: English only (MiniLM): no say for a text in another script.
    ENGLISH = "english"
    #: Many languages, but its cosines across scripts are not on one scale with those within
    #: one (e5 at 4 bits): it does not judge a tool in another script than the text alone.
    MULTILINGUAL = "multilingual"
    #: Many languages, its cosines across scripts on one scale with those within one (USE).
    CROSS_SCRIPT = "cross-script"


#: Objects each thread keeps for itself (`_stemmer`).
_PER_THREAD = threading.local()


@dataclass(frozen=True)
class ToolText:
    """What the lexical index reads of a tool."""

    id: str
    server: str
    name: str
    description: str
    #: Field names of the tool's input schema (top-level properties).
    fields: tuple[str, ...] = ()

    def lexical_text(self) -> str:
        return " ".join((self.name, self.server, self.description, *self.fields))

    def script(self) -> str:
        """The script of what the tool says it does (its description, else its name)."""
        return script(self.description) if self.description.strip() else script(self.name)


def script(text: str) -> str:
    """The writing system most of `text`'s words are in: `LATIN`, `CJK` (Chinese, Japanese or
    Korean), or the lower-cased Unicode name of another ("cyrillic", "arabic", ...).

    A CJK character counts as a word (a Chinese word is one or two of them); digits count for
    none; a text without letters is `LATIN`. ASCII text is answered without reading it.
    """
    if text.isascii():
        return LATIN
    counts: Counter[str] = Counter()
    for run in _CJK_RUN.findall(text):
        counts[CJK] += len(run)
    for word in _WORD.findall(_CJK_RUN.sub(" ", text)):
        first = word[0]
        if first.isdigit():
            continue
        counts[LATIN if first.isascii() else _script_of(first)] += 1
    if not counts:
        return LATIN
    return max(counts.items(), key=lambda item: (item[1], item[0] == LATIN))[0]


def _script_of(letter: str) -> str:
    name = unicodedata.name(letter, "")
    return name.split(" ", 1)[0].lower() if name else LATIN


def schema_fields(input_schema: Any) -> tuple[str, ...]:
    """Top-level property names of a JSON schema (empty for anything else)."""
    if not isinstance(input_schema, dict):
        return ()
    properties = input_schema.get("properties")
    if not isinstance(properties, dict):
        return ()
    return tuple(str(name) for name in properties)


def _stemmer() -> Any:
    """This thread's stemmer: a PyStemmer object is not safe to share between threads, and
    queries are tokenized in search's dense-pass thread while an index is built in another."""
    stemmer = getattr(_PER_THREAD, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _PER_THREAD.stemmer = Stemmer.Stemmer("english")
    return stemmer


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def _cjk_bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def tokenize(text: str) -> list[str]:
    """The lexical tokens of `text` (see the module docstring)."""
    split = _BOUNDARY.sub(" ", text).lower()
    cjk: list[str] = []
    if _CJK_RUN.search(split):
        for run in _CJK_RUN.findall(split):
            cjk.extend(_cjk_bigrams(run))
        split = _CJK_RUN.sub(" ", split)
    stop = _stop_words()
    words = [w for w in _WORD.findall(split) if w not in stop]
    stems: list[str] = _stemmer().stemWords(words) if words else []
    return stems + cjk


class LexicalIndex:
    """BM25 over a fixed list of tools; rebuilt as a whole when the list changes."""

    def __init__(
        self,
        retriever: Any,
        vocabulary: dict[str, int],
        size: int,
        scripts: Sequence[str] = (),
    ) -> None:
        self._retriever = retriever
        self._vocabulary = vocabulary
        self._size = size
        #: Each tool's script (`ToolText.script`), as codes into `_script_names`.
        self._script_names = sorted(set(scripts))
        code = {name: i for i, name in enumerate(self._script_names)}
        self._scripts = np.array([code[name] for name in scripts], dtype=np.int16)
        #: The script most tools are written in.
        self._main_script = Counter(scripts).most_common(1)[0][0] if scripts else LATIN

    @classmethod
    def build(cls, docs: Sequence[ToolText]) -> LexicalIndex:
        import bm25s

        vocabulary: dict[str, int] = {}
        ids = [
            [vocabulary.setdefault(t, len(vocabulary)) for t in tokenize(d.lexical_text())]
            for d in docs
        ]
        scripts = [d.script() for d in docs]
        if not vocabulary:
            return cls(None, {}, len(docs), scripts)
        retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B)
        retriever.index(
            bm25s.tokenization.Tokenized(ids=ids, vocab=vocabulary), show_progress=False
        )
        return cls(retriever, vocabulary, len(docs), scripts)

    def __len__(self) -> int:
        return self._size

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every tool for `query`, in the order the tools were given."""
        known = [t for t in tokenize(query) if t in self._vocabulary]
        if not known or self._retriever is None:
            return np.zeros(self._size, dtype=np.float32)
        return np.asarray(self._retriever.get_scores(known), dtype=np.float32)

    def foreign(self, text: str) -> np.ndarray | None:
        """(n,) True for the tools judged as written in another script than `text`: those
        that are, or every tool when `text` is not in the script most tools are written in;
        None when there is none (the usual case, answered without a pass over the tools).

        The few tools in a minority script are not judged on their own terms for a request
        in that script: BM25 and the models that read one script favour them over all the
        others (a Chinese request over a mostly English catalog with 40 Chinese descriptions
        filled 38 % of its top five with those 40 tools; docs/benchmarks.md, "Requests in
        another language")."""
        return self._foreign_to(script(text))

    def _foreign_to(self, wanted: str) -> np.ndarray | None:
        if not self._script_names or self._script_names == [wanted]:
            return None
        if wanted != self._main_script:
            return np.ones(self._size, dtype=bool)
        return np.asarray(self._scripts != self._script_names.index(wanted))

    def scored(self, text: str) -> tuple[np.ndarray, np.ndarray | None, str]:
        """What the first stage reads here of `text`: `scores`, `foreign` and its `script`."""
        wanted = script(text)
        return self.scores(text), self._foreign_to(wanted), wanted


def sub_goals(query: str) -> list[str]:
    """The clauses of a request that chains several steps; empty for a one-step request."""
    parts = [p.strip().strip("，、") for p in _SUB_GOAL_BREAK.split(query[:SUB_GOAL_CHARS]) if p]
    parts = [p for p in parts if _words(p) >= SUB_GOAL_WORDS]
    return parts[:MAX_SUB_GOALS] if len(parts) > 1 else []


def _words(clause: str) -> float:
    """How many words `clause` has, a run of Chinese or Japanese characters counting as one
    word per `CHARS_PER_UNSPACED_WORD` of its characters."""
    unspaced = sum(len(run) for run in _UNSPACED_RUN.findall(clause))
    return len(_UNSPACED_RUN.sub(" ", clause).split()) + unspaced / CHARS_PER_UNSPACED_WORD


def with_sub_goals(whole: np.ndarray, goals: Sequence[np.ndarray]) -> np.ndarray:
    """A chained request's relevance: its own, blended with its best sub-goal's per tool."""
    if not goals:
        return whole
    best = np.max(np.vstack(goals), axis=0)
    blended: np.ndarray = (1.0 - SUB_GOAL_SHARE) * whole + SUB_GOAL_SHARE * best
    return blended.astype(np.float32)


def retriever_problem(name: str) -> str | None:
    """Why `name` is no retriever, or None ("" means the default, hybrid)."""
    if name in ("", *RETRIEVERS):
        return None
    return f"retriever must be one of {', '.join(RETRIEVERS)} (got {name[:40]!r})"


def min_max(scores: np.ndarray) -> np.ndarray:
    """Scores mapped onto [0, 1] by the lowest and highest (clipped raw scores when all tie)."""
    scores = np.asarray(scores, dtype=np.float32)
    if scores.size == 0:
        return scores
    low, high = float(scores.min()), float(scores.max())
    if high - low <= 1e-9:
        clipped: np.ndarray = np.clip(scores, 0.0, 1.0)
        return clipped
    return ((scores - low) / (high - low)).astype(np.float32)


def normalised_lexical(lexical: np.ndarray) -> np.ndarray:
    """BM25 scores divided by the best one (all zeros stay zeros); BM25's lowest is 0."""
    best = float(lexical.max()) if lexical.size else 0.0
    if best <= 0.0:
        return np.zeros_like(lexical, dtype=np.float32)
    return (lexical / best).astype(np.float32)


def dense_parts(vectors: np.ndarray, query: np.ndarray, part_dims: Sequence[int]) -> np.ndarray:
    """(models, n) cosine similarities of each model of an ensemble embedder."""
    models = [vectors[:, start : start + width] for start, width in part_spans(part_dims)]
    return part_cosines(models, np.asarray(query)[None])[:, 0]


def part_cosines(models: Sequence[np.ndarray], queries: np.ndarray) -> np.ndarray:
    """(models, m, n) cosines of `m` ensemble query vectors (m, dim) with `n` rows given as
    each model's columns (`models[p]`: (n, width of model p)).

    An ensemble vector is its models' unit vectors side by side, each scaled by 1/√k, so the
    dot product of one slice times k is that model's cosine. One product per model serves all
    `m` queries: at 10k rows the pass is bound by reading the rows, not by the arithmetic.
    """
    rows = []
    spans = part_spans([matrix.shape[1] for matrix in models])
    for (start, width), matrix in zip(spans, models, strict=True):
        rows.append(_products(matrix, queries[:, start : start + width]) * len(models))
    if not rows:
        return np.zeros((0, len(queries), 0), dtype=np.float32)
    return np.stack(rows).astype(np.float32, copy=False)


#: Rows per block of `_products`: 128 rows (256 kB of a 512-dimension model) stay in the
#: core's cache while the few query columns go over them.
PRODUCT_BLOCK_ROWS = 128


def _products(matrix: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """(m, n) products of `m` queries with `n` rows.

    One query is a matrix-vector product. With several, one BLAS product of all the rows first
    copies them into its own layout (OpenBLAS's packing): at 10k rows it reads and writes the
    whole matrix twice and takes twice the time of one query's product. A stack of 128-row
    blocks, multiplied in one call (numpy loops over the stack in C), keeps each copy in
    cache: with 2 to 8 queries the pass takes 0.5 to 0.8 of the time (measured with 10k rows
    of 512 and 384 dimensions).
    """
    if len(queries) == 1:
        return np.asarray(matrix @ queries[0])[None]
    rows, width = matrix.shape
    whole = rows - rows % PRODUCT_BLOCK_ROWS
    if whole == 0 or not matrix.flags.c_contiguous:
        return np.asarray(matrix @ queries.T).T
    blocks = matrix[:whole].reshape(-1, PRODUCT_BLOCK_ROWS, width) @ queries.T
    products = blocks.reshape(whole, len(queries))
    if whole < rows:
        products = np.concatenate([products, matrix[whole:] @ queries.T])
    return np.asarray(products).T


def part_spans(widths: Sequence[int]) -> list[tuple[int, int]]:
    """(start, width) of consecutive slices of the given widths."""
    starts = [0, *itertools.accumulate(widths)][: len(widths)]
    return list(zip(starts, widths, strict=True))


class TextScores(NamedTuple):
    """What the first stage fuses for one text (a request or one of its sub-goals)."""

    #: (models, n) cosines of each model of the tool embedder, or (n,) of one.
    dense: np.ndarray
    #: (n,) raw BM25 scores.
    lexical: np.ndarray
    #: (n,) True for the tools judged as written in another script than the text
    #: (`LexicalIndex.foreign`); None when none is.
    foreign: np.ndarray | None = None
    #: The text's script (`script`).
    script: str = LATIN


def hybrid_relevance(
    request: TextScores, goals: Sequence[TextScores], reach: Sequence[Reach] = ()
) -> np.ndarray:
    """The hybrid retriever's relevance: the request's fused relevance blended with its
    sub-goals'; `reach` as for `fused_relevance`."""
    return with_sub_goals(
        fused_relevance(*request, reach=reach),
        [fused_relevance(*g, reach=reach) for g in goals],
    )


def fused_relevance(
    dense: np.ndarray,
    lexical: np.ndarray,
    foreign: np.ndarray | None = None,
    text_script: str = LATIN,
    *,
    weights: Sequence[float] | None = None,
    reach: Sequence[Reach] = (),
) -> np.ndarray:
    """The first stage's relevance of each tool, in [0, 1] (see the module docstring).

    `dense`: (n,) cosines of one model or (models, n); `lexical`: (n,) raw BM25 scores;
    `foreign`: the tools in another script than the text (`LexicalIndex.foreign`), judged in
    part (`FOREIGN_SCRIPT_SHARE`) by the models that read across scripts alone;
    `text_script`: the text's (`script`); `reach`: how far each model reads (empty: every
    model across scripts). A model that reads English only has no say for a text in another
    script, its weight shared among the others in proportion.
    """
    parts = np.atleast_2d(np.asarray(dense, dtype=np.float32))
    reach = tuple(reach) or (Reach.CROSS_SCRIPT,) * len(parts)
    chosen = _weights_for(
        tuple(weights) if weights is not None else DENSE_WEIGHTS[len(parts)], reach, text_script
    )
    normalised = [min_max(row) for row in parts]
    fused = (1.0 - sum(chosen)) * normalised_lexical(np.asarray(lexical, dtype=np.float32))
    for weight, row in zip(chosen, normalised, strict=True):
        fused = fused + weight * row
    readers = [i for i, how in enumerate(reach) if how is Reach.CROSS_SCRIPT and chosen[i] > 0]
    if foreign is not None and readers and foreign.any():
        across = sum(chosen[i] * normalised[i] for i in readers) / sum(chosen[i] for i in readers)
        share = FOREIGN_SCRIPT_SHARE
        fused = np.where(foreign, (1.0 - share) * fused + share * across, fused)
    return np.clip(fused, 0.0, 1.0).astype(np.float32)


def _weights_for(
    weights: tuple[float, ...], reach: Sequence[Reach], text_script: str
) -> tuple[float, ...]:
    """The dense weights for a text in `text_script`: those of the models that read only
    English set to 0 for a text in another script, the rest (BM25 included) scaled up to make
    up for them. Unchanged when every model would be left out (nothing better reads it)."""
    if text_script == LATIN:
        return weights
    blind = [how is Reach.ENGLISH for how in reach]
    if not any(blind) or all(blind):
        return weights
    kept = 1.0 - sum(w for w, b in zip(weights, blind, strict=True) if b)
    return tuple(0.0 if b else w / kept for w, b in zip(weights, blind, strict=True))
