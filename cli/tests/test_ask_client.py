"""`pml ask`'s rendering of an answer for people."""

from __future__ import annotations

import io

from rich.console import Console

from pml.v1 import knowledge_pb2
from pml_cli.ask_client import print_answer


def chunk(document: str, plan_weight: float, named_by: str = "") -> knowledge_pb2.EvidenceChunk:
    return knowledge_pb2.EvidenceChunk(
        document_id=document,
        context_id=f"sec:{document}",
        text=f"The text of {document}.",
        score=1.0 + plan_weight,
        plan_weight=plan_weight,
        named_by=named_by,
    )


def test_a_followed_link_shows_which_answer_names_the_document() -> None:
    reply = knowledge_pb2.AskResponse(
        mode=knowledge_pb2.ANSWER_MODE_ANCHORED,
        chunks=[chunk("kate", 1.0), chunk("neighbours", 0.4, named_by="sec:kate")],
        method="graph-ppr",
    )
    out = io.StringIO()
    print_answer(Console(file=out, width=200), "Who created the series?", reply)
    rows = {
        name: [ln for ln in out.getvalue().splitlines() if name in ln]
        for name in ("kate", "neighbours")
    }
    assert rows["neighbours"] and "0.40 · named by #1" in rows["neighbours"][0]
    assert rows["kate"] and not any("named by" in ln for ln in rows["kate"])
    assert "(method: graph-ppr)" in out.getvalue()  # which method answered
