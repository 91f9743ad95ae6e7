"""Canonical concept keys for English and French text, shared by ingestion and questions.

Pass 1 of ingestion names every concept it extracts by `canonical_key(surface form)`; the
graph-first runtime maps a question to the same keys with `ngram_keys(question)`. Both sides
must agree without sharing a model, so a key is a pure function of the text:

1. Unicode NFKC, case folded, diacritics removed ("Évaluation" → "evaluation");
2. English possessives and French elisions dropped ("Love's" → "love", "l'entreprise" →
   "entreprise", "qu'il" → "il");
3. split into words of letters and digits;
4. leading and trailing function words (determiners, prepositions, pronouns, conjunctions of
   either language) trimmed, inner ones kept ("the University of Copenhagen" →
   "university of copenhagen");
5. each word folded to a singular form by conservative rules that hold for both languages
   ("requirements" → "requirement", "companies" → "company", "journaux" → "journal",
   "chevaux" → "cheval", "jeux" → "jeu"; "analysis", "class", "bus" stay);
6. joined by single spaces.

The rules are language-independent on purpose: a short question may be detected as another
language than the documents it is about, and its keys must still match theirs.
`detect_language` decides which language pipeline extracts a document's concepts.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

#: Languages whose concepts are extracted.
LANGUAGES = ("en", "fr")

_EN_FUNCTION_WORDS = """
a an the this that these those some any each every no all both either neither
of in on at by for with from to into onto upon about above below over under between among
through during before after against within without via per as than and or nor but so yet if
then else when while where whether which who whom whose what how why
i me my mine we us our ours you your yours he him his she her hers it its they them their theirs
is are was were be been being am do does did has have had having will would shall should can
could may might must not also only just very more most other such same own
one there here s
"""

_FR_FUNCTION_WORDS = """
le la les l un une des du de d au aux ce cet cette ces ca
mon ma mes ton ta tes sa ses notre nos votre vos leur leurs
et ou ni mais donc or car que qu quoi qui dont si
a dans en sur sous chez par pour avec sans entre vers contre selon depuis pendant avant apres
je j tu il elle on nous vous ils elles me m te t se s lui y
est sont etait etaient ete etre suis es sommes etes avoir ai as avons avez ont avait
ne n pas plus tres aussi comme tout toute tous toutes autre autres meme
"""

#: Function words of both languages (diacritics removed): trimmed from concept edges.
FUNCTION_WORDS: frozenset[str] = frozenset((_EN_FUNCTION_WORDS + _FR_FUNCTION_WORDS).split())

#: Words that only one language uses often, for `detect_language`.
_EN_MARKER_TEXT = "the of and is was are were with for from by which that this who has have it its"
_FR_MARKER_TEXT = "le la les des du de et est sont une un dans pour par qui que sur avec au aux ce"
_EN_MARKERS = frozenset(_EN_MARKER_TEXT.split())
_FR_MARKERS = frozenset(_FR_MARKER_TEXT.split())

_POSSESSIVE = re.compile(r"['’]s\b")
#: English contractions: "won't", "can't", "shan't" whole, any other "n't" as "not", and the
#: pronoun's 'll, 've, 're, 'd, 'm dropped ("I'll" gave the concept key "ll").
_WHOLE_CONTRACTION = re.compile(r"\b(wo|ca|sha)n['’]t\b")
_WHOLE_FORMS = {"wo": "will not", "ca": "can not", "sha": "shall not"}
_NOT = re.compile(r"n['’]t\b")
_PRONOUN_CONTRACTION = re.compile(r"['’](?:ll|ve|re|d|m)\b")
_ELISION = re.compile(r"\b(?:qu|[ldjmntcs])['’]")
_WORD = re.compile(r"[a-z0-9]+")


def fold(text: str) -> str:
    """NFKC, case folded, diacritics removed, possessives, contractions and elisions dropped."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    plain = _WHOLE_CONTRACTION.sub(lambda m: _WHOLE_FORMS[m.group(1)], plain)
    plain = _PRONOUN_CONTRACTION.sub(" ", _NOT.sub(" not", plain))
    return _ELISION.sub(" ", _POSSESSIVE.sub("", plain))


def words(text: str) -> list[str]:
    """The folded words of `text`, in order."""
    return _WORD.findall(fold(text))


def singular(word: str) -> str:
    """A conservative singular of an English or French word (already folded)."""
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("eaux"):
        return word[:-1]
    if word.endswith("aux") and len(word) > 4:
        return word[:-3] + "al"
    if word.endswith(("eux", "oux")):
        return word[:-1]
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is", "ys")):
        return word[:-1]
    return word


def _trim(tokens: list[str]) -> list[str]:
    start, end = 0, len(tokens)
    while start < end and tokens[start] in FUNCTION_WORDS:
        start += 1
    while end > start and tokens[end - 1] in FUNCTION_WORDS:
        end -= 1
    return tokens[start:end]


def key_of_words(tokens: Iterable[str]) -> str:
    """The key of already folded words (see `canonical_key`)."""
    return " ".join(singular(t) for t in _trim(list(tokens)))


def canonical_key(text: str) -> str:
    """The canonical concept key of a surface form; "" when nothing but function words."""
    return key_of_words(words(text))


def ngram_keys(text: str, max_words: int = 5) -> list[str]:
    """Keys of every word n-gram of `text` (1 to `max_words` words) that neither starts nor
    ends with a function word, longest first, without repeats: the concept keys a question
    may name."""
    tokens = words(text)
    keys: dict[str, None] = {}
    for n in range(min(max_words, len(tokens)), 0, -1):
        for i in range(len(tokens) - n + 1):
            gram = tokens[i : i + n]
            if gram[0] in FUNCTION_WORDS or gram[-1] in FUNCTION_WORDS:
                continue
            keys.setdefault(key_of_words(gram))
    return [k for k in keys if k]


def detect_language(text: str) -> str:
    """ "en" or "fr", by which language's common function words the text uses more.

    Ties (no marker at all, e.g. a bare list of names) go to English.
    """
    tokens = words(text[:20_000])
    en = sum(1 for t in tokens if t in _EN_MARKERS)
    fr = sum(1 for t in tokens if t in _FR_MARKERS)
    return "fr" if fr > en else "en"


_STOP_CONCEPT_TEXTS = """
document documents section sections introduction conclusion overview summary chapter part page
example table figure appendix annex note notes content contents thing things way ways time times
year years day days number numbers lot kind type types use case cases other others one ones
something anything everything someone information data item items list result results
résumé sommaire chapitre partie exemple tableau annexe contenu chose choses façon manière fois
année années jour jours nombre cas élément éléments liste résultat résultats
"""

#: Keys of generic concepts (seed 001 §4, Pass 2a: "pas un concept générique"): never a topic's
#: covered concept, never a relation end.
STOP_CONCEPTS: frozenset[str] = frozenset(
    k for k in (canonical_key(t) for t in _STOP_CONCEPT_TEXTS.split()) if k
)


def is_stop_concept(key: str) -> bool:
    """Generic, numeric or too short to name anything a question could be about."""
    if not key or key in STOP_CONCEPTS:
        return True
    compact = key.replace(" ", "")
    return len(compact) < 2 or compact.isdigit()
