import json
from pathlib import Path

import pytest

from pml_cli.ingest_files import IngestFileError, load_documents


def test_folder_of_markdown_and_text(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text("# Sales Guide\n\nBody.", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("Plain notes.", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    docs = load_documents(tmp_path)
    assert [(d.id, d.title, d.format) for d in docs] == [
        ("guide.md", "Sales Guide", "markdown"),
        ("sub/notes.txt", "notes", "text"),
    ]


def test_corpus_jsonl_of_the_exchange_format(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "d1", "title": "Journal", "text": "A journal."},
        {"id": "d2", "title": "", "text": "B."},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    docs = load_documents(corpus)
    assert [(d.id, d.title, d.text, d.format) for d in docs] == [
        ("d1", "Journal", "A journal.", "text"),
        ("d2", "", "B.", "text"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"id": "a"}', "string `text`"),
        ('{"id": 3, "text": "x"}', "`id`"),
    ],
)
def test_bad_corpus_lines_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "ok", "title": "t", "text": "fine"}\n' + content, encoding="utf-8")
    with pytest.raises(IngestFileError, match=f"corpus.jsonl:2: .*{message}"):
        load_documents(corpus)


def test_unusable_paths(tmp_path: Path) -> None:
    with pytest.raises(IngestFileError, match="no such file"):
        load_documents(tmp_path / "missing")
    with pytest.raises(IngestFileError, match=r"no \.md"):
        load_documents(tmp_path)
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(b"%PDF")
    with pytest.raises(IngestFileError, match=r"unsupported file type \.pdf"):
        load_documents(pdf)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(IngestFileError, match="not UTF-8"):
        load_documents(latin)
