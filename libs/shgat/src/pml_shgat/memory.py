"""Execution memory: a re-ranker of the first stage's top candidates, fed by what the tenant's
executions ran together.

SHGAT learns which tools suit which intents; it cannot say, for a task of a new kind, that tools
run together before, or of the same server as the first stage's best candidate, belong in the same
answer. Those regularities transfer to unseen workflows, and they are what this correction reads.
Its candidates are the first stage's `TOP_K` and every tool the `NEIGHBOURS` executed intents
nearest to the request ran (wherever the first stage ranks it: what similar requests ran is
evidence the first stage does not have); for each, with the first stage's score and rank,

- how often executions used it, and with the first stage's `LEADERS` best candidates;
- whether it shares the best candidate's server, its rank within its server, its server's share
  of the first stage's top ten, how often executions used its server, and with the leaders';
- the votes of the `NEIGHBOURS` executed intents nearest to the request (their tools, weighted by
  similarity: the `knn` baseline as one feature among others).

A logistic model over these features gives each candidate a probability of being executed; the
correction is that probability for the candidates and 0 elsewhere, added to the first stage with
the weight the gate chooses (`pml_shgat.gating`). It is fitted on the executions it remembers, each
with features computed from the *other* executions (leave one out), so the weights learn how
memory predicts work it did not contain, not how it recalls itself.

A `MemoryRanker` is immutable and travels with the model version (`to_arrays`/`from_arrays`): the
remembered executions (intent vectors, tool ids) and the weights. Tools are kept by id and mapped
onto the tenant's current catalog when served; a tool no longer in it is dropped from memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, sparse

#: Candidates re-ranked per request: the first stage's best `TOP_K` (and the neighbours' tools).
TOP_K = 50
#: The first stage's best candidates whose co-use and servers the other candidates are read against.
LEADERS = 3
#: Executed intents whose tools vote.
NEIGHBOURS = 10
#: Executions remembered (the most recent ones).
CAPACITY = 1000
FEATURES = (
    "first_stage",
    "gap_to_best",
    "rank_discount",
    "use",
    "co_use_with_leaders",
    "same_server_as_best",
    "neighbour_votes",
    "server_share",
    "rank_in_server",
    "server_use",
    "server_co_use",
)
#: L2 penalty of the logistic fit, on standardised features.
L2 = 1.0
_PREFIX = "memory/"

FloatArray = NDArray[np.floating]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Execution:
    """One remembered execution: its intent's embedding and the tools it ran (ids, in order)."""

    intent: FloatArray
    tools: tuple[str, ...]


class Memory:
    """Executions indexed over one catalog: use counts, co-use, servers, intents.

    `features(..., exclude=i)` reads the memory without execution `i` (leave one out) by
    subtracting its own contributions, so fitting needs one index, not one per execution.
    """

    def __init__(
        self, executions: Sequence[Execution], tool_ids: Sequence[str], servers: Sequence[str]
    ) -> None:
        index = {tool: i for i, tool in enumerate(tool_ids)}
        self.num_tools = len(tool_ids)
        server_index = {s: i for i, s in enumerate(dict.fromkeys(servers))}
        self.server_of = np.asarray([server_index[s] for s in servers], dtype=np.int64)
        # Every execution keeps its position (fitting aligns them with first-stage scores); one
        # whose tools all left the catalog votes for nothing and counts nowhere.
        self.tools: list[IntArray] = [
            np.asarray(list(dict.fromkeys(index[t] for t in e.tools if t in index)), np.int64)
            for e in executions
        ]
        self.servers: list[IntArray] = [np.unique(self.server_of[t]) for t in self.tools]
        dim = len(executions[0].intent) if executions else 0
        intents = np.asarray([e.intent for e in executions], dtype=np.float32)
        intents = intents.reshape(len(executions), dim)
        norms = np.linalg.norm(intents, axis=1, keepdims=True)
        self.intents = intents / np.where(norms > 0, norms, 1.0)
        n, s = self.num_tools, len(server_index)
        self.tool_incidence = _incidence(self.tools, n)
        # Executions × servers is small (1,000 × a few hundred) and read by columns: dense.
        self.server_incidence = _incidence(self.servers, max(s, 1)).toarray() > 0
        self.use = np.asarray(self.tool_incidence.sum(axis=0)).ravel()
        self.server_use = self.server_incidence.sum(axis=0)
        self.co_use = (self.tool_incidence.T @ self.tool_incidence).tocsr()

    def __len__(self) -> int:
        return len(self.tools)

    def features(
        self, scores: FloatArray, intent: FloatArray, exclude: int | None = None
    ) -> tuple[IntArray, FloatArray]:
        """The candidates (`_candidates`, best first by the first stage) and their feature rows."""
        scores = np.asarray(scores, dtype=np.float64)
        votes = self._neighbour_votes(intent, exclude)
        cand = _candidates(scores, votes)
        k = len(cand)
        own = self.tools[exclude] if exclude is not None else np.empty(0, np.int64)
        own_servers = self.servers[exclude] if exclude is not None else np.empty(0, np.int64)
        s = scores[cand]
        leaders = cand[:LEADERS]
        use = self.use[cand] - np.isin(cand, own)
        co = self._co_use_with_leaders(cand, leaders, scores, own)
        servers = self.server_of[cand]
        server_use = self.server_use[servers] - np.isin(servers, own_servers)
        same = servers[:, None] == servers[None, :]
        top10 = min(10, k)
        share = same[:, :top10] @ s[:top10] / max(float(s[:top10].sum()), 1e-12)
        rank_in_server = np.tril(same, -1).sum(axis=1)
        columns = (
            s,
            s - s[0],
            1.0 / np.log2(np.arange(k) + 2.0),
            np.log1p(use),
            co,
            (servers == servers[0]).astype(np.float64),
            votes[cand],
            share,
            1.0 / (1.0 + rank_in_server),
            np.log1p(server_use),
            np.log1p(self._server_co_use(servers, exclude)),
        )
        return cand, np.column_stack(columns).astype(np.float64)

    def _co_use_with_leaders(
        self, cand: IntArray, leaders: IntArray, scores: FloatArray, own: IntArray
    ) -> FloatArray:
        """Σ over leaders a ≠ t of score(a) · P(t | a) in executions (co-use / use of a)."""
        block = self.co_use[leaders].toarray()[:, cand].astype(np.float64)
        if len(own):
            block -= np.outer(np.isin(leaders, own), np.isin(cand, own))
        block[leaders[:, None] == cand[None, :]] = 0.0
        use = self.use[leaders] - np.isin(leaders, own)
        weights = scores[leaders] / np.maximum(use, 1)
        return np.asarray(weights @ block, dtype=np.float64)

    def _neighbour_votes(self, intent: FloatArray, exclude: int | None) -> FloatArray:
        """Per tool, the summed similarity of the nearest executed intents that ran it."""
        if not len(self):
            return np.zeros(self.num_tools)
        vector = np.asarray(intent, dtype=np.float32)
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        sims = (self.intents @ vector).astype(np.float64)
        if exclude is not None:
            sims[exclude] = -np.inf
        k = min(NEIGHBOURS, len(sims))
        nearest = np.argpartition(-sims, k - 1)[:k]
        nearest = nearest[np.isfinite(sims[nearest])]
        weights = np.maximum(sims[nearest], 0.0)
        # sparse × dense: no dense (neighbours × tools) block at every request
        return np.asarray(self.tool_incidence[nearest].T @ weights, dtype=np.float64).ravel()

    def _server_co_use(self, servers: IntArray, exclude: int | None) -> FloatArray:
        """Executions that used a leader's server, counted per candidate's server."""
        hits = self.server_incidence[:, np.unique(servers[:LEADERS])].any(axis=1)
        if exclude is not None:
            hits[exclude] = False
        counts = hits.astype(np.float64) @ self.server_incidence[:, servers]
        return np.asarray(counts, dtype=np.float64)


def _candidates(scores: FloatArray, votes: FloatArray) -> IntArray:
    """The first stage's best `TOP_K` and every tool with a neighbour's vote, by score."""
    k = min(TOP_K, len(scores))
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(k)
    union = np.union1d(top, np.flatnonzero(votes > 0))
    return np.asarray(union[np.argsort(-scores[union], kind="stable")], dtype=np.int64)


def _incidence(rows: Sequence[IntArray], width: int) -> sparse.csr_matrix:
    indptr = np.cumsum([0, *(len(r) for r in rows)])
    indices = np.concatenate(rows) if rows else np.empty(0, np.int64)
    data = np.ones(len(indices), dtype=np.float64)
    return sparse.csr_matrix((data, indices, indptr), shape=(len(rows), width))


@dataclass(frozen=True)
class MemoryRanker:
    """Remembered executions and the logistic weights over their features."""

    executions: tuple[Execution, ...]
    #: Intercept then one weight per feature, on features standardised by `mean` and `scale`.
    weights: FloatArray
    mean: FloatArray
    scale: FloatArray

    def serve(self, tool_ids: Sequence[str], servers: Sequence[str]) -> ServedMemory:
        """This ranker over a catalog (the tenant's tools now, in score-vector order)."""
        return ServedMemory(self, Memory(self.executions, tool_ids, servers))

    def to_arrays(self) -> dict[str, NDArray[np.generic]]:
        """The ranker as named arrays, stored beside the model's parameters."""
        tools = json.dumps([list(e.tools) for e in self.executions]).encode()
        dim = len(self.executions[0].intent) if self.executions else 0
        intents = np.asarray([e.intent for e in self.executions], dtype=np.float16)
        return {
            f"{_PREFIX}weights": self.weights,
            f"{_PREFIX}mean": self.mean,
            f"{_PREFIX}scale": self.scale,
            f"{_PREFIX}intents": intents.reshape(len(self.executions), dim),
            f"{_PREFIX}tools": np.frombuffer(tools, dtype=np.uint8),
        }

    @staticmethod
    def from_arrays(arrays: Mapping[str, NDArray[np.generic]]) -> MemoryRanker | None:
        """The ranker stored in `arrays`; None when they hold none (a version without memory)."""
        if f"{_PREFIX}weights" not in arrays:
            return None
        tools = json.loads(np.asarray(arrays[f"{_PREFIX}tools"]).tobytes().decode())
        intents = np.asarray(arrays[f"{_PREFIX}intents"], dtype=np.float32)
        weights = np.asarray(arrays[f"{_PREFIX}weights"], dtype=np.float64)
        if len(tools) != len(intents) or weights.shape != (len(FEATURES) + 1,):
            raise ValueError("stored execution memory is inconsistent")
        executions = tuple(Execution(v, tuple(t)) for v, t in zip(intents, tools, strict=True))
        return MemoryRanker(
            executions,
            weights,
            np.asarray(arrays[f"{_PREFIX}mean"], dtype=np.float64),
            np.asarray(arrays[f"{_PREFIX}scale"], dtype=np.float64),
        )


def is_memory_array(name: str) -> bool:
    return name.startswith(_PREFIX)


@dataclass(frozen=True)
class ServedMemory:
    """A `MemoryRanker` indexed over a catalog: computes the correction of one request."""

    ranker: MemoryRanker
    memory: Memory

    def correction(self, scores: FloatArray, intent: FloatArray) -> FloatArray:
        """Probability of being executed for the candidates (`Memory.features`), 0 elsewhere."""
        out = np.zeros(self.memory.num_tools, dtype=np.float64)
        if not len(self.memory) or not self.memory.num_tools:
            return out
        cand, rows = self.memory.features(scores, intent)
        out[cand] = _probability(self.ranker, rows)
        return out


def _probability(ranker: MemoryRanker, rows: FloatArray) -> FloatArray:
    z = ((rows - ranker.mean) / ranker.scale) @ ranker.weights[1:] + ranker.weights[0]
    return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


def fit(
    executions: Sequence[Execution],
    first_stage: Sequence[FloatArray],
    tool_ids: Sequence[str],
    servers: Sequence[str],
) -> MemoryRanker | None:
    """Fit the weights on `executions`, each read with the memory of the others; `first_stage`:
    the first stage's scores of each execution's intent. None when the executions cannot teach
    anything (no executed tool among the candidates, or nothing else)."""
    memory = Memory(executions, tool_ids, servers)
    rows, labels = [], []
    for i, scores in enumerate(first_stage):
        if not len(memory.tools[i]):
            continue
        cand, features = memory.features(scores, executions[i].intent, exclude=i)
        rows.append(features)
        labels.append(np.isin(cand, memory.tools[i]).astype(np.float64))
    if not rows:
        return None
    x, y = np.vstack(rows), np.concatenate(labels)
    if y.min() == y.max():
        return None
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-9
    weights = _logistic((x - mean) / scale, y)
    return MemoryRanker(tuple(executions), weights, mean, scale)


def _logistic(z: FloatArray, y: FloatArray) -> FloatArray:
    """Intercept and weights of an L2-penalised logistic regression (the intercept is free)."""

    def loss(w: FloatArray) -> tuple[float, FloatArray]:
        logits = z @ w[1:] + w[0]
        p = 1.0 / (1.0 + np.exp(-logits))
        value = np.sum(np.logaddexp(0.0, logits) - y * logits) + L2 * np.sum(w[1:] ** 2)
        grad = np.concatenate([[np.sum(p - y)], z.T @ (p - y) + 2 * L2 * w[1:]])
        return float(value), grad

    start = np.zeros(z.shape[1] + 1)
    return np.asarray(optimize.minimize(loss, start, jac=True, method="L-BFGS-B").x)
