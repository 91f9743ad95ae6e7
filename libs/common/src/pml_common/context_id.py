"""The one helper that makes a section's `context_id` (seed 001 §8.3).

A `context_id` names a `SectionContext` node in Neo4j and is copied into the payload of every
chunk of that section in the vector store: it is the bridge the graph-first runtime filters the
vector search by. Both sides must compute it identically, so nothing else in the code base may
build one (invariant: "Ne JAMAIS construire un context_id autrement qu'avec ce helper").

Format: ``sec:{document_id}:{section_hash}`` where ``section_hash`` is the first 12 hex digits of
SHA-256 over ``"{document_id}:{normalised section path}"``, the path lower-cased, stripped and
with spaces turned into underscores, exactly as the seed specifies.
"""

from __future__ import annotations

import hashlib

#: Prefix of every context id.
PREFIX = "sec:"
#: Hex digits of the section hash.
HASH_CHARS = 12


def normalise_section_path(section_path: str) -> str:
    """The path as hashed: lower-cased, stripped, spaces turned into underscores."""
    return section_path.lower().strip().replace(" ", "_")


def make_context_id(document_id: str, section_path: str) -> str:
    """`sec:{document_id}:{hash12}` for a section of a document (seed 001 §8.3)."""
    hash_input = f"{document_id}:{normalise_section_path(section_path)}"
    section_hash = hashlib.sha256(hash_input.encode()).hexdigest()[:HASH_CHARS]
    return f"{PREFIX}{document_id}:{section_hash}"


def document_of(context_id: str) -> str:
    """The document id a context id belongs to (the inverse of the format above)."""
    if not context_id.startswith(PREFIX) or context_id.count(":") < 2:
        raise ValueError(f"not a context id: {context_id!r}")
    return context_id[len(PREFIX) : context_id.rindex(":")]
