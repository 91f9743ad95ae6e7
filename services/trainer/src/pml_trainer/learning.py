"""Live SHGAT training: PER batches from the replay buffer, only while holding the lease lock.

A round trains one tenant: read its hierarchy from Neo4j, start from the tenant's current
model in the registry (or the initial one), run PER batches for the executions that model has
not learned from (`LearningConfig.round_steps`), and publish the mean of the parameters after
its last half of steps (`pml_shgat.training.IterateMean`) with the lease's fencing token. After
each batch the sampled traces get new priorities from their TD error,
`outcome − predictPathSuccess(intent, path)` under the updated model.

Gate: a trained candidate is published only if it ranks the executed tools of held-back
executions (`holdout`, traces no version trained on) better than the serving version and the
untrained first stage (`pml_shgat.gating`), with the corrections' weights chosen on the same
set (and barred from hurting the held-back executions whose tool set the buffer never ran;
the memory's and the adapter's also on the traces they learned from, scored out of fold,
`pml_trainer.corrections`);
else it is kept in the registry as the tenant's last rejected candidate, with its figures, and
the serving version stays.

Each candidate carries three corrections: the trained SHGAT, an execution memory
(`pml_shgat.memory`) fitted in the same round on the buffer's newest traces, each read with the
memory of the others, and a query adapter (`pml_shgat.adapter`) fitted on the same traces; the
memory and the adapter travel in the version's bytes.

Safety: the lease is checked before every step and before publishing, and a lost lease
abandons the round; the registry accepts a publish only with the newest fencing token, so even
a trainer that was paused past its lease (and does not know yet) cannot overwrite a newer model.
Event consumption never waits on training: rounds run in their own task, and the numpy work of
each step runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import structlog
from neo4j import AsyncDriver
from opentelemetry import metrics

from pml_common.embedding import Embedder
from pml_common.events import ModelPublished
from pml_common.lease_lock import Lease, LeaseLock
from pml_common.model_registry import ModelRecord, ModelRegistry, StaleFencingToken
from pml_common.tool_first_stage import Intent, embed_intents
from pml_common.tool_graph import ToolGraph, read_tool_graph
from pml_shgat.adapter import QueryAdapter
from pml_shgat.gating import (
    FRESHER_GROWTH,
    Corrections,
    Judged,
    OutOfFold,
    Verdict,
    judge,
    tool_scores,
)
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.memory import CAPACITY, ServedMemory
from pml_shgat.params import Params, ShgatConfig, from_bytes, init_params, make_config, to_bytes
from pml_shgat.serving import ServingModel
from pml_shgat.training import (
    IterateMean,
    ShgatTrainer,
    averaged_steps,
    make_batch,
    path_examples,
)
from pml_trainer.corrections import Fitted, fit_corrections
from pml_trainer.evaluation import TenantView, build_view, hierarchy_of, without_workflows
from pml_trainer.handlers import Publisher
from pml_trainer.holdout import HoldOut
from pml_trainer.replay_buffer import ReplayBuffer, Sample, Trace
from pml_trainer.round_timing import RoundTiming

log = structlog.get_logger(__name__)
_meter = metrics.get_meter("pml.trainer")
_decisions = _meter.create_counter(
    "pml.trainer.gate.decisions", description="Trained candidates admitted or rejected"
)
_holdout_recall = _meter.create_gauge(
    "pml.trainer.gate.holdout_recall_at_5",
    description="Held-back recall@5 of the last candidate, the serving version, the first stage",
)


@dataclass(frozen=True)
class LearningConfig:
    batch_size: int = 32
    #: Most steps of one round.
    steps: int = 30
    #: Traces drawn into batches per execution a round adds to what its starting model learned
    #: from: a model's training grows with its executions, not with the rounds it went through
    #: (trained further on the same executions, SHGAT ranks new requests worse).
    draws_per_execution: float = 15.0
    learning_rate: float = 0.003
    min_traces: int = 16
    poll_s: float = 1.0
    key_dim: int = 128
    seed: int | None = None
    #: Held-back executions needed before any candidate can be admitted.
    min_holdout: int = 3
    #: A round starts once the tenant's executions have stopped arriving for this long, or
    #: this long after they began to wait (`pml_trainer.round_timing`).
    quiet_s: float = 0.0
    max_wait_s: float = 0.0
    #: Most rounds (one per tenant) in progress at once; their steps take turns.
    concurrent_rounds: int = 4

    def round_steps(self, new_executions: int) -> int:
        """Steps of a round whose starting model has not learned from `new_executions`."""
        wanted = math.ceil(self.draws_per_execution * new_executions / self.batch_size)
        return max(1, min(self.steps, wanted))


class RoundAbandoned(Exception):
    """The lease was lost during a round: nothing of it may be published."""


class LearningLoop:
    def __init__(
        self,
        *,
        buffer: ReplayBuffer,
        lock: LeaseLock,
        registry: ModelRegistry,
        driver: AsyncDriver,
        database: str,
        embedder: Embedder,
        publisher: Publisher,
        config: LearningConfig,
        holdout: HoldOut,
        tool_embedder: Embedder | None = None,
    ) -> None:
        self._buffer = buffer
        #: The first stage's dense side (`PML_TOOL_EMBEDDER`), for the gate's comparisons.
        self._tool_embedder = tool_embedder
        self._holdout = holdout
        self._lock = lock
        self._registry = registry
        self._driver = driver
        self._database = database
        self._embedder = embedder
        self._publisher = publisher
        self._config = config
        self._timing = RoundTiming(config.quiet_s, config.max_wait_s)
        self._pauses = np.random.default_rng()  # never seeded: replicas must not pause alike
        #: One round's step (or judgement) at a time: concurrent rounds take turns, in order.
        self._turn = asyncio.Lock()

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire the lock, train what is pending, release; repeat until `stop`.

        The lock is released after every pass that trained something, and taken again after
        a random pause, so that replicas share the work and none becomes a single point of
        slowness; tokens grow with every hand-over, which is what fencing relies on.
        """
        while not stop.is_set():
            lease = await self._lock.acquire(self._config.poll_s, stop)
            if lease is None:
                return
            try:
                async with self._lock.hold(lease):
                    await self._train_one_pass(lease, stop)
            except Exception as exc:  # a store outage must not end learning for good
                log.warning("learning.interrupted", error=repr(exc), token=lease.token)
            await _sleep_unless(stop, self._pauses.uniform(0, self._config.poll_s))

    async def _train_one_pass(self, lease: Lease, stop: asyncio.Event) -> None:
        """Hold the lock while rounds run: wait until some pending tenant is ready
        (`RoundTiming`), start its round, and go on starting the rounds of tenants that become
        ready meanwhile, up to `concurrent_rounds` at once; return once none runs.

        Rounds of different tenants take turns step by step (`_turn`), so a tenant that
        becomes ready during another's long round is trained beside it instead of after it,
        and the trainer still does one step's work at a time. A round that fails is logged and
        its tenant waits for the next pass; the other rounds go on."""
        rounds: dict[str, asyncio.Task[None]] = {}
        failed: set[str] = set()  # tried in this pass: retried after the lock's hand-over
        started = False
        try:
            while lease.held() and not stop.is_set():
                for tenant in await self._ready(len(rounds), set(rounds) | failed):
                    rounds[tenant] = asyncio.create_task(
                        self._tenant_round(tenant, lease, stop, failed), name=f"round-{tenant}"
                    )
                    started = True
                if started and not rounds:
                    return
                await _sleep_unless(stop, self._config.poll_s, lease.lost, rounds.values())
                for tenant in [t for t, task in rounds.items() if task.done()]:
                    del rounds[tenant]
        finally:
            # a lost lease or `stop` abandons them at their next step (`_check`)
            await asyncio.gather(*rounds.values(), return_exceptions=True)

    async def _ready(self, running: int, excluded: set[str]) -> list[str]:
        """Pending tenants, not in `excluded`, whose round may start now beside `running`
        others (at most `concurrent_rounds` run at once)."""
        pending = await self._buffer.pending_tenants(self._config.min_traces)
        ready = [t for t in self._timing.ready_among(pending) if t not in excluded]
        return ready[: max(0, self._config.concurrent_rounds - running)]

    async def _tenant_round(
        self, tenant: str, lease: Lease, stop: asyncio.Event, failed: set[str]
    ) -> None:
        waited = self._timing.started(tenant)
        log.info("learning.tenant_ready", tenant=tenant, waited_s=round(waited, 2))
        try:
            await self.train_round(tenant, lease, stop)
        except RoundAbandoned:
            pass  # logged by the round; the pass ends with the lease or at `stop`
        except Exception as exc:  # one tenant's failure must not stop the others' rounds
            failed.add(tenant)
            log.warning("learning.round_failed", tenant=tenant, error=repr(exc))

    async def train_round(
        self, tenant: str, lease: Lease, stop: asyncio.Event | None = None
    ) -> ModelRecord | None:
        """Train one tenant and publish the new version if the gate admits it, else keep it as
        rejected; returns its record (metric `accepted` 1 or 0), None when there is nothing to
        learn.

        Raises `RoundAbandoned` when the lease is lost or `stop` is set before the publish.
        """
        wall_start = time.time()
        log.info("learning.round_started", tenant=tenant, token=lease.token, at=wall_start)
        try:
            return await self._round(tenant, lease, stop, wall_start)
        except RoundAbandoned as exc:
            log.warning(
                "learning.round_abandoned",
                tenant=tenant,
                token=lease.token,
                reason=str(exc),
                started_at=wall_start,
                at=time.time(),
            )
            raise

    async def _round(
        self,
        tenant: str,
        lease: Lease,
        stop: asyncio.Event | None,
        wall_start: float,
    ) -> ModelRecord | None:
        upto = await self._buffer.added_count(tenant)
        graph, hierarchy = await self._graph(tenant)
        if hierarchy.num_nodes == 0:
            await self._buffer.mark_trained(tenant, upto)
            return None
        published = await self._registry.current(tenant)
        config, params, learned, new = self._starting_point(tenant, hierarchy, published)
        trainer = ShgatTrainer(
            config,
            params,
            hierarchy,
            self._config.learning_rate,
            anchor=params if new else None,  # a new model is the untrained one it is pulled to
        )
        rng = self._round_rng(upto)
        losses, errors = [], []
        steps = self._config.round_steps(upto - learned)
        first_averaged = steps - averaged_steps(steps)
        averaged = IterateMean()  # the round's result: the mean of its last iterates
        for step in range(steps):
            async with self._turn:
                _check(lease, stop)
                loss, td = await self._step(tenant, trainer, hierarchy, rng)
            losses.append(loss)
            errors.append(td)
            if step >= first_averaged:
                averaged.add(trainer.params)
        _check(lease, stop)
        metrics = {
            "loss": float(np.mean(losses[-5:])),
            "mean_abs_td": float(np.mean(errors[-5:])),
            "steps": float(len(losses)),
            "traces": float(await self._buffer.size(tenant)),
            # executions received before the round started: all of them could be sampled
            "traces_seen": float(upto),
        }
        remembered = await self._buffer.newest(tenant, CAPACITY)
        async with self._turn:
            record = await self.admit(
                tenant,
                lease,
                graph,
                hierarchy,
                published,
                config,
                averaged.mean,
                metrics,
                wall_start,
                remembered,
                rng,
            )
        await self._buffer.mark_trained(tenant, upto)
        log.info(
            "learning.round_finished",
            tenant=tenant,
            token=lease.token,
            version=record.version,
            accepted=bool(record.metrics.get("accepted")),
            at=time.time(),
            started_at=wall_start,
            **metrics,
        )
        return record

    async def admit(
        self,
        tenant: str,
        lease: Lease,
        graph: ToolGraph,
        hierarchy: Hierarchy,
        published: tuple[ModelRecord, bytes] | None,
        config: ShgatConfig,
        params: Params,
        metrics: dict[str, float],
        wall_start: float | None = None,
        remembered: Sequence[Trace] = (),
        rng: np.random.Generator | None = None,
    ) -> ModelRecord:
        """Publish the candidate if the gate admits it against `published` (the serving
        version, None for the first stage alone), else keep it as the last rejected one; the
        record's metrics carry the decision (`accepted`) and the figures it was made on.

        `remembered`: the traces the candidate's execution memory and query adapter are fitted
        on (none: the candidate has neither); `rng`: the round's draws (`_round_rng`)."""
        if rng is None:
            rng = self._round_rng(int(metrics.get("traces_seen", 0)))
        serving = await asyncio.to_thread(build_view, graph, hierarchy, published)
        fitted = await self._fit_corrections(serving, graph, remembered, rng)
        ranker, adapter = fitted.memory, fitted.adapter
        memory = (
            ranker.serve(hierarchy.tool_ids, graph.servers_of(hierarchy.tool_ids))
            if ranker
            else None
        )
        verdict = await self.gate(
            tenant,
            serving,
            config,
            params,
            graph,
            published,
            memory,
            _fresher(metrics, published),
            adapter,
            fitted.out_of_fold,
        )
        _check(lease, None)
        figures = {
            **metrics,
            **({"train_s": time.time() - wall_start} if wall_start is not None else {}),
            "accepted": float(verdict.accepted),
            "memory_executions": float(len(ranker.executions) if ranker else 0),
            **verdict.as_metrics(),
        }
        blob = to_bytes(
            config,
            params,
            {
                **(ranker.to_arrays() if ranker else {}),
                **(adapter.to_arrays() if adapter else {}),
            },
        )
        if verdict.accepted:
            record = await self._publish(tenant, lease, blob, figures)
        else:
            record = await self._reject(tenant, lease, blob, figures)
        _export(tenant, verdict)
        log.info(
            "learning.candidate_judged",
            tenant=tenant,
            version=record.version,
            accepted=verdict.accepted,
            reason=verdict.reason,
            weight=verdict.weights.shgat,
            memory_weight=verdict.weights.memory,
            adapter_weight=verdict.weights.adapter,
            candidate_recall_at_5=verdict.candidate.recall_at_5,
            serving_recall_at_5=verdict.serving.recall_at_5,
            first_stage_recall_at_5=verdict.first_stage.recall_at_5,
            cross_fitted_recall_at_5=verdict.cross_fitted.recall_at_5,
            holdout=verdict.candidate.count,
        )
        return record

    async def gate(
        self,
        tenant: str,
        serving: TenantView,
        config: ShgatConfig,
        params: Params,
        graph: ToolGraph,
        published: tuple[ModelRecord, bytes] | None,
        memory: ServedMemory | None = None,
        fresher: bool = False,
        adapter: QueryAdapter | None = None,
        out_of_fold: Callable[[], OutOfFold | None] | None = None,
    ) -> Verdict:
        """Judge a candidate (SHGAT `params`, and its execution `memory` and query `adapter` when
        it has them) against the serving view on the tenant's held-back executions (`fresher`:
        it learned from enough more executions than the serving version to replace it on a tie,
        `gating.judge`).

        A novel one (no trace in the replay buffer ran its set of tools) is judged as new work:
        without the capabilities that run exactly its tools (`without_workflows`), since work
        of a new kind has no capability yet, and a correction that only recalls registered
        workflows must not pass for one that generalizes. `out_of_fold`: computes the memory's
        and the adapter's scores of the traces they were fitted on, each by fits made without it
        (`pml_trainer.corrections`), judged beside the held-back executions when SHGAT gets no
        weight."""
        traces: list[Trace] = []
        judged: list[Judged] = []
        trained = await self._buffer.tool_sets(tenant)
        for trace in await self._holdout.recent(tenant):
            one = serving.judged(trace)
            if one is not None:
                traces.append(trace)
                judged.append(replace(one, novel=frozenset(trace.path) not in trained))
        intents = await embed_intents(
            [t.intent for t in traces], self._embedder, self._tool_embedder
        )
        novel = {frozenset(t.path) for t, j in zip(traces, judged, strict=True) if j.novel}
        unseen = await asyncio.to_thread(without_workflows, serving, graph, published, novel)
        return await asyncio.to_thread(
            _judge,
            serving,
            unseen,
            config,
            params,
            memory,
            adapter,
            intents,
            judged,
            self._config.min_holdout,
            fresher,
            out_of_fold,
        )

    async def _fit_corrections(
        self,
        view: TenantView,
        graph: ToolGraph,
        traces: Sequence[Trace],
        rng: np.random.Generator,
    ) -> Fitted:
        """The execution memory and query adapter of `traces`, and their out-of-fold scores
        (`pml_trainer.corrections`)."""
        intents = await embed_intents(
            [t.intent for t in traces], self._embedder, self._tool_embedder
        )
        servers = graph.servers_of(view.hierarchy.tool_ids)
        return await asyncio.to_thread(fit_corrections, view, servers, traces, intents, rng)

    async def _intents(self, texts: list[str]) -> list[np.ndarray]:
        unique = list(dict.fromkeys(texts))
        vectors = list(await self._embedder.embed_queries(unique)) if unique else []
        by_text = dict(zip(unique, vectors, strict=True))
        return [np.asarray(by_text[t]) for t in texts]

    def _round_rng(self, upto: int) -> np.random.Generator:
        """A round's draws. Seeded, they follow from how many executions the round covers
        alone, so that a replayed stream (under any tenant id) trains the same versions,
        whatever other tenants' rounds drew before; unseeded, they are fresh."""
        if self._config.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self._config.seed, upto])

    async def _step(
        self, tenant: str, trainer: ShgatTrainer, hierarchy: Hierarchy, rng: np.random.Generator
    ) -> tuple[float, float]:
        sample = await self._buffer.sample(tenant, self._config.batch_size, rng)
        intents = await self._intent_vectors(sample)
        examples = [
            example
            for trace, weight, intent in zip(sample.traces, sample.weights, intents, strict=True)
            for example in path_examples(
                hierarchy, intent, trace.path, trace.outcome, float(weight), trace.capability_id
            )
        ]
        if not examples:
            return 0.0, 0.0
        batch = make_batch(examples, hierarchy, rng)
        stats = await asyncio.to_thread(trainer.step, batch)
        td = await asyncio.to_thread(_td_errors, trainer, hierarchy, sample, intents)
        await self._buffer.update_priorities(tenant, sample.ids, td)
        return stats.loss, float(np.mean(np.abs(td)))

    async def _graph(self, tenant: str) -> tuple[ToolGraph, Hierarchy]:
        graph = await read_tool_graph(
            self._driver, self._database, tenant, self._embedder, self._tool_embedder
        )
        # off the event loop: a large catalog's hierarchy would hold up consumption and beats
        return graph, await asyncio.to_thread(hierarchy_of, graph, self._embedder.dim)

    def _starting_point(
        self, tenant: str, hierarchy: Hierarchy, current: tuple[ModelRecord, bytes] | None
    ) -> tuple[ShgatConfig, Params, int, bool]:
        """The tenant's current model, or a new one when none fits this embedder, how many of
        the tenant's executions it has learned from (its round's `traces_seen`), and whether it
        is new (the untrained model)."""
        if current is not None:
            try:
                config, params = from_bytes(current[1])
            except Exception as exc:  # served as the first stage alone (`build_view`): so start
                log.error("learning.model_reset", tenant=tenant, reason=f"unreadable: {exc!r}")
            else:
                if config.dim == hierarchy.dim:
                    return config, params, int(current[0].metrics.get("traces_seen", 0.0)), False
                log.warning("learning.model_reset", tenant=tenant, reason="embedding size changed")
        config = make_config(hierarchy.dim, self._config.key_dim, hierarchy.num_nodes)
        return config, init_params(config, hierarchy.features, hierarchy.num_levels), 0, True

    async def _intent_vectors(self, sample: Sample) -> list[np.ndarray]:
        return await self._intents([t.intent for t in sample.traces])

    async def _reject(
        self, tenant: str, lease: Lease, blob: bytes, metrics: dict[str, float]
    ) -> ModelRecord:
        return await self._under_lease(self._registry.reject(tenant, blob, lease.token, metrics))

    @staticmethod
    async def _under_lease(write: Awaitable[ModelRecord]) -> ModelRecord:
        """A registry write; a newer fencing token than the lease's abandons the round."""
        try:
            return await write
        except StaleFencingToken as exc:
            raise RoundAbandoned(str(exc)) from exc

    async def _publish(
        self, tenant: str, lease: Lease, blob: bytes, metrics: dict[str, float]
    ) -> ModelRecord:
        record = await self._under_lease(self._registry.publish(tenant, blob, lease.token, metrics))
        await self._publisher.publish(
            ModelPublished.create(
                tenant_id=tenant,
                model_version=record.version,
                fencing_token=lease.token,
                metrics=metrics,
            )
        )
        return record


def _judge(
    serving: TenantView,
    unseen: TenantView,
    config: ShgatConfig,
    params: Params,
    memory: ServedMemory | None,
    adapter: QueryAdapter | None,
    intents: Sequence[Intent],
    judged: Sequence[Judged],
    min_judged: int,
    fresher: bool,
    out_of_fold: Callable[[], OutOfFold | None] | None = None,
) -> Verdict:
    """The verdict, novel executions scored in the `unseen` view (same tools, same order, same
    first stage: each intent's first-stage scores are computed once)."""
    candidate = ServingModel(config, params, serving.hierarchy)
    blind = candidate if unseen is serving else ServingModel(config, params, unseen.hierarchy)
    views = [(unseen, blind) if j.novel else (serving, candidate) for j in judged]
    # the candidate's adapter was fitted on this view's catalog (`corrections.fit_adapter`)
    pairs = [
        serving.baseline.scores_adapted(i, adapter.adapt if adapter else None) for i in intents
    ]
    first = [plain for plain, _ in pairs]
    return judge(
        first_stage=first,
        serving=[
            view.corrected(f, i) for (view, _), f, i in zip(views, first, intents, strict=True)
        ],
        candidate=Corrections(
            shgat=[
                tool_scores(model, i.vector) for (_, model), i in zip(views, intents, strict=True)
            ],
            memory=(
                [memory.correction(f, i.vector) for f, i in zip(first, intents, strict=True)]
                if memory is not None
                else None
            ),
            adapter=(
                [a - f if a is not None else np.zeros_like(f) for f, a in pairs]
                if adapter is not None
                else None
            ),
        ),
        judged=judged,
        min_judged=min_judged,
        fresher=fresher,
        out_of_fold=out_of_fold,
    )


def _fresher(metrics: dict[str, float], published: tuple[ModelRecord, bytes] | None) -> bool:
    """Whether the candidate of `metrics` learned from `FRESHER_GROWTH` times as many
    executions as the serving version (`traces_seen` of each round)."""
    before = published[0].metrics.get("traces_seen", 0.0) if published is not None else 0.0
    return before > 0 and metrics.get("traces_seen", 0.0) >= FRESHER_GROWTH * before


def _export(tenant: str, verdict: Verdict) -> None:
    decision = "accepted" if verdict.accepted else "rejected"
    _decisions.add(1, {"pml.tenant_id": tenant, "decision": decision})
    for ranker, figures in (
        ("candidate", verdict.candidate),
        ("serving", verdict.serving),
        ("first_stage", verdict.first_stage),
        ("cross_fitted", verdict.cross_fitted),
    ):
        _holdout_recall.set(figures.recall_at_5, {"pml.tenant_id": tenant, "ranker": ranker})


def _td_errors(
    trainer: ShgatTrainer, hierarchy: Hierarchy, sample: Sample, intents: Sequence[np.ndarray]
) -> np.ndarray:
    model = ServingModel(trainer.config, trainer.params, hierarchy)
    predicted = [
        model.predict_path_success(intent, trace.path)
        for trace, intent in zip(sample.traces, intents, strict=True)
    ]
    errors: np.ndarray = np.asarray([t.outcome for t in sample.traces]) - np.asarray(predicted)
    return errors


def _check(lease: Lease, stop: asyncio.Event | None) -> None:
    if not lease.held():
        raise RoundAbandoned(f"lease {lease.token} lost")
    if stop is not None and stop.is_set():
        raise RoundAbandoned("the trainer is stopping")


async def _sleep_unless(
    stop: asyncio.Event,
    seconds: float,
    other: asyncio.Event | None = None,
    tasks: Iterable[asyncio.Task[None]] = (),
) -> None:
    """Sleep `seconds`, or until `stop` or `other` is set or one of `tasks` ends."""
    waiters = [asyncio.ensure_future(stop.wait())]
    if other is not None:
        waiters.append(asyncio.ensure_future(other.wait()))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait([*waiters, *tasks], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
