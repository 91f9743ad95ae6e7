"""The hot swap: models replaced under load, every answer whole and from the version it names.

Client tasks call ScoreCapabilities and ScoreTools through real gRPC without pause while
versions with visibly different parameters are published to the registry and announced with
`ModelPublished`. Every response must succeed, and its scores must be exactly what the version
it reports in `model_version` gives (checked against a `ServingModel` built here from that
version's parameters): a response computed half with one version and half with another, or
labelled with the wrong version, fails. The versions are checked to be distinguishable, and
several of them must actually have answered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import neo4j
from redis.asyncio import Redis

from pml.v1 import scorer_pb2, scorer_pb2_grpc
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_common.testing import eventually
from pml_common.tool_first_stage import FusedFirstStage, Intent, embed_intents
from pml_scorer.main import ScorerApp
from pml_shgat.gating import WEIGHT_METRIC, served_scores, tool_scores
from pml_shgat.params import Params
from pml_shgat.serving import ScoredNode, ServingModel

from .helpers import (
    announce_model,
    first_stage_reference,
    ranked,
    untrained_reference,
    variant,
    write_catalog,
)

INTENTS = ["take a screenshot of a web page", "commit and push my changes"]
CLIENTS = 6
VERSIONS = 8
BURST = 3
MIN_RUN_S = 2.0


@dataclass(frozen=True)
class Answer:
    kind: str  # "capabilities" | "tools"
    intent: int
    version: str
    scores: tuple[tuple[str, float, int], ...]


async def client(
    port: int, tenant: str, number: int, stop: asyncio.Event, answers: list[Answer]
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scorer_pb2_grpc.ScorerServiceStub(channel)
        n = number
        while not stop.is_set():
            n += 1
            intent = n % len(INTENTS)
            request = scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENTS[intent], top_k=100)
            if n % 2:
                reply = await stub.ScoreCapabilities(request, timeout=30)
                kind = "capabilities"
            else:
                reply = await stub.ScoreTools(request, timeout=30)
                kind = "tools"
            answers.append(
                Answer(
                    kind,
                    intent,
                    reply.model_version,
                    tuple((s.id, s.score, s.level) for s in reply.scores),
                )
            )


#: Weight of the learned correction in the versions published here (tools are served as
#: first stage + w · SHGAT score, so every version's tool answers differ too).
WEIGHT = 1.0


def expected(
    model: ServingModel,
    first_stage: FusedFirstStage,
    kind: str,
    intent: Intent,
    weight: float,
) -> list[ScoredNode]:
    if kind == "capabilities":
        return model.score_capabilities(intent.vector, 100)
    first = first_stage.scores(intent)
    correction = tool_scores(model, intent.vector)
    return ranked(first_stage.ids, served_scores(first, correction, weight), 100)


async def test_responses_during_repeated_swaps_match_the_version_they_report(
    app: ScorerApp,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    settings: Settings,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    hierarchy, config, untrained = await untrained_reference(
        graph_db, settings, tenant, app.embedder
    )
    params_of: dict[str, Params] = {"untrained": untrained}
    burst: list[str] = []

    stop = asyncio.Event()
    answers: list[Answer] = []
    clients = [
        asyncio.create_task(client(app.port, tenant, i, stop, answers)) for i in range(CLIENTS)
    ]
    started = time.monotonic()
    try:
        for seed in range(VERSIONS):
            params = variant(config, untrained, seed=100 + seed)
            record = await announce_model(
                app.bus, registry, redis, tenant, config, params, {WEIGHT_METRIC: WEIGHT}
            )
            params_of[record.version] = params
            # Each version serves a while before the next one replaces it.
            await eventually(
                lambda: _served_versions(answers), lambda seen, v=record.version: v in seen
            )
            await asyncio.sleep(max(0.05, MIN_RUN_S / VERSIONS - 0.1))
        # A burst: versions announced while the previous rebuild runs coalesce; the newest wins.
        for seed in range(BURST):
            params = variant(config, untrained, seed=200 + seed)
            record = await announce_model(
                app.bus, registry, redis, tenant, config, params, {WEIGHT_METRIC: WEIGHT}
            )
            params_of[record.version] = params
            burst.append(record.version)
        await eventually(lambda: _served_versions(answers), lambda seen: burst[-1] in seen)
        await asyncio.sleep(max(0.0, MIN_RUN_S - (time.monotonic() - started)))
    finally:
        stop.set()
        # Any failed RPC fails the test here.
        await asyncio.gather(*clients)

    models = {v: ServingModel(config, p, hierarchy) for v, p in params_of.items()}
    first = await first_stage_reference(graph_db, settings, tenant, app.embedder, app.tool_embedder)
    intents = await embed_intents(INTENTS, app.embedder, app.tool_embedder)
    weights = {v: 0.0 if v == "untrained" else WEIGHT for v in models}

    def want_of(v: str, kind: str, i: int) -> list[ScoredNode]:
        return expected(models[v], first, kind, intents[i], weights[v])

    # The check can tell the versions apart: no two give the same scores.
    signatures = {v: tuple(round(s.score, 9) for s in want_of(v, "tools", 0)) for v in models}
    assert len(set(signatures.values())) == len(models)

    assert len(answers) > 100, f"only {len(answers)} answers under load"
    # What each version gives, per kind and intent (few combinations, many answers).
    want = {
        (v, kind, i): [(w.id, w.score, w.level) for w in want_of(v, kind, i)]
        for v in models
        for kind in ("capabilities", "tools")
        for i in range(len(INTENTS))
    }
    for answer in answers:
        assert answer.version in models, f"unknown version {answer.version!r}"
        reference = want[(answer.version, answer.kind, answer.intent)]
        assert [(a[0], a[2]) for a in answer.scores] == [(w[0], w[2]) for w in reference], answer
        deviation = max(abs(a[1] - w[1]) for a, w in zip(answer.scores, reference, strict=True))
        assert deviation <= 1e-9, (answer, reference)

    # Every version published one by one answered (the loop waited for each), and the newest
    # of the burst answers last.
    stepwise = [v for v in params_of if v not in ("untrained", *burst)]
    assert len(stepwise) == VERSIONS
    assert {a.version for a in answers} >= set(stepwise)
    assert answers[-1].version == burst[-1]


async def _served_versions(answers: list[Answer]) -> set[str]:
    return {a.version for a in answers[-200:]}
