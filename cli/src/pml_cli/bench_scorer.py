"""`pml bench scorer`: SHGAT scoring latency at scale, training step cost, and learning latency.

- `p50_ms` / `p99_ms`: `ScoreCapabilities` over gRPC (intent given as an embedding, top 10)
  against a synthetic hierarchy of N capabilities over random tool sets, served by the real
  servicer, snapshot holder and model (the hierarchy is handed to the scorer directly instead
  of being read from Neo4j, so the figure is the serving path alone). `inproc_p50_ms` is the
  model's own time; `build_s` the propagation + key precomputation of that version.
- `tools_p50_ms` / `tools_p99_ms`: `ScoreTools` over gRPC on the same tools, served as a
  published version is, `first stage + SHGAT + execution memory`, with a memory of
  `memory_executions` remembered executions (`memory_inproc_p50_ms`: the memory's own time).
- `first_stage_p50_ms` / `adapted_first_stage_p50_ms`: the first stage `ScoreTools` computes
  for a request of `first_stage_goals` clauses over `first_stage_tools` tools with the default
  tool embedder's widths (512 + 384), in process: plain, then with a query adapter (the plain
  and the adapted relevance, BM25 read once, as a version with an adapter is served).
  `adapter_fit_s`: fitting that adapter on `adapter_executions` executions (random vectors,
  2-4 tools each; a round's cost, paid by the trainer). Both on one BLAS thread, as the scorer
  and the trainer run.
- `gate_judge_s`: the gate judging a candidate with all three corrections on `gate_executions`
  held-back executions over `first_stage_tools` tools (`gating.judge`: every weight
  combination, then the cross-fitted figures; a round's cost, paid by the trainer).
- `train_step_ms`: one PER training step (32 traces, one example per path node) on a smaller
  synthetic hierarchy (`train_graph_nodes`).
- `event_to_serving_s`: through the running system (or a private one), the wall time from
  publishing enough executions for a round (`replay_min_traces`, plus the share held back to
  judge versions) to the scorer serving a version trained on them, or reporting it rejected by
  the gate; the median of `rounds` measurements.
- `beside_long_round_s`: the same, once more, published while another tenant's round over a
  burst of `long_round_executions` runs (the longest round, `PML_TRAIN_STEPS` steps);
  `long_round_s`: from that burst's publication to its own version. With one round at a time
  (`PML_TRAIN_CONCURRENT_ROUNDS=1`) the first waits for the second.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from threadpoolctl import threadpool_limits

from pml.v1 import common_pb2, scorer_pb2, scorer_pb2_grpc, search_pb2
from pml_cli import client
from pml_cli.catalog_files import load_catalog
from pml_cli.local_stack import running_system
from pml_cli.phases import counted_phase, phase, step
from pml_common.embedding import Embedder, build_embedder
from pml_common.events import ExecutionCompleted, ExecutionStep, ToolSpec
from pml_common.grpc_server import GrpcServer
from pml_common.settings import Settings
from pml_common.tool_first_stage import FusedFirstStage, Intent
from pml_common.tool_graph import GraphTool, ToolGraph
from pml_scorer.models import TenantModel
from pml_scorer.service import ScorerServicer
from pml_scorer.snapshots import ModelSnapshots
from pml_shgat.adapter import fit as fit_adapter
from pml_shgat.gating import Corrections, Judged, Weights, judge
from pml_shgat.hierarchy import CapabilityInput, Hierarchy, normalise_rows
from pml_shgat.memory import CAPACITY, FEATURES, Execution, MemoryRanker, ServedMemory
from pml_shgat.params import init_params, make_config
from pml_shgat.serving import ServingModel
from pml_shgat.training import ShgatTrainer, make_batch, path_examples

TENANT = "bench"
DEMO_CATALOG = Path(__file__).parent / "demo" / "catalog.jsonl"
TRAIN_BATCH = 32
TRAIN_STEPS = 20
INPROC_CALLS = 200
FIRST_STAGE_TOOLS = 10_000
FIRST_STAGE_GOALS = 3
#: The default tool embedder's widths (USE multilingual, multilingual-e5-small, MiniLM).
EMBEDDER_PARTS = (512, 384, 384)
ADAPTER_EXECUTIONS = 300
#: Held-back executions the gate judges on: a tenant's most (`HoldOut.capacity`).
GATE_EXECUTIONS = 200
#: Another tenant's burst whose round is as long as rounds get (`PML_TRAIN_STEPS` of 200 is
#: the full draws of about 430 executions), and how long after its quiet period it has started.
LONG_ROUND_EXECUTIONS = 540
ROUND_START_S = 3.0
_WORDS = np.array([f"w{i}" for i in range(5_000)])


def bench_scorer(
    settings: Settings,
    capabilities: int,
    requests: int,
    rounds: int,
    console: Console,
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    # Intents are given as embeddings, so no embedding is computed: the servicer only checks
    # their size against the configured embedder's.
    embedder = build_embedder(settings, None)
    dim = embedder.dim
    with phase(console, f"building a hierarchy of {capabilities} capabilities"):
        hierarchy = _synthetic_hierarchy(capabilities, max(100, capabilities // 50), dim, rng)
        config = make_config(dim, settings.shgat_key_dim, hierarchy.num_nodes)
        params = init_params(config, hierarchy.features, hierarchy.num_levels)
        started = time.perf_counter()
        model = ServingModel(config, params, hierarchy)
        build_s = time.perf_counter() - started
        memory = _synthetic_memory(hierarchy, CAPACITY, rng)
    intents = normalise_rows(rng.standard_normal((64, dim)))
    with phase(console, f"measured: {INPROC_CALLS} in-process scorings"):
        inproc = _timed(lambda i: model.score_capabilities(intents[i % 64], 10), INPROC_CALLS)
    first = np.asarray(hierarchy.features[: hierarchy.num_tools] @ intents.T).T
    with phase(console, f"measured: {INPROC_CALLS} in-process execution-memory corrections"):
        remembered = _timed(
            lambda i: memory.correction(first[i % 64], intents[i % 64]), INPROC_CALLS
        )
    latencies, tools = asyncio.run(
        _grpc_latencies(settings, model, memory, embedder, intents, requests, console)
    )
    result: dict[str, Any] = {
        "capabilities": capabilities,
        "tools": hierarchy.num_tools,
        "heads": config.heads,
        "key_dim": config.key_dim,
        "build_s": round(build_s, 2),
        "p50_ms": _ms(statistics.median(latencies)),
        "p99_ms": _ms(float(np.percentile(latencies, 99))),
        "inproc_p50_ms": _ms(statistics.median(inproc)),
        "tools_p50_ms": _ms(statistics.median(tools)),
        "tools_p99_ms": _ms(float(np.percentile(tools, 99))),
        "memory_executions": len(memory.memory),
        "memory_inproc_p50_ms": _ms(statistics.median(remembered)),
    }
    # on one BLAS thread, as the scorer serves and the trainer fits
    with threadpool_limits(limits=1, user_api="blas"):
        result |= _first_stage_cost(FIRST_STAGE_TOOLS, ADAPTER_EXECUTIONS, rng, console)
        result |= _gate_cost(FIRST_STAGE_TOOLS, GATE_EXECUTIONS, rng, console)
    result |= _train_step(dim, settings.shgat_key_dim, rng, console)
    result |= _event_to_serving(settings, rounds, console)
    return result


def _synthetic_hierarchy(
    capabilities: int, tools: int, dim: int, rng: np.random.Generator
) -> Hierarchy:
    tool_ids = [f"bench:tool{i}" for i in range(tools)]
    vectors = normalise_rows(rng.standard_normal((tools, dim)))
    members = rng.integers(0, tools, size=(capabilities, 3))
    caps = [
        CapabilityInput(f"cap{c}", None, tools=[tool_ids[i] for i in members[c]])
        for c in range(capabilities)
    ]
    # one capability in ten is a meta-capability over two leaf ones: two levels, as in real use
    metas = capabilities // 10
    for c in range(metas):
        leaves = [f"cap{metas + (2 * c + j) % (capabilities - metas)}" for j in (0, 1)]
        caps[c] = CapabilityInput(f"cap{c}", None, capabilities=leaves)
    return Hierarchy.build(dict(zip(tool_ids, vectors, strict=True)), caps)


def _synthetic_memory(
    hierarchy: Hierarchy, executions: int, rng: np.random.Generator
) -> ServedMemory:
    """Remembered executions of 2-4 random tools over the hierarchy's tools (50 servers); the
    weights do not change the cost, so they are not fitted."""
    ids = hierarchy.tool_ids
    remembered = tuple(
        Execution(
            normalise_rows(rng.standard_normal((1, hierarchy.dim)))[0].astype(np.float32),
            tuple(
                ids[i] for i in rng.choice(len(ids), size=int(rng.integers(2, 5)), replace=False)
            ),
        )
        for _ in range(executions)
    )
    width = len(FEATURES)
    ranker = MemoryRanker(
        remembered, rng.standard_normal(width + 1), np.zeros(width), np.ones(width)
    )
    return ranker.serve(ids, [f"server{i % 50}" for i in range(len(ids))])


class _FixedBuilder:
    """Hands the synthetic model to the snapshot holder (no Neo4j at this size), served as a
    published version with SHGAT's and the memory's corrections at weight 1 (its tools have
    no tool-embedder vectors, so no query adapter)."""

    def __init__(self, model: ServingModel, memory: ServedMemory) -> None:
        self._model = model
        self._memory = memory
        hierarchy = model.hierarchy
        self._first_stage = FusedFirstStage.of_vectors(
            hierarchy.tool_ids, list(hierarchy.features[: hierarchy.num_tools])
        )

    async def build(self, tenant: str, current: TenantModel | None = None) -> TenantModel:
        return TenantModel(
            tenant_id=tenant,
            model=self._model,
            record=None,
            built_at=datetime.now(UTC),
            graph_digest=b"",
            registry_version=None,
            baseline=self._first_stage,
            weights=Weights(shgat=1.0, memory=1.0),
            memory=self._memory,
        )


async def _grpc_latencies(
    settings: Settings,
    model: ServingModel,
    memory: ServedMemory,
    embedder: Embedder,
    intents: np.ndarray,
    requests: int,
    console: Console,
) -> tuple[list[float], list[float]]:
    """Seconds of each of `requests` ScoreCapabilities, then of as many ScoreTools."""
    # A private loopback server: plaintext and no token, whatever the environment asks of the
    # real services, so the figures are comparable from one run to the next.
    settings = settings.model_copy(update={"tls_enabled": False, "auth_enabled": False})
    server = GrpcServer(settings, 0, "scorer-bench")
    servicer = ScorerServicer(settings, ModelSnapshots(_FixedBuilder(model, memory)), embedder)
    server.add(
        lambda s: scorer_pb2_grpc.add_ScorerServiceServicer_to_server(servicer, s),
        "pml.v1.ScorerService",
    )
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = scorer_pb2_grpc.ScorerServiceStub(channel)
            messages = [
                scorer_pb2.ScoreRequest(
                    tenant_id=TENANT, embedding=scorer_pb2.Embedding(values=v.tolist()), top_k=10
                )
                for v in intents
            ]
            with phase(console, "warm-up: a first ScoreCapabilities loads the model"):
                await stub.ScoreCapabilities(messages[0], timeout=120)
            timed = []
            for name, call in (
                ("ScoreCapabilities", stub.ScoreCapabilities),
                ("ScoreTools", stub.ScoreTools),
            ):
                latencies = []
                what = f"measured: {requests} {name} over gRPC"
                with counted_phase(console, what, requests) as bar:
                    for i in range(requests):
                        started = time.perf_counter()
                        await call(messages[i % len(messages)], timeout=30)
                        latencies.append(time.perf_counter() - started)
                        bar.advance()
                timed.append(latencies)
            return timed[0], timed[1]
    finally:
        await server.stop()


def _first_stage_cost(
    tools: int, executions: int, rng: np.random.Generator, console: Console
) -> dict[str, Any]:
    with phase(console, f"building a first stage of {tools} tools (BM25, 2 models)"):
        catalog = _ensemble_rows(tools, rng)
        first_stage = _synthetic_first_stage(catalog, rng)
        intents = [
            Intent(
                np.zeros(1),
                tuple(" ".join(rng.choice(_WORDS, size=8)) for _ in range(FIRST_STAGE_GOALS)),
                _ensemble_rows(FIRST_STAGE_GOALS, rng),
            )
            for _ in range(16)
        ]
    requests = _ensemble_rows(executions, rng)
    ran = [rng.choice(tools, size=int(rng.integers(2, 5))).tolist() for _ in requests]
    with phase(console, f"measured: a query adapter fitted on {executions} executions"):
        started = time.perf_counter()
        adapter = fit_adapter(requests, ran, catalog, EMBEDDER_PARTS, rng)
        fit_s = time.perf_counter() - started
    adapt = adapter.adapt if adapter is not None else None  # None only for an empty catalog
    with phase(console, f"measured: {INPROC_CALLS} first stages, plain then adapted"):
        plain = _timed(lambda i: first_stage.scores(intents[i % 16]), INPROC_CALLS)
        adapted = _timed(lambda i: first_stage.scores_adapted(intents[i % 16], adapt), INPROC_CALLS)
    return {
        "first_stage_tools": tools,
        "first_stage_goals": FIRST_STAGE_GOALS,
        "first_stage_p50_ms": _ms(statistics.median(plain)),
        "adapted_first_stage_p50_ms": _ms(statistics.median(adapted)),
        "adapter_executions": executions,
        "adapter_fit_s": round(fit_s, 2),
    }


def _gate_cost(
    tools: int, executions: int, rng: np.random.Generator, console: Console
) -> dict[str, Any]:
    """The gate's time on a candidate whose corrections each lift the executed tools of
    about half the held-back executions (so it is admitted, the branch that reads the
    cross-fitted figures)."""
    judged = [
        Judged(tuple(int(t) for t in rng.choice(tools, int(rng.integers(2, 5)), replace=False)))
        for _ in range(executions)
    ]
    first = [rng.random(tools) for _ in judged]

    def correction(density: float) -> list[np.ndarray]:
        rows = [rng.random(tools) * (rng.random(tools) < density) for _ in judged]
        for row, one in zip(rows, judged, strict=True):
            if rng.random() < 0.5:
                row[list(one.relevant)] += 1.0
        return rows

    candidate = Corrections(correction(1.0), correction(0.05), correction(1.0))
    with phase(console, f"measured: the gate on {executions} held-back executions"):
        started = time.perf_counter()
        verdict = judge(first, first, candidate, judged)
        judge_s = time.perf_counter() - started
    return {
        "gate_executions": executions,
        "gate_judge_s": round(judge_s, 2),
        "gate_admitted": verdict.accepted,
    }


def _synthetic_first_stage(catalog: np.ndarray, rng: np.random.Generator) -> FusedFirstStage:
    """A first stage over tools of random texts whose tool-embedder vectors are `catalog`."""
    graph_tools = tuple(
        GraphTool(f"s{i % 200}:t{i}", f"t{i}", " ".join(rng.choice(_WORDS, size=20)), f"s{i % 200}")
        for i in range(len(catalog))
    )
    vectors = {t.id: catalog[i] for i, t in enumerate(graph_tools)}
    return FusedFirstStage.of_graph(
        ToolGraph("", graph_tools, (), vectors, catalog, EMBEDDER_PARTS)
    )


def _ensemble_rows(count: int, rng: np.random.Generator) -> np.ndarray:
    """Rows laid out as the tool embedder gives them: each model's unit vector scaled by
    1/√k, side by side."""
    scale = 1 / np.sqrt(len(EMBEDDER_PARTS))
    blocks = [normalise_rows(rng.standard_normal((count, w))) * scale for w in EMBEDDER_PARTS]
    return np.hstack(blocks).astype(np.float32)


def _train_step(
    dim: int, key_dim: int, rng: np.random.Generator, console: Console
) -> dict[str, Any]:
    hierarchy = _synthetic_hierarchy(1000, 500, dim, rng)
    config = make_config(dim, key_dim, hierarchy.num_nodes)
    trainer = ShgatTrainer(config, init_params(config, hierarchy.features, 2), hierarchy)
    intents = normalise_rows(rng.standard_normal((TRAIN_BATCH, dim)))

    def step(_: int) -> None:
        caps = rng.integers(0, hierarchy.num_capabilities, TRAIN_BATCH)
        examples = [
            e
            for intent, c in zip(intents, caps, strict=True)
            for e in path_examples(
                hierarchy, intent, [], 1.0, capability_id=hierarchy.capability_ids[c]
            )
            + path_examples(hierarchy, intent, hierarchy.tool_ids[:2], 1.0)
        ]
        trainer.step(make_batch(examples, hierarchy, rng))

    what = f"measured: {TRAIN_STEPS} training steps of {TRAIN_BATCH} traces"
    with counted_phase(console, what, TRAIN_STEPS) as bar:
        times = _timed(step, TRAIN_STEPS, bar.advance)
    return {
        "train_step_ms": _ms(statistics.median(times)),
        "train_graph_nodes": hierarchy.num_nodes,
        "train_batch": TRAIN_BATCH,
    }


def _event_to_serving(settings: Settings, rounds: int, console: Console) -> dict[str, Any]:
    tools = load_catalog(DEMO_CATALOG)
    step(console, "executions → served version: on the running system, or a private one")
    with running_system(settings, console, ("search", "trainer", "scorer")) as live:
        tenant = f"bench-{uuid.uuid4().hex[:10]}"
        busy = f"bench-busy-{uuid.uuid4().hex[:10]}"
        with client.scratch_tenants(live, console, tenant, busy, timeout=120):
            pairs = [[tools[i].id, tools[i + 1].id] for i in range(0, 20, 2)]
            what = f"registering {len(tools)} demo tools and {len(pairs)} capabilities"
            for name in (tenant, busy):
                with phase(console, f"{what} under {name}"):
                    _register(live, name, tools, pairs)
            times = [_one_publication(live, tenant, pairs, r, console) for r in range(rounds)]
            beside = _beside_a_long_round(live, tenant, busy, pairs, rounds, console)
    return {
        "event_to_serving_s": round(statistics.median(times), 2),
        "event_to_serving_runs_s": [round(t, 2) for t in times],
        **beside,
        # a round's steps follow the executions it learns (at most train_steps)
        "train_draws_per_execution": live.train_draws_per_execution,
        "train_steps_at_most": live.train_steps,
        "train_concurrent_rounds": live.train_concurrent_rounds,
    }


def _beside_a_long_round(
    settings: Settings,
    tenant: str,
    busy: str,
    pairs: list[list[str]],
    rounds_before: int,
    console: Console,
) -> dict[str, Any]:
    """One more of `tenant`'s publications, made while `busy`'s round over a burst of
    `LONG_ROUND_EXECUTIONS` runs: how long one tenant's learning waits on another's."""
    stub = client.scorer_stub(settings)
    request = scorer_pb2.ModelInfoRequest(tenant_id=busy)
    rejected = stub.ModelInfo(request, timeout=30).last_rejected.version
    what = f"{LONG_ROUND_EXECUTIONS} executions under {busy}, and its round starting"
    with phase(console, what):
        started = time.perf_counter()
        asyncio.run(
            client.publish_events(settings, _executions(busy, pairs, LONG_ROUND_EXECUTIONS, "busy"))
        )
        time.sleep(settings.train_quiet_s + ROUND_START_S)
    beside = _one_publication(settings, tenant, pairs, rounds_before, console)
    with phase(console, f"waiting for {busy}'s version"):
        _until_judged(stub, busy, LONG_ROUND_EXECUTIONS, rejected)
    return {
        "beside_long_round_s": round(beside, 2),
        "long_round_s": round(time.perf_counter() - started, 2),
        "long_round_executions": LONG_ROUND_EXECUTIONS,
    }


def _executions(
    tenant: str, pairs: list[list[str]], count: int, label: str
) -> list[ExecutionCompleted]:
    return [
        ExecutionCompleted.create(
            tenant_id=tenant,
            intent=f"bench intent {label}-{i}",
            steps=[ExecutionStep(node_id=t, success=True) for t in pairs[i % len(pairs)]],
            outcome="success",
            capability_id=f"c{i % len(pairs)}",
        )
        for i in range(count)
    ]


def _register(
    settings: Settings, tenant: str, tools: list[ToolSpec], pairs: list[list[str]]
) -> None:
    client.register_tools(settings, tenant, tools)
    client.search_stub(settings).RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=tenant,
            capabilities=[
                common_pb2.Capability(id=f"c{i}", name=f"c{i}", tools=p)
                for i, p in enumerate(pairs)
            ],
        ),
        timeout=120,
    )


def _one_publication(
    settings: Settings, tenant: str, pairs: list[list[str]], round_: int, console: Console
) -> float:
    stub = client.scorer_stub(settings)
    # One execution in 5 is held back to judge versions: enough for a round to start.
    count = settings.replay_min_traces * 5 // 4 + 1
    events = _executions(tenant, pairs, count, str(round_))
    request = scorer_pb2.ModelInfoRequest(tenant_id=tenant)
    rejected = stub.ModelInfo(request, timeout=30).last_rejected.version
    what = f"measured: round {round_ + 1}, {count} executions → a served (or rejected) version"
    with phase(console, what):
        started = time.perf_counter()
        asyncio.run(client.publish_events(settings, events))
        _until_judged(stub, tenant, (round_ + 1) * count, rejected)
        return time.perf_counter() - started


def _until_judged(
    stub: scorer_pb2_grpc.ScorerServiceStub, tenant: str, executions: int, rejected: str
) -> None:
    """Until the scorer serves a version trained on `executions` of `tenant`'s, or the gate
    rejected a newer one than `rejected`."""
    request = scorer_pb2.ModelInfoRequest(tenant_id=tenant)
    while True:
        info = stub.ModelInfo(request, timeout=30)
        # a version is judged on held-back executions: served, or kept as rejected
        covered = info.metrics.get("traces_seen", 0) + info.metrics.get("holdout_size", 0)
        if covered >= executions or info.last_rejected.version != rejected:
            return
        time.sleep(0.05)


def _timed(
    call: Callable[[int], object], count: int, done: Callable[[], None] = lambda: None
) -> list[float]:
    """Seconds of each of `count` calls; `done` after each (a bar's advance), not timed."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - started)
        done()
    return times


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)
