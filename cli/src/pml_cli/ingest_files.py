"""Documents to ingest from files: Markdown, plain text, folders of them, and `corpus.jsonl`.

- `*.md` / `*.markdown`: one Markdown document; id = path relative to the folder given
  (or the file name), title = first H1 or the file name.
- `*.txt`: one plain-text document, likewise.
- a folder: every such file below it, in path order.
- `*.jsonl` (the knowledge corpus of the evaluation exchange format): one document a line,
  `{"id": str, "title": str, "text": str}`, ingested as plain text whose root heading (H1) is
  the title.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (".txt",)
_H1 = re.compile(r"^#[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


class IngestFileError(ValueError):
    """A file that cannot be read as documents; the message says which and why."""


@dataclass(frozen=True)
class SourceDocument:
    id: str
    title: str
    text: str
    format: str


def load_documents(path: Path) -> list[SourceDocument]:
    if not path.exists():
        raise IngestFileError(f"{path}: no such file or folder")
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and p.suffix.lower() in MARKDOWN_SUFFIXES + TEXT_SUFFIXES
        )
        if not files:
            raise IngestFileError(f"{path}: no .md, .markdown or .txt file in this folder")
        return [_file_document(f, f.relative_to(path).as_posix()) for f in files]
    if path.suffix.lower() == ".jsonl":
        return list(_corpus(path))
    if path.suffix.lower() in MARKDOWN_SUFFIXES + TEXT_SUFFIXES:
        return [_file_document(path, path.name)]
    raise IngestFileError(
        f"{path}: unsupported file type {path.suffix or '(none)'}; "
        "give .md, .markdown, .txt, a corpus .jsonl, or a folder"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise IngestFileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise IngestFileError(f"{path}: cannot read ({exc.strerror})") from exc


def _file_document(path: Path, doc_id: str) -> SourceDocument:
    text = _read(path)
    markdown = path.suffix.lower() in MARKDOWN_SUFFIXES
    h1 = _H1.search(text) if markdown else None
    title = h1.group(1).strip() if h1 else path.stem
    return SourceDocument(doc_id, title, text, "markdown" if markdown else "text")


def _corpus(path: Path) -> Iterator[SourceDocument]:
    for number, line in enumerate(_read(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise IngestFileError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise IngestFileError(f"{path}:{number}: expected an object with a string `text`")
        doc_id, title = row.get("id"), row.get("title", "")
        if not isinstance(doc_id, str) or not doc_id.strip() or not isinstance(title, str):
            raise IngestFileError(f"{path}:{number}: `id` and `title` must be strings")
        yield SourceDocument(doc_id, title, row["text"], "text")
