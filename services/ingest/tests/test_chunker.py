from pml_common.context_id import make_context_id
from pml_ingest.chunker import chunk_document, strip_numbering

MARKDOWN = """# Guide

Intro paragraph.

## 1.2 Security Architecture

Body one.

Body two is here.

```
# not a heading
```

## Notes
first notes
## Notes
second notes
"""


def test_markdown_headers_make_sections_with_paths_and_context_ids() -> None:
    sections = chunk_document("doc1", "Ignored title", MARKDOWN, "markdown")
    paths = [s.section_path for s in sections]
    assert paths == [
        "Guide",
        "Guide / 1.2 Security Architecture",
        "Guide / Notes",
        "Guide / Notes (2)",
    ]
    for s in sections:
        assert s.context_id == make_context_id("doc1", s.section_path)
        assert all(c.context_id == s.context_id for c in s.chunks)
        assert all(c.section_path == s.section_path for c in s.chunks)
    assert "# not a heading" in sections[1].text  # fenced code is no heading


def test_offsets_point_into_the_submitted_text() -> None:
    for s in chunk_document("doc1", "Guide", MARKDOWN, "markdown", max_chars=20):
        assert MARKDOWN[s.char_start : s.char_end] == s.text
        for c in s.chunks:
            assert MARKDOWN[c.char_start : c.char_end] == c.text
            assert len(c.text) <= 20


def test_title_is_the_root_when_the_text_has_no_h1() -> None:
    sections = chunk_document("d", "My Title", "Some text.\n\n## Part A\n\nA text.", "markdown")
    assert [s.section_path for s in sections] == ["My Title", "My Title / Part A"]


def test_plain_text_paragraphs_and_numbered_headings() -> None:
    text = "First para.\n\n1 Scope\n\nScope one.\n\nScope two.\n\n1. do this\n2. do that\n"
    sections = chunk_document("d2", "Plain", text, "text")
    assert [s.section_path for s in sections] == [
        "Plain",
        "Plain / 1 Scope / ¶1",
        "Plain / 1 Scope / ¶2",
        "Plain / 1 Scope / ¶3",
    ]
    assert sections[3].text == "1. do this\n2. do that"  # a list is no heading


def test_chunks_never_cross_sections_and_long_paragraphs_split_at_sentences() -> None:
    body = " ".join(f"Sentence number {i} is here." for i in range(40))
    text = f"# T\n\n{body}\n\n## Next\n\nShort."
    sections = chunk_document("d", "T", text, "markdown", max_chars=200)
    first, second = sections
    assert len(first.chunks) > 1
    assert all(c.text.endswith(".") for c in first.chunks)
    assert [c.text for c in second.chunks] == ["Short."]
    assert len({c.chunk_id for s in sections for c in s.chunks}) == sum(
        len(s.chunks) for s in sections
    )


def test_empty_document_has_no_section() -> None:
    assert chunk_document("d", "", "   \n\n ", "text") == []


def test_strip_numbering() -> None:
    assert strip_numbering("1.2 Security Architecture") == "Security Architecture"
    assert strip_numbering("Overview") == "Overview"
