"""`pml ingest` and `pml eval knowledge` show each pass advancing, not only finished documents:
on a large corpus the last pass finishes documents long after the first passes moved on."""

from pml.v1 import ingest_pb2
from pml_cli.ingest_client import passes_finished, state_of


def _doc(doc_id: str, **states: str) -> ingest_pb2.DocumentStatus:
    passes = [ingest_pb2.PassStatus(**{"pass": name, "state": s}) for name, s in states.items()]
    return ingest_pb2.DocumentStatus(document_id=doc_id, passes=passes)


def test_each_pass_counts_the_documents_it_finished() -> None:
    found = [
        _doc("a", chunking="done", pass1="done", pass2a="running"),
        _doc("b", chunking="done", pass1="failed"),
        _doc("c", chunking="running"),
    ]
    assert passes_finished(found) == {
        "chunking": 2,
        "pass1": 2,
        "pass2a": 0,
        "pass2b": 0,
        "pass3": 0,
    }
    assert [state_of(d) for d in found] == ["in progress", "failed", "in progress"]
