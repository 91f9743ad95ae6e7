"""`pml ask`: one question to `KnowledgeService.Ask`, printed for people (rich) or as JSON."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pml.v1 import common_pb2, knowledge_pb2, knowledge_pb2_grpc
from pml_cli.client import channel
from pml_common.settings import Settings

#: `method` values of Ask; the first is the service's default.
ASK_METHODS = ("graph-ppr", "graph-first", "vector")
MODE_NAMES = {
    knowledge_pb2.ANSWER_MODE_REASONED: "REASONED",
    knowledge_pb2.ANSWER_MODE_ANCHORED: "ANCHORED",
    knowledge_pb2.ANSWER_MODE_TEXT_ONLY: "TEXT_ONLY",
}
_MODE_STYLE = {"REASONED": "bold green", "ANCHORED": "bold yellow", "TEXT_ONLY": "bold red"}
_MODE_NOTE = {
    "REASONED": "paths of evidenced relations in the knowledge graph, with their quotes",
    "ANCHORED": "no evidenced path; sections the question's concepts anchor to",
    "TEXT_ONLY": "no support in the knowledge graph: plain vector search",
}
SNIPPET_CHARS = 240


def knowledge_stub(settings: Settings) -> knowledge_pb2_grpc.KnowledgeServiceStub:
    return knowledge_pb2_grpc.KnowledgeServiceStub(channel(settings.search_addr, settings))


def ask(
    stub: knowledge_pb2_grpc.KnowledgeServiceStub,
    tenant: str,
    question: str,
    k: int,
    method: str = "",
    timeout: float = 60.0,
) -> knowledge_pb2.AskResponse:
    request = knowledge_pb2.AskRequest(tenant_id=tenant, question=question, k=k, method=method)
    reply: knowledge_pb2.AskResponse = stub.Ask(request, timeout=timeout)
    return reply


def mode_name(reply: knowledge_pb2.AskResponse) -> str:
    return MODE_NAMES.get(reply.mode, "UNSPECIFIED")


def ranked_documents(reply: knowledge_pb2.AskResponse) -> list[str]:
    """The documents of the evidence chunks, in order, each once (the evaluation's ranking)."""
    return list(dict.fromkeys(c.document_id for c in reply.chunks))


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


def _edge_line(edge: knowledge_pb2.PathEdge) -> Text:
    line = Text("  ")
    line.append(edge.source, style="cyan")
    line.append(f" ─{edge.relation}→ ", style="magenta")
    line.append(edge.target, style="cyan")
    line.append(f"  confidence {edge.confidence:.2f}", style="dim")
    return line


def _paths(reply: knowledge_pb2.AskResponse) -> list[Text]:
    lines: list[Text] = []
    for number, path in enumerate(reply.paths, start=1):
        head = Text(f"{number}. ", style="bold")
        head.append(" → ".join(path.concepts), style="bold cyan")
        head.append(
            f"   score {path.score:.3f} · evidence {path.evidence_coverage:.0%}", style="dim"
        )
        lines.append(head)
        for edge in path.edges:
            lines.append(_edge_line(edge))
            for evidence in edge.evidence:
                quote = Text("      “", style="green")
                quote.append(_snippet(evidence.quote), style="green")
                quote.append("”  ", style="green")
                quote.append(evidence.context_id, style="dim")
                lines.append(quote)
    return lines


def _chunks(reply: knowledge_pb2.AskResponse) -> Table:
    table = Table("#", "document", "section", "score", "plan", "text", expand=True)
    first_rank: dict[str, int] = {}
    for rank, chunk in enumerate(reply.chunks, start=1):
        first_rank.setdefault(chunk.context_id, rank)
        plan = f"{chunk.plan_weight:.2f}" if chunk.plan_weight else "-"
        if chunk.named_by:
            # the best answer whose text names this chunk's document (a followed link)
            plan += f" · named by #{first_rank.get(chunk.named_by, '?')}"
        table.add_row(
            str(rank),
            escape(chunk.document_id),
            escape(chunk.section_path),
            f"{chunk.score:.3f}",
            plan,
            escape(_snippet(chunk.text)),
        )
    return table


def _timings(timings: Sequence[common_pb2.StageTiming]) -> str:
    parts = [f"{t.stage} {t.ms:.1f} ms" for t in timings]
    total = sum(t.ms for t in timings)
    return " · ".join(parts) + f"  (total {total:.1f} ms)"


def _seed(seed: knowledge_pb2.SeedConcept) -> str:
    """A seed and what made it one: how the question named it (exact key, alias, fuzzy or
    dense name with its score), its type, its weight, the sections mentioning it, a topic it
    names."""
    why = [_link(seed)] if seed.link else []
    why += [seed.entity_type] if seed.entity_type else []
    why += [f"{seed.weight:.2f}", f"{seed.sections} section{'s' if seed.sections != 1 else ''}"]
    why += ["topic"] if seed.topic else []
    why += ["inside a longer seed"] if seed.subsumed else []
    why += ["inside a named entity"] if seed.inside_entity else []
    why += ["common word beside a named entity"] if seed.common_word else []
    return f"{seed.key} ({', '.join(why)})"


def _link(seed: knowledge_pb2.SeedConcept) -> str:
    """How the question named a seed: `fuzzy 0.83 "Tikhaya Sosna"`, `exact "pop"`."""
    score = f" {seed.link_score:.2f}" if seed.link_score < 1.0 else ""
    return f'{seed.link}{score} "{seed.span}"' if seed.span else f"{seed.link}{score}"


def print_answer(console: Console, question: str, reply: knowledge_pb2.AskResponse) -> None:
    mode = mode_name(reply)
    header = Text()
    header.append(mode, style=_MODE_STYLE.get(mode, "bold"))
    header.append(f" — {_MODE_NOTE.get(mode, '')}")
    details = [f"method: {reply.method}"] if reply.method else []
    if reply.path_finder:
        details.append(f"paths: {reply.path_finder}")
    if details:
        header.append(f"   ({', '.join(details)})", style="dim")
    seeds = ", ".join(_seed(s) for s in reply.seeds) or "none"
    parts: list[RenderableType] = [header, Text(f"seed concepts: {seeds}", style="dim")]
    if reply.paths:
        parts += [Text(""), Text("Paths", style="bold underline"), *_paths(reply)]
    console.print(Panel(Group(*parts), title=escape(question), title_align="left"))
    if reply.chunks:
        console.print(_chunks(reply))
    else:
        console.print("[dim]no evidence chunk[/]")
    if reply.topped_up_chunks and mode != "TEXT_ONLY":
        console.print(
            f"[dim]{reply.topped_up_chunks} chunk(s) from outside the evidence plan complete "
            "the answer: the plan's sections held fewer than asked[/]"
        )
    console.print(f"[dim]{_timings(reply.timings)}[/]")
