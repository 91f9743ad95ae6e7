"""`pml bench knowledge`: ingestion throughput per pass and end to end, and Ask latency.

Runs on a private system started for the bench (Redis, Neo4j, search, the ingest service and
its pass workers as separate processes, on free ports), with a knowledge set in the exchange
format (default: the MuSiQue sample, 1,890 documents):

1. per pass (`chunking_docs_per_s`, `pass1_docs_per_s`, ...): the corpus is submitted to a
   first tenant with no worker running; then the workers are started one at a time in pipeline
   order, each once the previous one has finished every document, so each pass works alone on
   the whole corpus: documents / (time of its last document done − time it became ready);
2. end to end (`ingest_docs_per_s`): the corpus is submitted to a second tenant while every
   worker runs: documents / (last document done by Pass 3 − start of the submission);
3. the first question of each tenant with the default method, `graph-ppr`: on the first
   tenant, quiet since its ingestion (`ask_first_quiet_ms`: what search read ahead of it is
   read; also the search process's first question), then on the second right after its
   ingestion (`ask_first_fresh_ms`); `..._stage_ms`: the service's timings of their stages;
4. Ask (`ask_p50_ms`, `ask_p99_ms`: the default method, `graph-ppr`; `ask_graph_first_p50_ms`,
   `ask_graph_first_p99_ms`; `ask_vector_p50_ms` for the plain vector baseline): every question
   asked `rounds` times one after the other on the second tenant, timed at the client (the
   whole gRPC call), after a warm-up round of each graph method that is not counted;
   `ask_stage_p50_ms` and `ask_graph_first_stage_p50_ms` are the medians of the service's own
   per-stage timings.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from pml.v1 import knowledge_pb2_grpc
from pml_cli import ingest_client
from pml_cli.ask_client import ask, knowledge_stub
from pml_cli.eval_knowledge import (
    KnowledgeQuestion,
    load_corpus,
    load_questions,
    wait_chunks_indexed,
)
from pml_cli.ingest_files import SourceDocument
from pml_cli.local_stack import (
    INGEST_PASSES,
    LocalStack,
    interrupt_on_signals,
    start_ingest_worker,
    start_service,
)
from pml_cli.phases import counted_phase, phase, step
from pml_common.local_runtime import free_port
from pml_common.settings import Settings

ASK_K = 20
#: The tenant each pass is measured on alone, and the tenant ingested end to end and asked.
STAGED_TENANT = "bench-staged"
TENANT = "bench"
POLL_S = 1.0
PASS_TIMEOUT_S = 3 * 3600.0


def bench_knowledge(
    data: Path, max_documents: int | None, rounds: int, console: Console
) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("--rounds must be at least 1")
    with phase(console, f"loading {data.name}"):
        docs = load_corpus(data)[:max_documents]
        questions = load_questions(data / "questions.jsonl")
    interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="pml-bench-knowledge-") as tmp:
        stack = LocalStack.on_free_ports(Path(tmp))
        try:
            with phase(console, "starting Redis, Neo4j, search and ingest"):
                stack.start_stores()
                for name in ("search", "ingest"):
                    stack.processes.append(start_service(name, stack.settings, stack.state_dir))
            per_pass = _staged_passes(stack, STAGED_TENANT, docs, console)
            end_to_end = _end_to_end(stack.settings, TENANT, docs, console)
            step(console, "waiting for search to index the chunks")
            wait_chunks_indexed(stack.settings, console)
            first = _first_asks(stack.settings, questions[0])
            latency = _ask_latency(stack.settings, TENANT, questions, rounds, console)
        finally:
            with phase(console, "stopping the private system"):
                stack.stop()
    return {
        "data": data.name,
        "documents": len(docs),
        **end_to_end,
        **per_pass,
        **first,
        **latency,
    }


def _pass_progress(
    settings: Settings, tenant: str, ids: Sequence[str], pass_name: str
) -> dict[str, float]:
    """When each of `ids` that finished `pass_name` did (epoch seconds, tz-aware timestamps of
    the status store); raises when one failed."""
    times = {}
    for status in ingest_client.statuses(settings, tenant, ids):
        current = next((p for p in status.passes if getattr(p, "pass") == pass_name), None)
        if current is not None and current.state == "failed":
            raise RuntimeError(f"{status.document_id}: {pass_name} failed: {current.error}")
        if current is not None and current.state == "done":
            times[status.document_id] = datetime.fromisoformat(current.updated_at).timestamp()
    return times


def _wait_pass(
    settings: Settings,
    tenant: str,
    ids: Sequence[str],
    pass_name: str,
    what: str,
    console: Console,
) -> list[float]:
    """The done times of every document once all have finished `pass_name`. Only documents
    not yet done are asked about: the bench's polling shares the cores it measures."""
    deadline = time.monotonic() + PASS_TIMEOUT_S
    done: dict[str, float] = {}
    with counted_phase(console, what, len(ids)) as bar:
        while True:
            pending = [i for i in ids if i not in done]
            done.update(_pass_progress(settings, tenant, pending, pass_name))
            bar.reach(len(done))
            if len(done) == len(ids):
                return list(done.values())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pass_name} did not finish within {PASS_TIMEOUT_S:.0f}s")
            time.sleep(POLL_S)


def _staged_passes(
    stack: LocalStack, tenant: str, docs: Sequence[SourceDocument], console: Console
) -> dict[str, Any]:
    """Each pass alone on the whole corpus, its workers started in pipeline order."""
    step(console, f"per pass: submitting {len(docs)} documents to {tenant}, no worker running")
    ids, _ = ingest_client.submit(stack.settings, tenant, docs, console)
    rates: dict[str, Any] = {}
    for pass_name in INGEST_PASSES:
        with phase(console, f"per pass: starting the {pass_name} worker"):
            worker = start_ingest_worker(pass_name, stack.settings, stack.state_dir, free_port())
        stack.processes.append(worker)
        ready = time.time()
        what = f"per pass: {pass_name} alone on {len(ids)} documents"
        last = max(_wait_pass(stack.settings, tenant, ids, pass_name, what, console))
        rates[f"{pass_name}_docs_per_s"] = round(len(ids) / max(last - ready, 1e-3), 2)
    return rates


def _end_to_end(
    settings: Settings, tenant: str, docs: Sequence[SourceDocument], console: Console
) -> dict[str, Any]:
    """The corpus through every pass at once (all workers already running)."""
    step(console, f"end to end: submitting {len(docs)} documents to {tenant}, every worker running")
    started = time.time()
    ids, _ = ingest_client.submit(settings, tenant, docs, console)
    what = f"end to end: {len(ids)} documents through every pass"
    last = max(_wait_pass(settings, tenant, ids, INGEST_PASSES[-1], what, console))
    seconds = max(last - started, 1e-3)
    return {"ingest_docs_per_s": round(len(ids) / seconds, 2), "ingest_s": round(seconds, 1)}


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))
    return ordered[index]


def _timed_asks(
    stub: knowledge_pb2_grpc.KnowledgeServiceStub,
    tenant: str,
    questions: Sequence[KnowledgeQuestion],
    method: str,
    rounds: int,
    console: Console,
) -> tuple[list[float], dict[str, list[float]]]:
    latencies: list[float] = []
    stages: dict[str, list[float]] = {}
    what = f"Ask ({method}): {rounds} round(s) of {len(questions)} questions"
    with counted_phase(console, what, len(questions) * rounds) as bar:
        for _ in range(rounds):
            for question in questions:
                start = time.perf_counter()
                reply = ask(stub, tenant, question.question, ASK_K, method)
                latencies.append((time.perf_counter() - start) * 1000.0)
                for timing in reply.timings:
                    stages.setdefault(timing.stage, []).append(timing.ms)
                bar.advance()
    return latencies, stages


def _first_asks(settings: Settings, question: KnowledgeQuestion) -> dict[str, Any]:
    """The first question of each tenant, with the default method: first on the per-pass tenant,
    whose ingestion ended a minute before (its reads ahead done; the search process's first
    question too), then on the end-to-end one right after its ingestion (its reads ahead may
    still be under way). With each, the service's timings of its stages."""
    stub = knowledge_stub(settings)
    figures: dict[str, Any] = {}
    for key, tenant in (("ask_first_quiet", STAGED_TENANT), ("ask_first_fresh", TENANT)):
        start = time.perf_counter()
        reply = ask(stub, tenant, question.question, ASK_K, "graph-ppr")
        figures[f"{key}_ms"] = round((time.perf_counter() - start) * 1000.0, 1)
        figures[f"{key}_stage_ms"] = {t.stage: round(t.ms, 1) for t in reply.timings}
    return figures


def _ask_latency(
    settings: Settings,
    tenant: str,
    questions: Sequence[KnowledgeQuestion],
    rounds: int,
    console: Console,
) -> dict[str, Any]:
    stub = knowledge_stub(settings)
    what = f"Ask warm-up (not counted): {len(questions)} questions"
    with counted_phase(console, what, len(questions)) as bar:
        for question in questions:  # models, caches, query plans, the propagation graph
            ask(stub, tenant, question.question, ASK_K, "graph-ppr")
            ask(stub, tenant, question.question, ASK_K, "graph-first")
            bar.advance()
    figures: dict[str, Any] = {}
    for prefix, method in (("ask", "graph-ppr"), ("ask_graph_first", "graph-first")):
        latencies, stages = _timed_asks(stub, tenant, questions, method, rounds, console)
        figures |= {
            f"{prefix}_p50_ms": round(statistics.median(latencies), 1),
            f"{prefix}_p99_ms": round(_percentile(latencies, 0.99), 1),
            f"{prefix}_stage_p50_ms": {
                s: round(statistics.median(v), 2) for s, v in stages.items()
            },
        }
    vector, _ = _timed_asks(stub, tenant, questions, "vector", rounds, console)
    return figures | {
        "ask_vector_p50_ms": round(statistics.median(vector), 1),
        "ask_vector_p99_ms": round(_percentile(vector, 0.99), 1),
        "ask_requests": len(vector),
    }
