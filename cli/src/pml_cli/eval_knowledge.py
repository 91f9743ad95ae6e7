"""`pml eval knowledge`: document retrieval of `KnowledgeService.Ask` on a knowledge set.

The set is in the exchange format of the evaluation data (`corpus.jsonl`: one document a line,
ingested as plain text whose root heading is its title; `questions.jsonl`: the question and
its `supporting` document ids). The corpus goes through the real pipeline (`IngestService` and
its pass workers) into a tenant named after the corpus's content (`eval-knowledge-<hash>`), so
that another method evaluated on the same system reuses it (unchanged documents are not
ingested again); then every question is asked through `Ask` with the method:

- `vector`: plain vector search over the chunks, without the graph;
- `graph-first`: the whole runtime (seeds, paths, evidence plan, filtered vector search);
- `graph-ppr`: the same with the evidence plan ranked by a Personalized PageRank from the
  question's seed concepts over the concept ↔ section graph (`pml_search.propagation`).

Questions are asked once every pass is done for every document and search has acknowledged
every `ChunksExtracted` (it indexes the chunks on its own, outside the pass statuses).

The ranked documents of a question are the documents of the returned evidence chunks, in
order, without repeats. Metrics, exactly as the data README defines them: recall@k = mean over
questions of |supporting ∩ top-k documents| / |supporting| (k = 2, 5); all_evidence@8 = share
of questions whose every supporting document is in the top 8. Several methods can be given
(`vector,graph-first,graph-ppr`): they are asked in turn on the same ingestion. With a
`per_query` file, each answer is also written there as a JSON line (the question, its
supporting documents, the ranked documents and the seeds with how each was linked), to read
why a question missed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import Progress

from pml.v1 import knowledge_pb2
from pml_cli import ingest_client
from pml_cli.ask_client import ASK_METHODS, ask, knowledge_stub, mode_name, ranked_documents
from pml_cli.eval_tools import EvalError
from pml_cli.ingest_files import IngestFileError, SourceDocument, load_documents
from pml_cli.local_stack import running_system
from pml_cli.metrics import KnowledgeMetrics
from pml_common.events import Streams
from pml_common.settings import Settings, redis_credentials

KNOWLEDGE_SERVICES = ("search", "ingest")
#: Search's consumer group of `ChunksExtracted` (it indexes the chunks; see pml_search).
CHUNK_GROUP = "search-chunks"
#: Evidence chunks asked per question: enough for 8 distinct documents on these sets.
ASK_K = 20
IN_FLIGHT = 4
INGEST_TIMEOUT_S = 6 * 3600.0


class KnowledgeQuestion(BaseModel):
    id: str
    question: str
    supporting: list[str]
    answer: str | None = None


def methods_of(method: str) -> list[str]:
    methods = [m.strip() for m in method.split(",") if m.strip()]
    unknown = [m for m in methods if m not in ASK_METHODS]
    if not methods or unknown:
        raise EvalError(
            f"unknown method {method!r}; choose among {', '.join(ASK_METHODS)} "
            "(several separated by commas)"
        )
    return list(dict.fromkeys(methods))


def load_questions(path: Path, limit: int | None = None) -> list[KnowledgeQuestion]:
    if not path.is_file():
        raise EvalError(f"{path}: no such file")
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            questions.append(KnowledgeQuestion.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise EvalError(f"{path}:{number}: not a knowledge question ({exc})") from exc
    if not questions:
        raise EvalError(f"{path}: no questions")
    return questions[:limit] if limit else questions


def load_corpus(data: Path) -> list[SourceDocument]:
    path = data / "corpus.jsonl"
    if not path.is_file():
        raise EvalError(f"{path}: no such file")
    try:
        return load_documents(path)
    except IngestFileError as exc:
        raise EvalError(str(exc)) from exc


def corpus_tenant(docs: Sequence[SourceDocument]) -> str:
    """A tenant named after the corpus's content: the same corpus is ingested once."""
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps([doc.id, doc.title, doc.text, doc.format]).encode())
    return f"eval-knowledge-{digest.hexdigest()[:16]}"


def ingest_corpus(
    settings: Settings, tenant: str, docs: Sequence[SourceDocument], console: Console
) -> dict[str, Any]:
    """Submit the corpus and follow it through every pass; fails if a document failed."""
    started = time.perf_counter()
    console.print(f"ingesting {len(docs)} documents into {tenant} (unchanged ones are skipped)")
    ids, unchanged = ingest_client.submit(settings, tenant, docs, console)
    counts = ingest_client.wait(settings, tenant, ids, console, INGEST_TIMEOUT_S)
    if counts.get("failed") or counts.get("in progress"):
        raise EvalError(
            f"ingestion of the corpus did not complete: {counts} "
            f"(see `pml ingest status --tenant {tenant}`)"
        )
    wait_chunks_indexed(settings, console)
    return {
        "documents": len(ids),
        "unchanged": unchanged,
        "ingest_seconds": round(time.perf_counter() - started, 1),
    }


def _chunk_backlog(client: redis.Redis, stream: str = Streams.CHUNKS_EXTRACTED) -> int | None:
    """Entries of `ChunksExtracted` search has not yet read or acknowledged; None when its
    group (or the stream) does not exist yet."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return None
    for group in groups:
        name = group["name"].decode() if isinstance(group["name"], bytes) else group["name"]
        if name == CHUNK_GROUP:
            lag = group.get("lag")
            return int(group["pending"]) + (int(lag) if lag is not None else 1)
    return None


def wait_chunks_indexed(
    settings: Settings,
    console: Console,
    stall_s: float = 600.0,
    stream: str = Streams.CHUNKS_EXTRACTED,
) -> None:
    """Pass statuses say when the graph is done; search indexes the chunks from
    `ChunksExtracted` on its own: wait until its group has read and acknowledged every entry,
    for as long as the backlog keeps shrinking (an error once it stayed `stall_s` without)."""
    client = redis.Redis.from_url(settings.redis_url, **redis_credentials(settings))
    deadline, smallest = time.monotonic() + stall_s, None
    try:
        with console.status("search: indexing the chunks…") as status:
            while (backlog := _chunk_backlog(client, stream)) != 0:
                if backlog is not None and (smallest is None or backlog < smallest):
                    deadline, smallest = time.monotonic() + stall_s, backlog
                if time.monotonic() > deadline:
                    raise EvalError(
                        f"search has not indexed the chunks (backlog {backlog}, "
                        f"unchanged for {stall_s:.0f} s)"
                    )
                left = "starting" if backlog is None else f"{backlog} batch(es) of chunks left"
                status.update(f"search: indexing the chunks ({left})…")
                time.sleep(0.5)
    finally:
        client.close()


def ask_all(
    settings: Settings,
    tenant: str,
    method: str,
    questions: Sequence[KnowledgeQuestion],
    console: Console,
    per_query: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every question through Ask with `method`; the metrics and the answer modes (and each
    answer appended to `per_query` when given)."""
    stub = knowledge_stub(settings)
    metrics = KnowledgeMetrics()
    modes: Counter[str] = Counter()

    def one(question: KnowledgeQuestion) -> tuple[list[str], str]:
        reply = ask(stub, tenant, question.question, ASK_K, method)
        if per_query is not None:
            per_query.append(query_record(method, question, reply))
        return ranked_documents(reply), mode_name(reply)

    with (
        Progress(console=console, transient=True) as progress,
        ThreadPoolExecutor(IN_FLIGHT) as pool,
    ):
        task = progress.add_task(f"{method}: questions", total=len(questions))
        for question, (ranked, mode) in zip(questions, pool.map(one, questions), strict=True):
            metrics.add(ranked, question.supporting)
            modes[mode] += 1
            progress.advance(task)
    return {"method": method, **metrics.result(), "modes": dict(sorted(modes.items()))}


def query_record(
    method: str, question: KnowledgeQuestion, reply: knowledge_pb2.AskResponse
) -> dict[str, Any]:
    """One answer for `--per-query`: where each supporting document ranks (None: not
    returned) and the seeds as Ask explained them."""
    ranked = ranked_documents(reply)
    return {
        "method": method,
        "id": question.id,
        "question": question.question,
        "supporting": question.supporting,
        "ranks": {d: ranked.index(d) + 1 if d in ranked else None for d in question.supporting},
        "ranked": ranked[:10],
        "mode": mode_name(reply),
        "seeds": [MessageToDict(s, preserving_proto_field_name=True) for s in reply.seeds],
    }


def write_per_query(path: Path, records: Sequence[dict[str, Any]]) -> None:
    order = sorted(records, key=lambda r: (r["method"], r["id"]))
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in order))


def evaluate_knowledge(
    settings: Settings,
    data: Path,
    method: str,
    max_questions: int | None,
    console: Console,
    per_query: Path | None = None,
) -> dict[str, Any]:
    methods = methods_of(method)
    questions = load_questions(data / "questions.jsonl", max_questions)
    docs = load_corpus(data)
    tenant = corpus_tenant(docs)
    started = time.perf_counter()
    with running_system(settings, console, KNOWLEDGE_SERVICES) as live:
        ingestion = ingest_corpus(live, tenant, docs, console)
        records: list[dict[str, Any]] | None = [] if per_query is not None else None
        results = [ask_all(live, tenant, m, questions, console, records) for m in methods]
    if per_query is not None and records is not None:
        write_per_query(per_query, records)
    common = {"tenant": tenant, **ingestion, "seconds": round(time.perf_counter() - started, 1)}
    if len(results) == 1:
        return {**results[0], **common}
    return {"methods": results, **common}
