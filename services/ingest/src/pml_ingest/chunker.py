"""The hybrid anchor chunker: sections from the document's structure, chunks inside sections.

Structure first (the "anchors"): Markdown ATX headers (`#` to `######`, ignored inside fenced
code) and numbered headings ("2 Scope", "1.2 Security Architecture": a short line starting
with a numbering, without end punctuation, standing alone between blank lines) open sections;
the document's title is the root heading unless the text starts with its own H1. In plain
text, every paragraph of a heading's body is a section of its own (paragraph sections are
numbered "¶1", "¶2"... below the heading when there are several).

Each section gets its `context_id` from the one helper (`pml_common.context_id`); its chunks are
its paragraphs packed up to `max_chars` (a longer paragraph is cut at sentence ends, a longer
sentence at `max_chars`), so no chunk ever spans two sections and every chunk carries its
section's `context_id` and path. Offsets are character offsets into the submitted text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from pml_common.context_id import make_context_id

PATH_SEPARATOR = " / "
DEFAULT_MAX_CHARS = 1200

_ATX = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_NUMBERED = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){0,4})\.?[ \t]+(\S.{0,100})$")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_BLANK_LINES = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class Heading:
    level: int
    title: str


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    context_id: str
    section_path: str
    text: str
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Section:
    context_id: str
    section_path: str
    heading: str
    level: int
    ordinal: int
    text: str
    char_start: int
    char_end: int
    trail: tuple[str, ...]
    chunks: tuple[Chunk, ...] = field(default=())


@dataclass
class _Body:
    """A heading's body: its trail and the spans of text below it."""

    trail: list[Heading]
    spans: list[tuple[int, int]] = field(default_factory=list)


def chunk_document(
    document_id: str,
    title: str,
    text: str,
    fmt: str = "markdown",
    max_chars: int = DEFAULT_MAX_CHARS,
) -> list[Section]:
    """Sections (with their chunks) of a document, in reading order; empty sections skipped."""
    bodies = _bodies(title, text, markdown=fmt == "markdown")
    sections: list[Section] = []
    seen_paths: dict[str, int] = {}
    for body in bodies:
        for trail, start, end in _section_spans(body, text, paragraphs=fmt != "markdown"):
            path = _unique(PATH_SEPARATOR.join(trail) or title or document_id, seen_paths)
            context_id = make_context_id(document_id, path)
            chunks = tuple(
                Chunk(f"{context_id}:{i}", context_id, path, text[s:e], s, e)
                for i, (s, e) in enumerate(_pack(text, start, end, max_chars))
            )
            sections.append(
                Section(
                    context_id=context_id,
                    section_path=path,
                    heading=trail[-1] if trail else "",
                    level=len(trail),
                    ordinal=len(sections),
                    text=text[start:end],
                    char_start=start,
                    char_end=end,
                    trail=tuple(trail),
                    chunks=chunks,
                )
            )
    return sections


def strip_numbering(heading: str) -> str:
    """A heading without its leading numbering ("1.2 Security" → "Security")."""
    match = _NUMBERED.match(heading)
    return match.group(2).strip() if match else heading.strip()


# --- structure ------------------------------------------------------------------------------


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, line) of every line, offsets into `text`, newline excluded."""
    start = 0
    for line in text.split("\n"):
        yield start, start + len(line), line
        start += len(line) + 1


def _heading_of(lines: list[tuple[int, int, str]], i: int, markdown: bool) -> Heading | None:
    line = lines[i][2]
    if markdown:
        atx = _ATX.match(line)
        if atx:
            return Heading(len(atx.group(1)), atx.group(2).strip())
    numbered = _NUMBERED.match(line.strip())
    if numbered is None or line[:1].isspace():
        return None
    title = numbered.group(2).strip()
    alone = (i == 0 or not lines[i - 1][2].strip()) and (
        i + 1 == len(lines) or not lines[i + 1][2].strip()
    )
    if not alone or not title[:1].isupper() or title[-1] in ".:;,!?" or len(title.split()) > 12:
        return None
    # "1" → just below the document's root; "1.2" → one more level down.
    return Heading(numbered.group(1).count(".") + 2, line.strip())


def _bodies(title: str, text: str, *, markdown: bool) -> list[_Body]:
    lines = list(_lines(text))
    root = [Heading(1, title.strip())] if title.strip() else []
    first = next((ln for ln in lines if ln[2].strip()), None)
    if markdown and first is not None:
        atx = _ATX.match(first[2])
        if atx and len(atx.group(1)) == 1:
            root = []  # the text's own H1 is the root
    bodies = [_Body(list(root))]
    in_fence = False
    for i, (start, end, line) in enumerate(lines):
        if markdown and _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _heading_of(lines, i, markdown)
        if heading is None:
            bodies[-1].spans.append((start, end))
            continue
        trail = [h for h in bodies[-1].trail if h.level < heading.level]
        bodies.append(_Body([*trail, heading]))
    return bodies


def _section_spans(
    body: _Body, text: str, *, paragraphs: bool
) -> Iterator[tuple[list[str], int, int]]:
    """(trail titles, start, end) of the sections of one heading's body."""
    if not body.spans:
        return
    start, end = _strip(text, body.spans[0][0], body.spans[-1][1])
    if start >= end:
        return
    titles = [h.title for h in body.trail]
    if not paragraphs:
        yield titles, start, end
        return
    paras = list(_paragraphs(text, start, end))
    if len(paras) == 1:
        yield titles, *paras[0]
        return
    for n, (s, e) in enumerate(paras, start=1):
        yield [*titles, f"¶{n}"], s, e


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _paragraphs(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    pos = start
    for gap in _BLANK_LINES.finditer(text, start, end):
        s, e = _strip(text, pos, gap.start())
        if s < e:
            yield s, e
        pos = gap.end()
    s, e = _strip(text, pos, end)
    if s < e:
        yield s, e


def _unique(path: str, seen: dict[str, int]) -> str:
    """Paths are keys: a second "Notes" under the same trail becomes "Notes (2)"."""
    n = seen.get(path, 0) + 1
    seen[path] = n
    return path if n == 1 else f"{path} ({n})"


# --- chunks ---------------------------------------------------------------------------------


def _pieces(text: str, start: int, end: int, max_chars: int) -> Iterator[tuple[int, int]]:
    """Paragraphs, cut at sentence ends (then hard) when longer than `max_chars`."""
    for p_start, p_end in _paragraphs(text, start, end):
        if p_end - p_start <= max_chars:
            yield p_start, p_end
            continue
        pos = p_start
        for gap in _SENTENCE_END.finditer(text, p_start, p_end):
            yield from _hard_cut(pos, gap.start(), max_chars)
            pos = gap.end()
        yield from _hard_cut(pos, p_end, max_chars)


def _hard_cut(start: int, end: int, max_chars: int) -> Iterator[tuple[int, int]]:
    for s in range(start, end, max_chars):
        yield s, min(end, s + max_chars)


def _pack(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Consecutive pieces merged while the merged span stays within `max_chars`."""
    packed: list[tuple[int, int]] = []
    for s, e in _pieces(text, start, end, max_chars):
        if packed and e - packed[-1][0] <= max_chars:
            packed[-1] = (packed[-1][0], e)
        else:
            packed.append((s, e))
    return packed
