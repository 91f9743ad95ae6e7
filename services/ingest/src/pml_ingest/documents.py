"""What a submitted document is: its content hash, and the checks every path applies."""

from __future__ import annotations

import hashlib
import json

from pml_common import input_rules

FORMATS = ("markdown", "text")
MAX_ID_CHARS = input_rules.MAX_DOCUMENT_ID_CHARS


class PoisonDocument(ValueError):
    """A document no retry can ingest; the message says why (it goes to the dead letter)."""


def content_hash(title: str, text: str, fmt: str) -> str:
    """Hash of what was submitted: the same title, text and format are the same content."""
    blob = json.dumps([title, text, fmt], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def default_document_id(title: str, text: str) -> str:
    """The id of a document submitted without one: stable for the same title and text."""
    digest = hashlib.sha256(json.dumps([title, text], ensure_ascii=False).encode()).hexdigest()
    return f"doc-{digest[:16]}"


def id_problem(document_id: str) -> str | None:
    """Why a document id is unusable, or None (the rule events follow too)."""
    return input_rules.document_id_problem(document_id)


def text_problem(text: str, max_chars: int) -> str | None:
    """Why a document text cannot be ingested, or None."""
    if not text.strip():
        return "text is empty"
    if len(text) > max_chars:
        return f"text is {len(text)} characters long; the maximum is {max_chars}"
    if "\x00" in text:
        return "text contains NUL characters (binary content?)"
    return None
