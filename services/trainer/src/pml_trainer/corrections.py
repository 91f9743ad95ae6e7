"""The cheap corrections a round fits beside SHGAT, and the out-of-fold evidence they are judged on.

A round fits an execution memory (`pml_shgat.memory`) and a query adapter (`pml_shgat.adapter`)
on the replay buffer's newest traces. Both take seconds to fit, so each of the newest
`OUT_OF_FOLD_LIMIT` traces can also be scored by a memory and an adapter fitted on the other
`FOLDS` − 1 folds of those traces: what the two corrections are worth on executions they did not
learn from, with about four times as many executions as the held-back set holds
(`pml_shgat.gating.OutOfFold`). SHGAT would need a training run per fold, so its correction is
judged on the held-back executions alone, and the gate asks for these scores only when it gives
SHGAT no weight: the five fits cost about four times the round's own (35 against 8 s for 344
traces over 2,375 tools, docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pml_common.tool_first_stage import Intent
from pml_shgat import adapter as query_adapter
from pml_shgat.adapter import QueryAdapter
from pml_shgat.gating import Corrections, FloatArray, Judged, OutOfFold
from pml_shgat.memory import Execution, MemoryRanker, ServedMemory, fit
from pml_trainer.evaluation import TenantView
from pml_trainer.replay_buffer import Trace

#: Folds of the out-of-fold scoring: each fit leaves a fifth of the traces out.
FOLDS = 5
#: Newest traces scored out of fold, and learned from by each fold's fits: bounds the round's
#: cost on a tenant with a full memory.
OUT_OF_FOLD_LIMIT = 500
#: Fewest traces scored out of fold: below five per fold, a fit on four fifths of a tenant's
#: first executions (use counts, co-use, neighbours of a handful) does not stand for the one
#: served, and the held-back executions judge alone.
MIN_OUT_OF_FOLD = 5 * FOLDS


@dataclass(frozen=True)
class Fitted:
    """A round's cheap corrections, fitted on all its traces, and how to score them out of fold
    (computed when called: CPU work, for the gate's thread)."""

    memory: MemoryRanker | None
    adapter: QueryAdapter | None
    out_of_fold: Callable[[], OutOfFold | None] | None


def fit_corrections(
    view: TenantView,
    servers: Sequence[str],
    traces: Sequence[Trace],
    intents: Sequence[Intent],
    rng: np.random.Generator,
) -> Fitted:
    """The execution memory of `traces` (fitted leave-one-out on their first-stage ranking), their
    query adapter (none without a tool embedder), and how to score both out of fold; `servers`:
    the server of each of the view's tools. CPU work: run it in a thread."""
    if not traces:
        return Fitted(None, None, None)
    ids = view.hierarchy.tool_ids
    executions = [
        Execution(np.asarray(i.vector, np.float32), tuple(t.path))
        for t, i in zip(traces, intents, strict=True)
    ]
    first = [view.first_stage(i) for i in intents]
    memory = fit(executions, first, ids, servers)
    adapter = fit_adapter(view, traces, intents, rng)
    if memory is None and adapter is None:
        return Fitted(None, None, None)
    scored = _OutOfFold(view, servers, traces, intents, executions, first)
    run = functools.partial(scored.run, memory is not None, adapter is not None, rng)
    return Fitted(memory, adapter, run)


def fit_adapter(
    view: TenantView,
    traces: Sequence[Trace],
    intents: Sequence[Intent],
    rng: np.random.Generator,
) -> QueryAdapter | None:
    """The query adapter of `traces` over the tenant's catalog (`pml_shgat.adapter`); None
    without the tool embedder's vectors."""
    catalog = view.baseline.catalog
    if catalog is None or not view.baseline.parts:
        return None
    known = [
        (
            i.text_vectors[0],
            [t for t in map(view.hierarchy.node_index, trace.path) if t is not None],
        )
        for trace, i in zip(traces, intents, strict=True)
        if i.text_vectors is not None and len(i.text_vectors)
    ]
    if not known:
        return None
    tools = [[t for t in found if view.hierarchy.is_tool(t)] for _, found in known]
    return query_adapter.fit(
        np.stack([vector for vector, _ in known]), tools, catalog, view.baseline.parts, rng
    )


@dataclass(frozen=True)
class _OutOfFold:
    view: TenantView
    servers: Sequence[str]
    traces: Sequence[Trace]
    intents: Sequence[Intent]
    executions: Sequence[Execution]
    first: Sequence[FloatArray]

    def run(self, memory: bool, adapter: bool, rng: np.random.Generator) -> OutOfFold | None:
        """Each of the newest traces that ran a known tool, scored by the corrections (`memory`,
        `adapter`: those the candidate has) fitted without its fold; None when there are fewer
        than `MIN_OUT_OF_FOLD` such traces."""
        count = len(self.traces)
        window = range(max(0, count - OUT_OF_FOLD_LIMIT), count)
        newest = [i for i in window if self.view.judged(self.traces[i]) is not None]
        if len(newest) < MIN_OUT_OF_FOLD:
            return None
        first: list[FloatArray] = []
        remembered: list[FloatArray] = []
        adapted: list[FloatArray] = []
        judged: list[Judged] = []
        for fold in range(FOLDS):
            scored = newest[fold::FOLDS]
            left_out = set(scored)
            others = [i for i in window if i not in left_out]
            served = self._memory(others) if memory else None
            mapper = self._adapter(others, rng) if adapter else None
            trained = {frozenset(self.traces[i].path) for i in others}
            for i in scored:
                plain = self.first[i]
                first.append(plain)
                if memory:
                    remembered.append(
                        served.correction(plain, self.intents[i].vector)
                        if served is not None
                        else np.zeros_like(plain)
                    )
                if adapter:
                    adapted.append(self._adapted(i, mapper))
                one = self.view.judged(self.traces[i])
                assert one is not None  # `newest` holds only traces that ran a known tool
                judged.append(replace(one, novel=frozenset(self.traces[i].path) not in trained))
        return OutOfFold(
            first,
            Corrections(None, remembered if memory else None, adapted if adapter else None),
            judged,
        )

    def _memory(self, rows: Sequence[int]) -> ServedMemory | None:
        ranker = fit(
            [self.executions[i] for i in rows],
            [self.first[i] for i in rows],
            self.view.hierarchy.tool_ids,
            self.servers,
        )
        return ranker.serve(self.view.hierarchy.tool_ids, self.servers) if ranker else None

    def _adapter(self, rows: Sequence[int], rng: np.random.Generator) -> QueryAdapter | None:
        return fit_adapter(
            self.view, [self.traces[i] for i in rows], [self.intents[i] for i in rows], rng
        )

    def _adapted(self, row: int, mapper: QueryAdapter | None) -> FloatArray:
        """The adapter's correction of trace `row`: its adapted first stage − its first stage."""
        plain = self.first[row]
        if mapper is None:
            return np.zeros_like(plain)
        adapted = self.view.baseline.scores_adapted(self.intents[row], mapper.adapt)[1]
        return np.zeros_like(plain) if adapted is None else adapted - plain
