"""Learning that never hurts: the served tool score and the rule that admits a new version.

The score served for tools is the untrained first stage plus a learned correction,

    served = first_stage + w · SHGAT's tool score + m · execution memory's score
             + a · (adapted first stage − first_stage)

(SHGAT's and the memory's corrections are probabilities, 0..1; the memory's is 0 outside its
candidates, `pml_shgat.memory`; the adapted first stage is the first stage of the request's
embeddings mapped by the query adapter, `pml_shgat.adapter`, so at a = 1 it replaces the plain
one), with the weights w, m and a chosen, per version, on executions that version did not train
on (held back). (0, 0, 0) is always in the grid, so on that set the served ranking is never worse
than the first stage's. A candidate version replaces the serving
one only if it ranks the executed tools of the held-back executions better than both the
serving combination and the first stage alone, the first stage *cross-fitted*: each half of
the held-back executions ranked with the weights chosen on the other half
(`Trials.cross_fitted`).
Weights chosen on the executions they are judged on find gains in noise: over the 16 of a
tenant with 80 executions, the best of the grid's 300 moved one or two of them into the top five,
and the correction admitted on that served new queries no better (docs/benchmarks.md).
The execution memory and the query adapter are cheap to fit again, so when SHGAT gets no weight
their weights are chosen, and cross-fitted, on the held-back executions together with the
executions they learned from, each scored by fits made without it (`OutOfFold`): about five times
the evidence, which a gain of a point on a tenant's new work needs.

The serving version is judged again at every round, on the held-back executions of the time
(which no version trained on). When the first stage alone ranks them better than it, the new
version is published with weight 0: the correction is withdrawn rather than left to serve on
the strength of an earlier, smaller held-back set.

A candidate that ties the serving version on them (it does not rank better, and the serving
version is not surely better, per `better`: not beyond the noise of the held-back executions,
in recall@5 or in first steps) is published anyway when it learned from at least
`FRESHER_GROWTH` times as many executions (*fresher*), as long as it beats the first stage
(cross-fitted): nothing says it is worse, and it has seen more of the tenant's work. Without
this, the version served was often one fitted on the first few executions, kept because every
later fit tied it within the margin, and which early fit that was varied from one run to the
next.

Held-back executions resemble the ones trained on, so a correction can look good on them by
recalling the workflows it has seen while it hurts tasks of a new kind. Those held back whose
set of tools no trained execution ran (*novel*) stand for that new work: when there are enough
of them, a weight is only eligible if, on them alone, the first stage does not rank better.

Everything here is pure numpy over score vectors (one score per tool, in hierarchy order).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from pml_shgat.memory import ServedMemory
from pml_shgat.serving import ServingModel

#: Weights tried for the correction; 0 (the first stage alone) must stay first. The first stage
#: lies in [0, 1] and a correction is a probability, so at 32 or 64 the correction orders its
#: candidates and the first stage only breaks its ties: where executions recur (a tenant's
#: routine work), that is what ranks best, and a grid that stopped at 8 had the gate choose its
#: edge (MetaTool, every fold: docs/benchmarks.md).
WEIGHT_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
#: Weights tried for the query adapter's correction: the share of the adapted first stage.
ADAPTER_GRID: tuple[float, ...] = (0.0, 0.5, 1.0)
#: Cut-offs of the recall figures.
CUTOFFS = (1, 5, 10)
#: The recall that decides, and by how much a candidate must beat it to count as better;
#: within the margin, the mean reciprocal rank of the first executed tool decides.
DECIDING_K = 5
RECALL_MARGIN = 0.01
MRR_MARGIN = 0.005
#: How much worse the mean reciprocal rank may be in a ranking that counts as better.
MRR_TOLERANCE = 0.01
#: Standard errors of the paired difference that a reciprocal-rank loss must exceed to veto a
#: ranking, and that a difference must exceed to count as sure (`better(surely=True)`): over a
#: few dozen held-back executions, a first step moved by one rank in two or three of them, or
#: one tool more in the top five of one of them, is noise, and deciding on it kept early fits
#: serving (docs/benchmarks.md).
NOISE_Z = 2.0
#: How many times as many executions a candidate must have learned from to replace a serving
#: version it ties (so a tenant's versions are republished on ties at most logarithmically often).
FRESHER_GROWTH = 1.5
#: Novel held-back executions needed before they can bar a weight (fewer say too little).
MIN_NOVEL = 5

FloatArray = NDArray[np.floating]
#: The verdict's reason when the first stage alone replaces a serving version that ranks the
#: held-back executions worse than it (the new version carries weight 0).
WITHDRAWN = "withdraws the serving version: the first stage alone ranks held-back executions better"
#: The verdict's reason when a fresher candidate replaces a serving version it ties.
FRESHER = "ties the serving version on held-back executions and learned from more executions"
#: Names of the corrections' weights in a published version's metrics.
WEIGHT_METRIC = "correction_weight"
MEMORY_WEIGHT_METRIC = "memory_weight"
ADAPTER_WEIGHT_METRIC = "adapter_weight"


class Weights(NamedTuple):
    """The corrections' weights in the served score (all 0: the first stage alone)."""

    shgat: float = 0.0
    memory: float = 0.0
    adapter: float = 0.0

    @classmethod
    def of_metrics(cls, metrics: Mapping[str, float]) -> Weights:
        """The weights a published version carries in its metrics (`Verdict.as_metrics`)."""
        return cls(
            float(metrics.get(WEIGHT_METRIC, 0.0)),
            float(metrics.get(MEMORY_WEIGHT_METRIC, 0.0)),
            float(metrics.get(ADAPTER_WEIGHT_METRIC, 0.0)),
        )


class Corrections(NamedTuple):
    """Per execution, each correction's score vector (None: the candidate has no such one)."""

    shgat: Sequence[FloatArray] | None
    memory: Sequence[FloatArray] | None = None
    adapter: Sequence[FloatArray] | None = None


@dataclass(frozen=True)
class Judged:
    """One execution to rank: the tools it used, as indices into the score vectors."""

    relevant: tuple[int, ...]  # distinct, in the order of the path; the first is the first step
    #: No execution the candidate trained on ran this set of tools.
    novel: bool = False


@dataclass(frozen=True)
class OutOfFold:
    """Executions the candidate's execution memory and query adapter were fitted on, each scored
    by a memory and an adapter fitted without it (K-fold, `pml_trainer.corrections`), and marked
    novel when no execution of those fits ran its set of tools. SHGAT is not refitted so, so they
    judge those two corrections only, beside the held-back executions."""

    first_stage: Sequence[FloatArray]
    #: `shgat` is None: these executions trained it.
    corrections: Corrections
    judged: Sequence[Judged]

    def pooled_with(
        self, first_stage: Sequence[FloatArray], candidate: Corrections, judged: Sequence[Judged]
    ) -> Trials:
        """The `Trials` of the held-back executions and these together, SHGAT at weight 0."""
        if (candidate.memory is None) != (self.corrections.memory is None) or (
            candidate.adapter is None
        ) != (self.corrections.adapter is None):
            raise ValueError("out-of-fold executions must carry the candidate's corrections")
        return Trials.of(
            [*first_stage, *self.first_stage],
            Corrections(
                None,
                _joined(candidate.memory, self.corrections.memory),
                _joined(candidate.adapter, self.corrections.adapter),
            ),
            [*judged, *self.judged],
        )


def _joined(
    held: Sequence[FloatArray] | None, more: Sequence[FloatArray] | None
) -> list[FloatArray] | None:
    return None if held is None or more is None else [*held, *more]


@dataclass(frozen=True)
class Figures:
    """Mean ranking figures over executions."""

    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    #: Mean 1-based rank of the first executed tool, and the mean of its reciprocal.
    first_rank: float
    mrr: float
    count: int
    #: Each execution's reciprocal rank of its first executed tool, and its recall@5 (paired
    #: comparisons).
    reciprocal_ranks: tuple[float, ...] = ()
    recalls_at_5: tuple[float, ...] = ()

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}recall_at_1": self.recall_at_1,
            f"{prefix}recall_at_5": self.recall_at_5,
            f"{prefix}recall_at_10": self.recall_at_10,
            f"{prefix}first_rank": self.first_rank,
            f"{prefix}mrr": self.mrr,
        }


EMPTY = Figures(0.0, 0.0, 0.0, 0.0, 0.0, 0)


def served_scores(
    first_stage: FloatArray, correction: FloatArray | None, weight: float
) -> FloatArray:
    """`first_stage + weight · correction`; the first stage alone without a correction or at 0."""
    if correction is None or weight == 0.0:
        return np.asarray(first_stage, dtype=np.float64)
    return np.asarray(first_stage, dtype=np.float64) + weight * np.asarray(correction, np.float64)


def one_figures(scores: FloatArray, relevant: Sequence[int]) -> tuple[float, ...]:
    """(recall@1, @5, @10, first rank) of one execution; ties count against the executed tool."""
    values = np.asarray(scores, dtype=np.float64)
    # Rank of a tool = the number of tools scored at least as high, itself included: ties
    # count against it (pessimistic). One pass over the scores per executed tool.
    ranks = [int(np.count_nonzero(values >= values[i])) for i in relevant]
    recalls = tuple(sum(r <= k for r in ranks) / len(ranks) for k in CUTOFFS)
    return (*recalls, float(ranks[0]))


def figures(rows: Sequence[FloatArray], judged: Sequence[Judged]) -> Figures:
    """Mean figures of score vectors `rows` against the executions they were computed for."""
    each = [one_figures(r, j.relevant) for r, j in zip(rows, judged, strict=True)]
    return _mean_figures(np.asarray(each, dtype=np.float64).reshape(len(each), 4))


def _mean_figures(each: FloatArray) -> Figures:
    """`Figures` of the rows of `one_figures` of several executions."""
    if not len(each):
        return EMPTY
    means = each.mean(axis=0)
    reciprocal = 1.0 / each[:, 3]
    return Figures(
        recall_at_1=float(means[0]),
        recall_at_5=float(means[1]),
        recall_at_10=float(means[2]),
        first_rank=float(means[3]),
        mrr=float(np.mean(reciprocal)),
        count=len(each),
        reciprocal_ranks=tuple(reciprocal.tolist()),
        recalls_at_5=tuple(each[:, 1].tolist()),
    )


def better(a: Figures, b: Figures, *, surely: bool = False) -> bool:
    """Whether `a` ranks better than `b`: recall@5 beyond the margin, or equal within it and a
    better mean reciprocal rank of the first executed tool; never with that reciprocal rank
    worse by more than `MRR_TOLERANCE` and the noise of the executions both ranked
    (`paired_noise`: a gateway acts on the first tools, so more of the executed tools in the
    top five does not make up for a first step pushed down, but a first step moved by a rank
    in two or three of a few dozen executions is noise). `surely`: the gain, of recall@5 or,
    on a tie of it, of the reciprocal rank, must exceed that noise too (over fourteen held-back
    executions, one tool of one of them is 3.6 points of recall@5)."""
    rank_noise = paired_noise(a.reciprocal_ranks, b.reciprocal_ranks)
    if a.mrr < b.mrr - max(MRR_TOLERANCE, rank_noise):
        return False
    gain = a.recall_at_5 - b.recall_at_5
    if gain < -RECALL_MARGIN:
        return False
    recall_noise = paired_noise(a.recalls_at_5, b.recalls_at_5) if surely else 0.0
    if gain > max(RECALL_MARGIN, recall_noise):
        return True
    return a.mrr > b.mrr + max(MRR_MARGIN, rank_noise if surely else 0.0)


def paired_noise(a: Sequence[float], b: Sequence[float]) -> float:
    """`NOISE_Z` standard errors of the mean paired difference between per-execution figures
    `a` and `b`; 0 unless both hold them for the same executions (at least two)."""
    count = len(a)
    if count < 2 or count != len(b):
        return 0.0
    difference = np.subtract(a, b)
    return NOISE_Z * float(np.std(difference, ddof=1)) / float(np.sqrt(count))


def choose_weight(
    first_stage: Sequence[FloatArray],
    correction: Sequence[FloatArray],
    judged: Sequence[Judged],
    grid: Sequence[float] = WEIGHT_GRID,
) -> tuple[float, Figures]:
    """The weight of the grid whose served scores rank the executions best, and its figures
    (`choose_weights` with one correction)."""
    weights, best = choose_weights(first_stage, Corrections(correction), judged, grid)
    return weights.shgat, best


def choose_weights(
    first_stage: Sequence[FloatArray],
    corrections: Corrections,
    judged: Sequence[Judged],
    grid: Sequence[float] = WEIGHT_GRID,
) -> tuple[Weights, Figures]:
    """The weights whose served scores rank the executions best, and their figures.

    Weights are tried by increasing total, and must be better (per `better`) than the best so
    far to win, so a correction that adds nothing keeps the smaller weight, down to all 0 (the
    first stage alone). SHGAT and the memory take their weights from `grid`, the adapter from
    `ADAPTER_GRID`; a correction the candidate lacks stays at 0. With at least `MIN_NOVEL`
    novel executions, weights under which the first stage ranks them better are not eligible.
    """
    ranked = Trials.of(first_stage, corrections, judged, grid)
    chosen = ranked.choose(ranked.everyone)
    return ranked.weights[chosen], ranked.figures(chosen)


@dataclass(frozen=True)
class Trials:
    """Every weight combination's figures on every held-back execution, from one pass of
    served scores: choosing weights on any subset of the executions is then a selection, so
    cross-fitting costs no more passes over the catalog than choosing once (at 100k tools a
    pass over 200 held-back executions and 300 combinations is the round's costliest step)."""

    #: By increasing total (then adapter, then memory); the first is all 0, the first stage.
    weights: tuple[Weights, ...]
    #: [trial, execution, (recall@1, @5, @10, first rank)], rows of `one_figures`.
    each: FloatArray
    #: Whether each execution is novel (`Judged.novel`).
    novel: NDArray[np.bool_]

    @property
    def everyone(self) -> NDArray[np.intp]:
        """The indices of all the executions."""
        return np.arange(self.each.shape[1])

    def figures(self, trial: int, rows: NDArray[np.intp] | None = None) -> Figures:
        """The figures of `trial` (0: the first stage) on the executions at `rows` (all)."""
        return _mean_figures(self.each[trial] if rows is None else self.each[trial, rows])

    @classmethod
    def of(
        cls,
        first_stage: Sequence[FloatArray],
        corrections: Corrections,
        judged: Sequence[Judged],
        grid: Sequence[float] = WEIGHT_GRID,
    ) -> Trials:
        if not grid or grid[0] != 0.0:
            raise ValueError("the weight grid must start at 0 (the first stage alone)")
        weights = tuple(
            sorted(
                itertools.starmap(
                    Weights,
                    itertools.product(
                        grid if corrections.shgat is not None else (0.0,),
                        grid if corrections.memory is not None else (0.0,),
                        ADAPTER_GRID if corrections.adapter is not None else (0.0,),
                    ),
                ),
                key=lambda w: (sum(w), w.adapter, w.memory),
            )
        )
        each = np.empty((len(weights), len(judged), 4), dtype=np.float64)
        for trial, w in enumerate(weights):
            each[trial] = _weighted_figures(first_stage, corrections, w, judged)
        return cls(weights, each, np.array([j.novel for j in judged], dtype=np.bool_))

    def choose(self, rows: NDArray[np.intp]) -> int:
        """The trial `choose_weights` picks on the executions at `rows`."""
        novel = rows[self.novel[rows]]
        guard = len(novel) >= MIN_NOVEL
        novel_base = self.figures(0, novel)
        best_trial, best = 0, self.figures(0, rows)
        for trial in range(1, len(self.weights)):
            if guard and better(novel_base, self.figures(trial, novel)):
                continue
            candidate = self.figures(trial, rows)
            if better(candidate, best):
                best_trial, best = trial, candidate
        return best_trial

    def cross_fitted(self) -> Figures:
        """The figures of the executions, each half (alternate executions, so both span the
        held-back period) ranked under the weights chosen on the other half: what choosing
        weights on held-back executions is worth on executions it did not see. With fewer
        than two executions there is no other half: the first stage's figures."""
        count = self.each.shape[1]
        if count < 2:
            return self.figures(0)
        out = np.empty((count, 4), dtype=np.float64)
        halves = (np.arange(0, count, 2), np.arange(1, count, 2))
        for chosen_on, scored in (halves, halves[::-1]):
            out[scored] = self.each[self.choose(chosen_on), scored]
        return _mean_figures(out)


def _weighted_figures(
    first_stage: Sequence[FloatArray],
    corrections: Corrections,
    weights: Weights,
    judged: Sequence[Judged],
) -> FloatArray:
    """`one_figures` of each execution under `weights`, the served scores built in one reused
    buffer rather than a list of served vectors per trial (at 100k tools and 200 held-back
    executions, 160 MB each)."""
    each = np.empty((len(judged), 4), dtype=np.float64)
    served = np.empty(0, dtype=np.float64)
    term = np.empty(0, dtype=np.float64)
    for row, (first, judged_one) in enumerate(zip(first_stage, judged, strict=True)):
        if len(served) != len(first):
            served, term = np.empty(len(first)), np.empty(len(first))
        served[:] = first
        for weight, scores in zip(weights, corrections, strict=True):
            if weight and scores is not None:
                np.multiply(np.asarray(scores[row], dtype=np.float64), weight, out=term)
                served += term
        each[row] = one_figures(served, judged_one.relevant)
    return each


@dataclass(frozen=True)
class Verdict:
    """What the gate decided for a candidate, with the figures it decided on."""

    accepted: bool
    reason: str
    #: The corrections' weights chosen for the candidate (0 for a correction it lacks).
    weights: Weights
    candidate: Figures
    serving: Figures
    first_stage: Figures
    #: The same three on the novel held-back executions alone.
    novel_candidate: Figures = EMPTY
    novel_first_stage: Figures = EMPTY
    #: The candidate's figures with each half's weights chosen on the other half, and the first
    #: stage's on the same executions (the held-back ones, and the out-of-fold ones when used).
    cross_fitted: Figures = EMPTY
    cross_fitted_first_stage: Figures = EMPTY
    #: Out-of-fold executions the memory's and the adapter's weights were judged on as well.
    out_of_fold: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            WEIGHT_METRIC: self.weights.shgat,
            MEMORY_WEIGHT_METRIC: self.weights.memory,
            ADAPTER_WEIGHT_METRIC: self.weights.adapter,
            "holdout_size": float(self.candidate.count),
            "holdout_novel_size": float(self.novel_candidate.count),
            **self.candidate.as_metrics("holdout_candidate_"),
            **self.serving.as_metrics("holdout_serving_"),
            **self.first_stage.as_metrics("holdout_first_stage_"),
            **self.novel_candidate.as_metrics("holdout_novel_candidate_"),
            **self.novel_first_stage.as_metrics("holdout_novel_first_stage_"),
            **self.cross_fitted.as_metrics("holdout_cross_fitted_"),
            **self.cross_fitted_first_stage.as_metrics("holdout_cross_fitted_first_stage_"),
            "out_of_fold_size": float(self.out_of_fold),
        }


def judge(
    first_stage: Sequence[FloatArray],
    serving: Sequence[FloatArray],
    candidate: Corrections,
    judged: Sequence[Judged],
    min_judged: int = 1,
    fresher: bool = False,
    out_of_fold: Callable[[], OutOfFold | None] | None = None,
) -> Verdict:
    """Admit the candidate (its `corrections`) only if, with its best weights, it beats the
    serving combination on the held-back executions `judged` and, cross-fitted
    (`Trials.cross_fitted`), surely beats the first stage alone (a gain of recall@5, or on a tie
    of it of the first steps, beyond its noise, `better(surely=True)`: over a tenant's first
    hundred executions, a few executions moved up decided admissions that ranked new work no
    better, docs/benchmarks.md); or if its best weights are 0 and the first
    stage alone beats the serving combination, or the first stage beats it and the candidate
    does not beat the first stage cross-fitted (`WITHDRAWN`: published with weights 0); or if it
    is `fresher` (learned from `FRESHER_GROWTH` times the serving version's executions), ties
    the serving combination and, cross-fitted, beats the first stage (`FRESHER`).

    `serving` are the scores served now (the first stage itself before any version was
    admitted). `out_of_fold`, called only when the best weights give SHGAT none: the
    memory's and the adapter's weights are then chosen, and cross-fitted against the first
    stage, on the held-back executions and those it gives together (on ETOM's folds, five times
    as many: halves of 34 held-back executions could not tell a gain of one point from noise,
    docs/benchmarks.md); the comparison with the serving version stays on the held-back
    executions, which it did not learn from either.
    """
    ranked = Trials.of(first_stage, candidate, judged)
    chosen = ranked.choose(ranked.everyone)
    extra = out_of_fold() if out_of_fold is not None and not ranked.weights[chosen].shgat else None
    pooled = extra.pooled_with(first_stage, candidate, judged) if extra and extra.judged else None
    if pooled is not None:
        chosen = ranked.weights.index(pooled.weights[pooled.choose(pooled.everyone)])
    weights, cand, base = ranked.weights[chosen], ranked.figures(chosen), ranked.figures(0)
    now = figures(serving, judged)
    checked = pooled if pooled is not None else ranked
    unseen, unseen_base = checked.cross_fitted(), checked.figures(0)
    if len(judged) < min_judged:
        reason, accepted = f"{len(judged)} held-back executions, {min_judged} needed", False
    elif not better(cand, now):
        accepted = (
            fresher
            and not better(now, cand, surely=True)
            and better(unseen, unseen_base, surely=True)
        )
        reason = (
            FRESHER if accepted else "not better than the serving version on held-back executions"
        )
    elif not any(weights):
        # The candidate is the first stage itself, and it beats what is served: the serving
        # version was admitted on fewer or other held-back executions and no longer holds.
        reason, accepted = WITHDRAWN, True
    elif better(unseen, unseen_base, surely=True):
        reason, accepted = "better than the serving version and the first stage", True
    elif better(base, now):
        # What is served no longer holds either, and the candidate's gain over the first stage
        # does not hold cross-fitted: the corrections are withdrawn.
        reason, accepted, chosen, weights, cand = WITHDRAWN, True, 0, Weights(), base
    else:
        reason = "not better than the first stage on held-back executions, weights cross-fitted"
        accepted = False
    novel = np.flatnonzero(ranked.novel)
    return Verdict(
        accepted,
        reason,
        weights,
        cand,
        now,
        base,
        ranked.figures(chosen, novel),
        ranked.figures(0, novel),
        unseen,
        unseen_base,
        len(extra.judged) if pooled is not None and extra is not None else 0,
    )


def served_tool_scores(
    first_stage: FloatArray,
    intent: FloatArray,
    shgat: ServingModel | None,
    memory: ServedMemory | None,
    weights: Weights,
    adapted_first_stage: FloatArray | None = None,
) -> FloatArray:
    """What `ScoreTools` serves for an intent (its embedding `intent`): the first stage plus
    each correction at its weight; a correction at weight 0 is not computed.
    `adapted_first_stage`: the first stage of the request's adapted embeddings, when the
    version has a query adapter."""
    correction = tool_scores(shgat, intent) if shgat is not None and weights.shgat else None
    remembered = (
        memory.correction(first_stage, intent) if memory is not None and weights.memory else None
    )
    adapted = (
        np.asarray(adapted_first_stage, np.float64) - np.asarray(first_stage, np.float64)
        if adapted_first_stage is not None and weights.adapter
        else None
    )
    served = served_scores(first_stage, correction, weights.shgat)
    served = served_scores(served, remembered, weights.memory)
    return served_scores(served, adapted, weights.adapter)


def tool_scores(model: ServingModel, intent: FloatArray) -> FloatArray:
    """SHGAT's score of every tool (sigmoid of its logit), in hierarchy order."""
    logits = model.logits(intent)[: model.hierarchy.num_tools].astype(np.float64)
    return np.asarray(1.0 / (1.0 + np.exp(-logits)), dtype=np.float64)
